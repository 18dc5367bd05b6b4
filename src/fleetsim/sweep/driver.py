"""``run_sweep``: expand a spec, run its points on a backend, write the sweep folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetsim.results import StagedFolder
from fleetsim.sweep.runner import PointResult, run_points
from fleetsim.sweep.spec import SweepSpec, expand
from fleetsim.sweep.table import row_of, write_point, write_table


def run_sweep(
    spec: SweepSpec, out: str | Path | None = None, *, backend: str = "process",
    workers: int | None = None, ray_address: str | None = None,
    on_result: Callable[[PointResult], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every point; return the merged rows by index. With ``out``, each point's folder is
    written as it finishes into a staging folder that replaces ``out`` whole at the end
    (``fleetsim.results.StagedFolder``): an interrupted sweep, or one whose every point failed
    while ``out`` holds earlier results, leaves ``out`` as it was. ``on_result`` sees each
    result (progress bars)."""
    points = expand(spec)
    rows: list[dict[str, Any]] = []
    if out is None:
        for result in run_points(points, backend=backend, workers=workers,
                                 ray_address=ray_address):
            rows.append(row_of(result))
            if on_result is not None:
                on_result(result)
        return sorted(rows, key=lambda r: r["index"])
    folder = Path(out)
    staged = StagedFolder(folder)
    with staged as tmp:
        for result in run_points(points, backend=backend, workers=workers,
                                 ray_address=ray_address):
            write_point(tmp, result)
            rows.append(row_of(result))
            if on_result is not None:
                on_result(result)
        rows.sort(key=lambda r: r["index"])
        if rows and not any(r["status"] == "ok" for r in rows) and folder.exists():
            staged.discard()  # do not replace earlier results with a sweep of failures
        else:
            write_table(tmp, spec, rows)
    return rows
