"""``fleetsim rl run CONFIG``: simulate an RL post-training job and write its results."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.formatting import fmt_number


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rl", help="RL post-training jobs on simulated clusters (docs/rl.md)",
                       description="Simulate RL post-training: rollouts on the serving engine, "
                                   "inference and training passes, weight synchronisation.")
    rl_sub = p.add_subparsers(dest="rl_command", required=True)
    r = rl_sub.add_parser("run", help="simulate the [rl] job of a TOML config")
    r.add_argument("config", nargs="?", help="TOML file with an [rl] table (optional)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field, e.g. --set num_steps=10 (repeatable)")
    r.add_argument("--out", default=None, help="results folder (default results/rl/<system>)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument("--gantt-steps", type=int, default=2, metavar="N",
                   help="steps drawn in gantt.png (default 2)")
    r.set_defaults(handler=cmd_rl_run)


def cmd_rl_run(args: argparse.Namespace) -> int:
    from fleetsim.errors import FleetsimInputError
    from fleetsim.results import StagedFolder, check_out_dir, fresh_out_dir, write_json
    from fleetsim.rl import load_rl_config, run_rl
    from fleetsim.rl.results import gantt, write_timeline_csv

    if args.gantt_steps < 1:
        raise FleetsimInputError("--gantt-steps", args.gantt_steps, "draw at least 1 step")
    cfg = load_rl_config(args.config, args.overrides)
    out = Path(args.out) if args.out else fresh_out_dir(Path("results") / "rl" / cfg.system.name)
    check_out_dir(out)
    result = run_rl(cfg)
    summary = result.summary
    with StagedFolder(out) as tmp:
        write_json(tmp / "summary.json", summary)
        write_json(tmp / "config.json", summary["config"])
        write_timeline_csv(tmp / "timeline.csv", result.rows)
        with contextlib.suppress(ImportError):  # matplotlib is optional
            gantt(tmp / "gantt.png", result.job, args.gantt_steps)
    if args.json:
        from fleetsim.cli import print_json

        print_json(summary)
    else:
        _print(summary, out)
    return 0


def _print(s: dict[str, Any], out: Path) -> None:
    console = Console() if Console().is_terminal else Console(width=160)
    stages = list(s["stage_time_s"])
    table = Table(title=f"{s['system']} ({s['placement']}, {s['algorithm']}): {s['actor']}, "
                        f"{s['samples_per_step']} samples per step — seconds per step")
    table.add_column("step", justify="right")
    table.add_column("step time", justify="right")
    for st in stages:
        table.add_column(st, justify="right")
    for row in s["steps"]:
        table.add_row(str(row["step"]), fmt_number(row["time_s"]),
                      *(fmt_number(row["stages_s"].get(st, 0.0)) for st in stages))
    console.print(table)
    console.print(f"samples/s {fmt_number(s['samples_per_s'])} (steady "
                  f"{fmt_number(s['steady_samples_per_s'])}), tokens/s "
                  f"{fmt_number(s['tokens_per_s'])}, makespan {fmt_number(s['makespan_s'])} s")
    for name, p in s["pools"].items():
        console.print(f"pool {name}: {p['num_gpus']} x {p['gpu']} ({', '.join(p['stages'])}), "
                      f"GPU utilisation {p['utilization']:.1%}")
    b = s["bubble"]
    console.print(f"bubbles: pipeline {fmt_number(b['pipeline_s'])} s, generation tail idle "
                  f"{fmt_number(b['generation_tail_idle_gpu_s'])} GPU-s")
    console.print(f"results written to {out}/ (summary.json, timeline.csv, gantt.png)",
                  soft_wrap=True)
