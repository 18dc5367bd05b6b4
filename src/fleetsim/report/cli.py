"""``fleetsim report DIR``: one self-contained HTML page of a run, sweep, plan or search."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="write an HTML report of a results folder",
        description="Read a run folder (summary.json, requests.csv), a sweep folder "
        "(sweep.json, points/), a capacity plan (plan.json) or a goodput-search JSON, or a "
        "folder of those, and write one self-contained HTML page with latency CDFs, SLO "
        "attainment vs offered load, queue length and batch size over time, the Pareto front and "
        "summary tables, under a header naming the model, trace, SLO and fleetsim version.")
    p.add_argument("dir", help="results folder (or one JSON file)")
    p.add_argument("--out", default=None, help="HTML file (default: DIR/report.html)")
    p.set_defaults(handler=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from rich.console import Console

    from fleetsim.output import progress_bar
    from fleetsim.report import write_report
    from fleetsim.report.html import NUM_SECTIONS

    # The front end reads the clock, so that the package below it never does.
    made_on = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    console = Console(stderr=True)
    if not console.is_terminal:
        path = write_report(args.dir, args.out, made_on)
    else:
        with progress_bar(console, "report") as bar:
            task = bar.add_task("report", total=NUM_SECTIONS, note=f"reading {args.dir}")

            def progress(title: str) -> None:
                bar.update(task, advance=1, note=f"drew {title}")

            path = write_report(args.dir, args.out, made_on, progress)
    print(f"report written to {path}")
    return 0
