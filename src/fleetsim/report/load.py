"""Read result folders for a report: runs, sweeps, capacity plans and goodput searches.

What ``fleetsim report DIR`` recognizes (DIR itself, or its direct subfolders):

- a run folder: ``summary.json`` (+ ``requests.csv`` for latency CDFs) as ``fleetsim run`` writes;
- a sweep folder: ``sweep.json`` + ``points/<index>/`` as ``fleetsim sweep`` writes;
- a plan: ``plan.json`` = {"target", "points": [{"shape", "usd_per_hour",
  "goodput_requests_per_s", "pools", ...}], "front": [indices into points]};
- a goodput search: any other JSON with "probes": [{"rate_per_s", "attainment", "passed",
  "ttft_attainment", "tpot_attainment"}], plus "goodput_requests_per_s", "target".

Files written by other commands are read defensively: a missing field leaves a figure out
(with a note on the page), it never fails the report.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_json, read_text

LATENCY_COLUMNS = ("ttft_s", "tpot_s", "e2e_s")


@dataclass(slots=True, kw_only=True)
class RunData:
    """One simulation's results: a run folder or one sweep point."""

    label: str
    path: Path
    summary: dict[str, Any]
    latencies: dict[str, NDArray[np.float64]] | None = None
    """ttft_s / tpot_s / e2e_s per finished request (from requests.csv), None if absent."""
    values: dict[str, Any] = field(default_factory=dict)
    """Grid values of a sweep point (dotted key -> value); empty for a plain run."""
    config: dict[str, Any] | None = None
    """The resolved config (config.json), None if absent or unreadable."""


@dataclass(slots=True, kw_only=True)
class SweepData:
    path: Path
    keys: tuple[str, ...]
    rows: list[dict[str, Any]]
    """The merged table (sweep.json "points"), failed points included."""
    runs: list[RunData]
    """The ok points, by index."""


@dataclass(slots=True, kw_only=True)
class PlanData:
    path: Path
    points: list[dict[str, Any]]
    """Feasible shapes: {"label", "usd_per_hour", "goodput_requests_per_s", "on_front", ...}."""
    target: float | None
    num_infeasible: int


@dataclass(slots=True, kw_only=True)
class SearchData:
    path: Path
    probes: list[dict[str, Any]]
    """{"rate_per_s", "attainment", "passed", ...} sorted by rate."""
    target: float | None
    goodput_requests_per_s: float | None


@dataclass(slots=True, kw_only=True)
class ReportInputs:
    path: Path
    runs: list[RunData] = field(default_factory=list)
    sweeps: list[SweepData] = field(default_factory=list)
    plans: list[PlanData] = field(default_factory=list)
    searches: list[SearchData] = field(default_factory=list)

    def all_runs(self) -> list[RunData]:
        """Plain runs, then every sweep's ok points."""
        return self.runs + [r for s in self.sweeps for r in s.runs]

    def is_empty(self) -> bool:
        return not (self.runs or self.sweeps or self.plans or self.searches)


def load_inputs(path: str | Path) -> ReportInputs:
    """Everything recognizable at ``path`` (a folder, its subfolders, or one JSON file)."""
    root = Path(path)
    if not root.exists():
        raise FleetsimInputError(str(root), "no such file or folder",
                                 "give a results folder (fleetsim run/sweep --out)")
    if not (root.is_file() or root.is_dir()):
        raise FleetsimInputError(str(root), "not a regular file or folder",
                                 "give a results folder (fleetsim run/sweep --out)")
    inputs = ReportInputs(path=root)
    try:
        if root.is_file():
            _load_json_file(root, inputs)
        else:
            _load_folder(root, inputs, label=root.name or str(root))
            for sub in sorted(p for p in root.iterdir() if p.is_dir()):  # results/<run>/
                if sub.name != "points" or not inputs.sweeps:
                    _load_folder(sub, inputs, label=sub.name)
    except OSError as err:  # a folder the user may not list or read (PermissionError)
        raise FleetsimInputError(str(err.filename or root), err.strerror or str(err),
                                 "cannot read the results; check the folder's permissions "
                                 "(or run as a user who may read it)") from None
    if inputs.is_empty():
        raise FleetsimInputError(
            str(root), "nothing to report",
            "expected summary.json (fleetsim run), sweep.json (fleetsim sweep), plan.json "
            "or a goodput-search JSON, in the folder or its subfolders")
    return inputs


def _load_folder(folder: Path, inputs: ReportInputs, label: str) -> None:
    if (folder / "sweep.json").is_file():
        inputs.sweeps.append(load_sweep(folder))
    elif (folder / "summary.json").is_file():
        inputs.runs.append(load_run(folder, label))
    for file in sorted(folder.glob("*.json")):
        if file.name not in ("sweep.json", "summary.json", "config.json"):
            _load_json_file(file, inputs, strict=False)


def _load_json_file(file: Path, inputs: ReportInputs, strict: bool = True) -> None:
    # strict: a file the user named must parse; other JSON lying in a folder may be anything.
    try:
        data = _read_json(file)
    except FleetsimInputError:
        if strict:
            raise
        return
    if not isinstance(data, Mapping):
        return
    if file.name == "sweep.json" or "grid" in data and "columns" in data:
        inputs.sweeps.append(load_sweep(file.parent))
    elif file.name == "summary.json" or "ttft_s" in data and "slo" in data:
        inputs.runs.append(load_run(file.parent, file.parent.name))
    elif isinstance(data.get("probes"), list):
        inputs.searches.append(parse_search(file, data))
    elif isinstance(data.get("points"), list) and "front" in data:
        inputs.plans.append(parse_plan(file, data))


def load_run(folder: Path, label: str, values: Mapping[str, Any] | None = None) -> RunData:
    summary = _read_json(folder / "summary.json")
    if not isinstance(summary, dict):
        raise FleetsimInputError(str(folder / "summary.json"), type(summary).__name__,
                                 "expected the JSON object fleetsim run writes")
    csv_path = folder / "requests.csv"
    latencies = read_latencies(csv_path) if csv_path.is_file() else None
    return RunData(label=label, path=folder, summary=summary, latencies=latencies,
                   values=dict(values or {}), config=_optional_config(folder / "config.json"))


def _optional_config(path: Path) -> dict[str, Any] | None:
    # Only the header and the workload check use it: a missing or broken one leaves them
    # to the summary's fields.
    if not path.is_file():
        return None
    try:
        config = _read_json(path)
    except FleetsimInputError:
        return None
    return config if isinstance(config, dict) else None


def load_sweep(folder: Path) -> SweepData:
    doc = _read_json(folder / "sweep.json")
    if not isinstance(doc, Mapping) or not isinstance(doc.get("points"), list):
        raise FleetsimInputError(str(folder / "sweep.json"), "no points list",
                                 "expected the sweep.json that fleetsim sweep writes")
    keys = tuple(doc.get("grid", {}))
    rows = [r for r in doc["points"] if isinstance(r, Mapping)]
    runs = []
    for row in rows:
        point_dir = folder / str(row.get("dir", f"points/{row.get('index')}"))
        if row.get("status") == "ok" and (point_dir / "summary.json").is_file():
            values = {k: row.get(k) for k in keys}
            runs.append(load_run(point_dir, point_label(values) or f"point {row.get('index')}",
                                 values))
    return SweepData(path=folder, keys=keys, rows=[dict(r) for r in rows], runs=runs)


def point_label(values: Mapping[str, Any]) -> str:
    """``rate_scale=2, gpu=a100``: last part of each dotted key (the whole key if ambiguous)."""
    short = [k.rsplit(".", 1)[-1] for k in values]
    return ", ".join(f"{s if short.count(s) == 1 else k}={v}"
                     for k, s, v in zip(values, short, values.values(), strict=True))


def parse_plan(file: Path, data: Mapping[str, Any]) -> PlanData:
    raw = [p for p in data["points"] if isinstance(p, Mapping)]
    front = {i for i in data.get("front", []) if isinstance(i, int)}
    points = []
    for i, p in enumerate(raw):
        cost = _number(p.get("usd_per_hour"))
        goodput = _number(p.get("goodput_requests_per_s", p.get("goodput_rps")))
        if cost is None or goodput is None:
            continue
        points.append({**p, "label": str(p.get("shape") or p.get("name") or f"shape {i}"),
                       "usd_per_hour": cost, "goodput_requests_per_s": goodput,
                       "on_front": i in front})
    return PlanData(path=file, points=points, target=_number(data.get("target")),
                    num_infeasible=len(raw) - len(points))


def parse_search(file: Path, data: Mapping[str, Any]) -> SearchData:
    probes = []
    for p in data["probes"]:
        if not isinstance(p, Mapping):
            continue
        rate = _number(p.get("rate_per_s", p.get("rate")))
        attainment = _number(p.get("attainment", p.get("slo_attainment")))
        if rate is not None and attainment is not None:
            probes.append({**p, "rate_per_s": rate, "attainment": attainment})
    probes.sort(key=lambda p: p["rate_per_s"])
    return SearchData(path=file, probes=probes, target=_number(data.get("target")),
                      goodput_requests_per_s=_number(data.get("goodput_requests_per_s")))


def read_latencies(path: Path) -> dict[str, NDArray[np.float64]] | None:
    """The latency columns of a requests.csv (empty cells -> NaN); None if it has none."""
    reader = csv.DictReader(io.StringIO(read_text(path, "requests table"), newline=""))
    fields = reader.fieldnames or []
    if not set(LATENCY_COLUMNS) <= set(fields):
        return None
    columns: dict[str, list[float]] = {c: [] for c in LATENCY_COLUMNS}
    for row in reader:
        for c in LATENCY_COLUMNS:
            columns[c].append(_float_or_nan(row.get(c) or ""))
    return {c: np.asarray(v, dtype=np.float64) for c, v in columns.items()}


def _read_json(path: Path) -> Any:
    return read_json(path, "results file")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _float_or_nan(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return math.nan
    return value if math.isfinite(value) else math.nan
