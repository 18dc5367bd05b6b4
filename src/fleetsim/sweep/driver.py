"""``run_sweep``: expand a spec, run its points on a backend, write the sweep folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetsim.sweep.runner import PointResult, run_points
from fleetsim.sweep.spec import SweepSpec, expand
from fleetsim.sweep.table import row_of, write_point, write_table


def run_sweep(
    spec: SweepSpec, out: str | Path | None = None, *, backend: str = "process",
    workers: int | None = None, ray_address: str | None = None,
    on_result: Callable[[PointResult], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every point; return the merged rows by index. With ``out``, write each point's
    folder as it finishes and the merged table at the end. ``on_result`` sees each result
    (progress bars)."""
    points = expand(spec)
    folder = Path(out) if out is not None else None  # created by the first point written
    rows: list[dict[str, Any]] = []
    try:
        for result in run_points(points, backend=backend, workers=workers,
                                 ray_address=ray_address):
            if folder is not None:
                write_point(folder, result)
            rows.append(row_of(result))
            if on_result is not None:
                on_result(result)
    finally:  # an interrupted sweep still leaves the table of the points that finished
        rows.sort(key=lambda r: r["index"])
        if folder is not None and rows:
            write_table(folder, spec, rows)
    return rows
