"""Sweep specs: a base config plus a grid of dotted keys -> values, expanded as a Cartesian product.

    base = "exp.toml"                      # or an inline [base] table
    [grid]
    "workload.rate_scale" = [0.5, 1, 2]
    "hardware.gpu" = ["h100-sxm", "a100"]

Keys are checked against ``SimConfig`` before anything runs (an unknown key is a bad spec);
values are only checked when their point runs, so one bad value fails one point, not all.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetsim.config import SimConfig, config_from_dict
from fleetsim.configutil import apply_override, apply_overrides, parse_override_value
from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_toml

SPEC_KEYS = ("base", "grid")


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    """A validated sweep: base config data and the grid (key order is the column order)."""

    base: Mapping[str, Any]
    """Plain config data (TOML tables) with ``--set`` overrides applied."""
    grid: tuple[tuple[str, tuple[Any, ...]], ...]
    """(dotted config key, values) pairs; the points are their Cartesian product."""

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for key, _ in self.grid)

    @property
    def num_points(self) -> int:
        n = 1
        for _, values in self.grid:
            n *= len(values)
        return n


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One grid point: its index (the folder name under ``points/``) and its config data."""

    index: int
    values: Mapping[str, Any]
    """dotted key -> the grid value of this point."""
    config_data: Mapping[str, Any]
    """The base data with this point's values applied; built into a ``SimConfig`` by the worker."""


def load_spec(
    path: str | Path, overrides: Sequence[str] = (), grid_args: Sequence[str] = ()
) -> SweepSpec:
    """Read a sweep TOML; ``overrides`` are ``key=value`` on the base, ``grid_args`` are
    ``key=v1,v2,...`` grid axes (replacing a file axis of the same key)."""
    path = Path(path)
    data = read_toml(path, "sweep spec")
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise FleetsimInputError(
            f"{path}: {unknown[0]}", data[unknown[0]],
            "a sweep spec has only `base` (a config path or an inline [base] table) and "
            "[grid]; put config fields under [base]")
    base = _base_data(data.get("base"), path)
    grid: dict[str, tuple[Any, ...]] = {}
    raw_grid = data.get("grid", {})
    if not isinstance(raw_grid, Mapping):
        raise FleetsimInputError(f"{path}: grid", raw_grid,
                                 'expected a table like [grid] "workload.rate_scale" = [1, 2]')
    for key, values in _flatten_grid(raw_grid):
        if not isinstance(values, list):
            raise FleetsimInputError(f"{path}: grid.{key}", values,
                                     f'expected a list of values, e.g. "{key}" = [{values!r}]')
        grid[key] = tuple(values)
    for item in grid_args:
        key, values = parse_grid_arg(item)
        grid[key] = values
    return make_spec(base, grid, overrides, where=str(path))


def make_spec(
    base: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], overrides: Sequence[str] = (),
    where: str = "sweep",
) -> SweepSpec:
    """Validate base data, ``--set`` overrides and grid keys; the API form of ``load_spec``."""
    data = copy.deepcopy(dict(base))
    apply_overrides(data, overrides)
    config_from_dict(data, where=f"{where}: base")  # the base itself must be a valid config
    if not grid:
        raise FleetsimInputError(f"{where}: grid", {}, 'the grid is empty; add an axis such as '
                                 '[grid] "workload.rate_scale" = [0.5, 1] (fleetsim run runs '
                                 'one config)')
    for key, values in grid.items():
        if len(values) == 0:
            raise FleetsimInputError(f"{where}: grid.{key}", [], "give at least one value")
        check_config_key(data, key, values[0])
    return SweepSpec(base=data, grid=tuple((k, tuple(v)) for k, v in grid.items()))


def expand(spec: SweepSpec) -> list[Point]:
    """The Cartesian product of the grid, first key varying slowest, indexed from 0."""
    points = []
    for index, combo in enumerate(itertools.product(*(v for _, v in spec.grid))):
        values = dict(zip(spec.keys, combo, strict=True))
        data = copy.deepcopy(dict(spec.base))
        for key, value in values.items():
            apply_override(data, key, copy.deepcopy(value))
        points.append(Point(index=index, values=values, config_data=data))
    return points


def parse_grid_arg(item: str) -> tuple[str, tuple[Any, ...]]:
    """``key=v1,v2`` -> (key, values); values are TOML (quotes optional for plain strings)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise FleetsimInputError("--grid", item, "write it as dotted.key=v1,v2,...")
    text = text.strip()
    try:  # TOML first, so inline tables and quoted strings with commas survive
        values = tomllib.loads(f"v = [{text}]")["v"]
    except tomllib.TOMLDecodeError:
        values = [parse_override_value(v.strip()) for v in text.split(",")]
    if not text or any(v == "" for v in values):
        raise FleetsimInputError(f"--grid {key}", text, "give a comma-separated list of values")
    return key, tuple(values)


def check_config_key(base: Mapping[str, Any], key: str, sample: Any) -> None:
    """Raise the config loader's own error when ``key`` names no ``SimConfig`` field."""
    if _key_exists(SimConfig, key.split(".")):
        return
    data = copy.deepcopy(dict(base))
    apply_override(data, key, sample)
    config_from_dict(data)  # raises "unknown key; did you mean ...?" naming the field
    raise FleetsimInputError(f"grid.{key}", fix="unknown config key")  # walker and loader disagree


def _key_exists(cls: type, parts: list[str]) -> bool:
    hint: Any = cls
    for i, part in enumerate(parts):
        hint = _strip_optional(hint)
        if typing.get_origin(hint) is tuple:
            return False  # a list field is swept whole ("cluster.pools" = [[...], [...]])
        if hint in (Any, object) or typing.get_origin(hint) in (Mapping, dict) or hint in (
                Mapping, dict):
            return True  # free-form (PolicySpec.args): the policy checks its own args
        if not dataclasses.is_dataclass(hint):
            return False  # a scalar field has no sub-keys
        hints = typing.get_type_hints(hint)
        fields = {f.name for f in dataclasses.fields(hint) if f.init}
        if part not in fields:
            return False
        hint = hints[part]
        if i == len(parts) - 1:
            return True
    return True


def _strip_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _base_data(base: Any, spec_path: Path) -> dict[str, Any]:
    if base is None:
        return {}
    from fleetsim.config import resolve_paths

    if isinstance(base, Mapping):
        return resolve_paths(copy.deepcopy(dict(base)), spec_path.parent)
    if isinstance(base, str):
        # Relative to the spec file, so a spec and its config can move together.
        path = Path(base) if Path(base).is_absolute() else spec_path.parent / base
        if not path.exists():
            raise FleetsimInputError(f"{spec_path}: base", base,
                                     f"no such file {path} (paths are relative to the spec)")
        return resolve_paths(read_toml(path, "base config"), path.parent)
    raise FleetsimInputError(f"{spec_path}: base", base,
                             "expected a config file path or an inline [base] table")


def _flatten_grid(grid: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    # [grid.workload] rate_scale = [...] is the same axis as "workload.rate_scale" = [...]
    items: list[tuple[str, Any]] = []
    for key, value in grid.items():
        if isinstance(value, Mapping):
            items.extend(_flatten_grid(value, f"{prefix}{key}."))
        else:
            items.append((f"{prefix}{key}", value))
    return items
