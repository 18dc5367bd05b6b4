"""``fleetsim moe compare``: balancers side by side on synthetic MoE loads.

The main CLI registers this with ``add_parser(subparsers)`` and calls ``run(args)``; a
``FleetsimInputError`` raised here becomes its one-line message and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.compare import (
    COMPARE_LOADS,
    STRESS_SCENARIOS,
    CompareRow,
    CompareSetup,
    run_compare,
)
from fleetsim.moe.load_presets import LOAD_PRESETS


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Register ``moe`` with its ``compare`` subcommand; returns the ``moe`` parser."""
    moe = subparsers.add_parser("moe", help="MoE expert-parallel load balancing")
    moe_sub = moe.add_subparsers(dest="moe_command", required=True)
    cmp = moe_sub.add_parser(
        "compare",
        help="imbalance, throughput vs ideal, moved bytes and planning time per balancer",
    )
    cmp.add_argument(
        "--scenario",
        action="append",
        dest="scenarios",
        metavar="NAME",
        help=f"load, repeatable: a synthetic scenario ({', '.join(STRESS_SCENARIOS)}, or all "
        f"of them) or a measured preset ({', '.join(LOAD_PRESETS)}); default: all",
    )
    cmp.add_argument("--num-gpus", type=int, default=64, help="GPUs in the EP group")
    cmp.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per NVLink node")
    cmp.add_argument("--num-experts", type=int, default=256, help="logical experts per layer")
    cmp.add_argument("--spare-slots", type=int, default=1, help="replica slots per GPU")
    cmp.add_argument("--microbatches", type=int, default=24, help="microbatches per scenario")
    cmp.add_argument("--batch", type=int, default=8, help="microbatches per batch")
    cmp.add_argument("--layers", type=int, default=8, help="MoE layers simulated")
    cmp.add_argument(
        "--tokens-per-gpu", type=int, default=None, help="tokens per GPU per microbatch"
    )
    cmp.add_argument("--seed", type=int, default=0, help="seed of the load traces")
    cmp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cmp.add_argument(
        "--plot", metavar="PATH", default=None,
        help="write a PNG: imbalance per microbatch next to throughput, setup in the title",
    )
    cmp.set_defaults(handler=run, func=run)
    return moe


def _scenarios(names: list[str] | None) -> list[str]:
    names = names or ["all"]
    expanded = [s for name in names for s in (STRESS_SCENARIOS if name == "all" else (name,))]
    for name in expanded:
        if name not in COMPARE_LOADS:
            raise FleetsimInputError(
                "--scenario", name, f"use one of {', '.join(COMPARE_LOADS)} or all"
            )
    return list(dict.fromkeys(expanded))


def _setups(args: argparse.Namespace) -> list[CompareSetup]:
    checks = {
        "--num-gpus": args.num_gpus,
        "--gpus-per-node": args.gpus_per_node,
        "--num-experts": args.num_experts,
        "--layers": args.layers,
        "--batch": args.batch,
    }
    for flag, value in checks.items():
        if value <= 0:
            raise FleetsimInputError(flag, value, "must be > 0")
    if args.microbatches < 2:
        raise FleetsimInputError("--microbatches", args.microbatches, "must be >= 2")
    if args.spare_slots < 0:
        raise FleetsimInputError("--spare-slots", args.spare_slots, "must be >= 0")
    if args.tokens_per_gpu is not None and args.tokens_per_gpu <= 0:
        raise FleetsimInputError("--tokens-per-gpu", args.tokens_per_gpu, "must be > 0")
    if args.num_gpus % args.gpus_per_node:
        raise FleetsimInputError(
            "--gpus-per-node", args.gpus_per_node, f"must divide --num-gpus={args.num_gpus}"
        )
    if args.num_experts % args.num_gpus:
        raise FleetsimInputError(
            "--num-experts", args.num_experts, f"must be a multiple of --num-gpus={args.num_gpus}"
        )
    return [
        CompareSetup(
            scenario=scenario,
            num_gpus=args.num_gpus,
            gpus_per_node=args.gpus_per_node,
            num_experts=args.num_experts,
            num_spare_slots_per_gpu=args.spare_slots,
            num_microbatches=args.microbatches,
            microbatches_per_batch=args.batch,
            num_layers=args.layers,
            num_tokens_per_gpu=args.tokens_per_gpu,
            seed=args.seed,
        )
        for scenario in _scenarios(args.scenarios)
    ]


def _as_dict(row: CompareRow) -> dict[str, object]:
    return {
        "scenario": row.scenario,
        "balancer": row.balancer,
        "imbalance": row.imbalance,
        "worst_imbalance": row.worst_imbalance,
        "relative_throughput": row.relative_throughput,
        "moved_bytes_per_layer": row.moved_bytes_per_layer,
        "intra_bytes_per_layer": row.intra_bytes_per_layer,
        "inter_bytes_per_layer": row.inter_bytes_per_layer,
        "plan_ms_per_layer": row.plan_ms_per_layer,
        "sees": row.sees,
        "prefetchable": row.prefetchable,
        "note": row.note,
        "imbalance_by_microbatch": list(row.imbalance_by_microbatch),
    }


def _print_table(rows: list[CompareRow]) -> None:
    from rich.table import Table

    table = Table(title="MoE expert balancing (means over microbatches and layers)")
    columns = (
        "scenario",
        "balancer",
        "sees",
        "max/mean",
        "worst",
        "vs ideal",
        "intra MB",
        "inter MB",
        "prefetch",
        "plan ms",
    )
    for col in columns:
        numeric = col not in ("scenario", "balancer", "sees", "prefetch")
        table.add_column(col, justify="right" if numeric else "left")
    table.caption = (
        "sees: what the planner plans from; vs ideal: throughput relative to force-balanced; "
        "intra/inter MB: expert bytes copied per layer per microbatch inside / across nodes; "
        "prefetch: whether those copies are known before the step; plan ms per layer"
    )
    for r in rows:
        plan = "-" if r.plan_ms_per_layer is None else f"{r.plan_ms_per_layer:.3f}"
        table.add_row(
            r.scenario,
            r.balancer,
            r.sees + (f" [{r.note}]" if r.note else ""),
            f"{r.imbalance:.3f}",
            f"{r.worst_imbalance:.2f}",
            f"{r.relative_throughput:.1%}",
            f"{r.intra_bytes_per_layer / 1e6:.0f}",
            f"{r.inter_bytes_per_layer / 1e6:.0f}",
            r.prefetchable,
            plan,
        )
    from fleetsim.output import print_table

    print_table(table)


def run(args: argparse.Namespace) -> int:
    """Run the comparison described by ``args``; prints a table (or JSON). Returns 0."""
    if args.plot:  # before the work: a plot that cannot be written is bad input
        from fleetsim.results import check_out_file

        check_out_file(Path(args.plot), "--plot")
    rows: list[CompareRow] = []
    setups = list(_setups(args))
    for k, setup in enumerate(setups, 1):
        if sys.stderr.isatty():
            print(f"moe compare: setup {k} of {len(setups)}...", file=sys.stderr, flush=True)
        # Planning time is a benchmark figure measured here, outside the simulator.
        rows += run_compare(setup, clock=time.perf_counter)
    if args.json:
        print(json.dumps([_as_dict(r) for r in rows], indent=2))
    else:
        _print_table(rows)
    if args.plot:
        _write_plot(rows, setups, Path(args.plot))
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _write_plot(rows: list[CompareRow], setups: list[CompareSetup], path: Path) -> None:
    import io

    from fleetsim.moe.compare_figure import compare_figure
    from fleetsim.results import write_file

    buf = io.BytesIO()
    compare_figure(rows, setups).savefig(buf, format="png", dpi=110)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, buf.getvalue())
