"""``fleetsim sweep SPEC.toml``: run a grid of configs, print and write the merged table."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.output import add_format_flag, output_format, print_csv, print_table

EXIT_ALL_FAILED = 1
MAX_WORKERS = 1024


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of configs in parallel (local processes or Ray)",
        description="Run the Cartesian product of a sweep spec's [grid] over its base config. "
        "Each point's results go to OUT/points/<index>/, the merged table to OUT/sweep.csv and "
        "OUT/sweep.json. A failing point is reported in the table; the others still run.")
    p.add_argument("spec", help="sweep TOML: base = \"exp.toml\" (or a [base] table) and [grid]")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the base config (repeatable)")
    p.add_argument("--grid", dest="grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="add (or replace) a grid axis, e.g. --grid workload.rate_scale=0.5,1,2")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel points (default: CPU count; 1 runs them in this process)")
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                   help="run points as Ray tasks: local (start one here), auto (the running "
                   "cluster) or ray://HOST:PORT; needs pip install 'fleetsim[ray]'")
    p.add_argument("--out", default=None, help="sweep folder (default: results/<spec name>)")
    p.add_argument("--force", action="store_true",
                   help="replace the earlier results in the folder (else refused)")
    add_format_flag(p)
    p.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from fleetsim.results import check_out_dir, fresh_out_dir
    from fleetsim.sweep import load_spec

    if args.workers is not None and args.workers < 1:
        raise FleetsimInputError("--workers", args.workers, "must be >= 1")
    if args.workers is not None and args.workers > MAX_WORKERS:
        raise FleetsimInputError("--workers", args.workers, f"must be at most {MAX_WORKERS}")
    spec = load_spec(args.spec, args.overrides, args.grid)
    out = Path(args.out) if args.out else fresh_out_dir(Path("results") / Path(args.spec).stem)
    check_out_dir(out, force=args.force)
    existed = out.exists()
    if args.ray_address is not None:
        backend, workers = "ray", args.workers
    else:
        workers = args.workers or os.cpu_count() or 1
        backend = "inline" if workers == 1 else "process"
    console = Console(stderr=True)
    started = time.perf_counter()
    rows = _run_with_progress(spec, out, backend, workers, args.ray_address, console)
    wall_s = time.perf_counter() - started
    num_ok = sum(r["status"] == "ok" for r in rows)
    fmt = output_format(args)
    if fmt == "json":
        print(json.dumps(rows, indent=2, default=str, allow_nan=False))
    elif fmt == "csv":
        print_csv(rows)
    else:
        print_table(sweep_table(spec.keys, rows))
        stdout = Console(soft_wrap=True)
        for r in rows:
            if r["status"] != "ok":
                stdout.print(f"[red]point {r['index']} failed[/red]: {escape(r['error'])}",
                                highlight=False)
            elif r.get("overload_warning"):
                stdout.print(f"[yellow]point {r['index']} overloaded[/yellow]: "
                             f"{escape(r['overload_warning'])}", highlight=False)
    where = f"Ray ({args.ray_address})" if backend == "ray" else (
        f"{workers} worker processes" if backend == "process" else "this process")
    written = (f"results in {out}/ (sweep.csv, sweep.json, points/)" if num_ok or not existed
               else f"no point succeeded, so {out}/ keeps its earlier results")
    console.print(f"{num_ok}/{len(rows)} points ok in {wall_s:.1f} s on {where}; {written}",
                  soft_wrap=True)
    return 0 if num_ok else EXIT_ALL_FAILED


def _run_with_progress(spec: Any, out: Path, backend: str, workers: int | None,
                       ray_address: str | None, console: Console) -> list[dict[str, Any]]:
    from fleetsim.sweep import run_sweep

    kwargs = {"backend": backend, "workers": workers, "ray_address": ray_address}
    if not console.is_terminal:
        return run_sweep(spec, out, **kwargs)
    from fleetsim.output import progress_bar

    with progress_bar(console, "sweep") as bar:
        task = bar.add_task("sweep", total=spec.num_points, note="")
        num_failed = 0

        def on_result(result: Any) -> None:
            nonlocal num_failed
            num_failed += result.status != "ok"
            bar.update(task, advance=1, note=f"{num_failed} failed" if num_failed else "")

        return run_sweep(spec, out, on_result=on_result, **kwargs)


def sweep_table(keys: tuple[str, ...], rows: list[dict[str, Any]]) -> Table:
    """The merged rows: grid values, then p99 latencies, throughput, SLO and cost."""
    from fleetsim.cli import _fmt

    table = Table(title="sweep")
    table.add_column("#", justify="right")
    short = [k.rsplit(".", 1)[-1] for k in keys]
    for key, name in zip(keys, short, strict=True):
        table.add_column(name if short.count(name) == 1 else key)
    cols = (("TTFT p99 s", "ttft_p99_s"), ("TPOT p99 s", "tpot_p99_s"),
            ("E2E p99 s", "e2e_p99_s"), ("req/s", "throughput_requests_per_s"),
            ("SLO", "slo_attainment"), ("SLO-met req/s at load", "goodput_requests_per_s"))
    has_cost = any(r.get("usd_per_hour") is not None for r in rows)
    if has_cost:
        cols += (("$/hour", "usd_per_hour"),)
    table.add_column("status")
    for label, _ in cols:
        table.add_column(label, justify="right")
    for r in rows:
        values = [str(r["index"]), *(escape(str(r[k])) for k in keys)]
        if r["status"] != "ok":
            table.add_row(*values, "[red]failed[/red]", *("" for _ in cols))
            continue
        cells = []
        for _, col in cols:
            v = r.get(col)
            cells.append(f"{100 * v:.1f}%" if col == "slo_attainment" and v is not None
                         else _fmt(v) if v is None or abs(v) >= 100 else f"{v:.4g}")
        status = "[yellow]overloaded[/yellow]" if r.get("overload_warning") else "ok"
        table.add_row(*values, status, *cells)
    return table
