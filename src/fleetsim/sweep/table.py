"""The merged sweep table: one row per point (grid values, status, key metrics), and the
files of a sweep folder:

    DIR/sweep.csv, DIR/sweep.json          the merged table (sweep.json also has the spec)
    DIR/points/<index>/summary.json, config.json, requests.csv    an ok point
    DIR/points/<index>/error.txt           a failed point's message (and traceback)
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetsim.sweep.runner import PointResult
from fleetsim.sweep.spec import SweepSpec

# column -> path into summary.json; cost columns stay empty until summaries carry "cost".
METRICS: dict[str, tuple[str, ...]] = {
    "num_requests": ("num_requests",),
    "num_finished": ("num_finished",),
    "ttft_p50_s": ("ttft_s", "p50"),
    "ttft_p99_s": ("ttft_s", "p99"),
    "tpot_p50_s": ("tpot_s", "p50"),
    "tpot_p99_s": ("tpot_s", "p99"),
    "e2e_p50_s": ("e2e_s", "p50"),
    "e2e_p99_s": ("e2e_s", "p99"),
    "throughput_requests_per_s": ("throughput", "requests_per_s"),
    "output_tokens_per_s": ("throughput", "output_tokens_per_s"),
    "slo_attainment": ("slo", "attainment"),
    "goodput_requests_per_s": ("slo", "goodput_requests_per_s"),
    "usd_per_hour": ("cost", "usd_per_hour"),
    "usd_per_million_tokens": ("cost", "usd_per_million_tokens"),
    "offered_over_capacity": ("overload", "offered_over_capacity"),
    "overload_warning": ("overload", "warning"),
}
POINTS_DIR = "points"


def row_of(result: PointResult) -> dict[str, Any]:
    """One table row: index, grid values (by dotted key), status, error, metrics."""
    row: dict[str, Any] = {"index": result.index, **result.values, "status": result.status,
                           "error": result.error or ""}
    for column, path in METRICS.items():
        row[column] = _get(result.summary, path) if result.summary else None
    row["dir"] = f"{POINTS_DIR}/{result.index}"
    return row


def write_point(out: Path, result: PointResult) -> None:
    """Write one point's folder (results, or error.txt for a failed point) under ``out``, a
    fresh staging folder (``fleetsim.results.StagedFolder``), so nothing stale is left."""
    from fleetsim.results import write_run_files

    folder = out / POINTS_DIR / str(result.index)
    folder.mkdir(parents=True, exist_ok=True)
    if result.status == "ok":
        assert result.summary is not None
        assert result.config is not None
        assert result.requests is not None
        write_run_files(folder, result.summary, result.config, result.requests)
        return
    text = result.error or ""
    if result.traceback:
        text += "\n\n" + result.traceback
    (folder / "error.txt").write_text(text + "\n")


def write_table(out: Path, spec: SweepSpec, rows: Sequence[dict[str, Any]]) -> None:
    """``sweep.csv`` and ``sweep.json`` (rows sorted by index, the spec alongside)."""
    rows = sorted(rows, key=lambda r: r["index"])
    columns = ["index", *spec.keys, "status", "error", *METRICS, "dir"]
    with open(out / "sweep.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([_cell(row.get(c)) for c in columns])
    doc = {
        "grid": {key: list(values) for key, values in spec.grid},
        "base": spec.base,
        "num_points": len(rows),
        "num_ok": sum(r["status"] == "ok" for r in rows),
        "num_failed": sum(r["status"] != "ok" for r in rows),
        "columns": columns,
        "points": rows,
    }
    text = json.dumps(doc, indent=2, default=str, allow_nan=False)
    (out / "sweep.json").write_text(text + "\n", encoding="utf-8")


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict | list):
        return json.dumps(v, separators=(",", ":"))
    return v
