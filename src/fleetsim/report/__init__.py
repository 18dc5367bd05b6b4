"""HTML reports of result folders: latency CDFs, SLO attainment vs offered load, queue length
and batch size over time, Pareto front (matplotlib, an optional dependency imported only when
a report is made)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleetsim.errors import FleetsimInputError

DEFAULT_NAME = "report.html"


def write_report(path: str | Path, out: str | Path | None = None,
                 made_on: str | None = None,
                 progress: Callable[[str], None] | None = None) -> Path:
    """Read whatever ``path`` holds (see ``fleetsim.report.load``), write one self-contained
    HTML page to ``out`` (default: ``<path>/report.html``) and return its path. ``made_on``
    (e.g. "2026-12-01 16:05 UTC", read from the clock by the caller) dates the page;
    ``progress`` is called after each of its ``html.NUM_SECTIONS`` sections."""
    from fleetsim.report.load import load_inputs

    inputs = load_inputs(path)  # input errors first: they do not need matplotlib
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise FleetsimInputError("fleetsim report", "matplotlib is not installed",
                                 "pip install 'fleetsim[report]'") from None
    from fleetsim.report.html import render
    from fleetsim.results import check_out_file, write_file

    root = Path(path)
    target = Path(out) if out is not None else (
        root / DEFAULT_NAME if root.is_dir() else root.with_suffix(".html"))
    if target.is_dir():
        raise FleetsimInputError("--out", str(target), "it is a folder; give an .html file path")
    check_out_file(target, "--out")
    write_file(target, render(inputs, made_on, progress))
    return target


__all__ = ["DEFAULT_NAME", "write_report"]
