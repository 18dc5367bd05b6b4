"""Strict construction of frozen config dataclasses from plain dicts (TOML, JSON, --set).

Unknown keys, missing required keys and wrong types fail with a one-line
``FleetsimInputError`` that names the dotted field, the value and the fix. Every number is
checked by ``fleetsim.inputs.check_number``: finite, not a boolean, and within the physical
bounds of its field (``inputs.FIELD_LIMITS``, else by unit suffix). Nested dataclasses,
``tuple[...]``, ``X | None`` and ``Mapping[str, object]`` fields are supported; that is all
our configs use.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number

T = TypeVar("T")


def from_dict(cls: type[T], data: Mapping[str, Any], where: str, default: Any = None) -> T:
    """Build dataclass ``cls`` from ``data``; ``where`` is the dotted path used in errors.

    A required key missing from ``data`` is taken from ``default`` (the value the enclosing
    field would have had: ``--set policy.batching.args.x=1`` keeps the default policy name)
    when that is a ``cls``; otherwise it is an error naming the key.
    """
    if not isinstance(data, Mapping):
        raise FleetsimInputError(where, data, f"expected a table of {cls.__name__} fields")
    hints = _type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(fields)}"
            raise FleetsimInputError(f"{where}.{key}", value, f"unknown key; {hint}")
        kwargs[key] = coerce(value, hints[key], f"{where}.{key}", _default_of(fields[key]))
    for name, f in fields.items():
        if name in kwargs or _default_of(f) is not dataclasses.MISSING:
            continue
        if isinstance(default, cls):
            kwargs[name] = getattr(default, name)
            continue
        required = [n for n, g in fields.items() if _default_of(g) is dataclasses.MISSING]
        raise FleetsimInputError(f"{where}.{name}",
                                 fix=f"missing required key; add {name} = ... "
                                 f"(required: {', '.join(required)})")
    try:
        obj = cls(**kwargs)
    except FleetsimInputError:
        raise
    except ValueError as err:  # __post_init__ validation
        raise FleetsimInputError(where, fix=str(err)) from None
    # Physical bounds after __post_init__, whose own messages (e.g. "must be > 0") come first.
    for key in data:
        value = kwargs[key]
        if isinstance(value, int | float) and not isinstance(value, bool):
            check_number(value, f"{where}.{key}")
    return obj


_HINTS: dict[type, dict[str, Any]] = {}  # class -> its fields' resolved annotations


def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, once per class: the annotations are strings (``from
    __future__ import annotations``), and resolving them compiles each one again (a full
    ``repro loongserve`` builds about 4,000 config tables)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def coerce(value: Any, hint: Any, where: str, default: Any = None) -> Any:
    """Check ``value`` against type ``hint`` (converting lists to tuples, ints to floats);
    ``default`` is the field's default, filling required keys a nested table omits."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, where, default)
            except FleetsimInputError as err:
                errors.append(err)
        raise errors[0]
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):  # type: ignore[arg-type]
            return value
        return from_dict(hint, value, where, default)  # type: ignore[arg-type]
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise FleetsimInputError(where, value, "expected a list")
        args = typing.get_args(hint)
        item = args[0] if args else Any
        return tuple(coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or hint in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise FleetsimInputError(where, value, "expected a table")
        return dict(value)
    if hint is Any or hint is object:
        return value
    if hint is float:  # type and finiteness here; bounds once the dataclass is built
        return float(check_number(value, where, lo=-math.inf, hi=math.inf))
    if hint is int:
        return int(check_number(value, where, lo=-math.inf, hi=math.inf, integer=True))
    if hint is bool:
        if not isinstance(value, bool):
            raise FleetsimInputError(where, value, "expected true or false")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise FleetsimInputError(where, value, "expected a string")
        return value
    if typing.get_origin(hint) is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            choices = ", ".join(map(str, allowed))
            raise FleetsimInputError(where, value, f"expected one of {choices}")
        return value
    return value


def parse_override_value(text: str) -> Any:
    """Parse the right side of ``--set key=value`` as a TOML value, else keep it a string."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], items: Sequence[str],
                    rename: Callable[[str], str] | None = None) -> None:
    """Apply ``--set dotted.key=value`` items to ``data`` in place (each value parsed as a
    TOML value); ``rename`` maps a key first (aliases, a table prefix)."""
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise FleetsimInputError("--set", item, "write it as dotted.key=value")
        apply_override(data, rename(key) if rename else key, parse_override_value(value.strip()))


def apply_override(data: dict[str, Any], dotted_key: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted_key='a.b.c'``, creating tables as needed."""
    parts = dotted_key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise FleetsimInputError(f"--set {dotted_key}", child, f"{part!r} is not a table")
        node = child
    node[parts[-1]] = value


def to_plain(obj: Any) -> Any:
    """A dataclass tree as JSON-ready dicts/lists (for ``config.json``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj
