"""The ``fleetsim`` command: parse arguments, build a config, run, print and write results.

Any ``FleetsimInputError`` becomes one line on stderr and exit code 2, with no traceback.
Result files are written to temporary names and renamed into place only after the run
succeeded, so a failed run never clobbers earlier results.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.formatting import fmt_number as _fmt

EXIT_INPUT_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        handler = getattr(args, "handler", None) or args.func
        return int(handler(args) or 0)
    except FleetsimInputError as err:
        print(f"fleetsim: error: {err}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("fleetsim: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetsim",
        description="Simulate LLM serving on GPU clusters: latency, goodput and cost.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a simulation (defaults: embedded Azure trace, "
                       "Llama-3.1-8B on one H100)")
    p.add_argument("config", nargs="?", help="TOML config file (optional)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set hardware.gpu=h200 (repeatable)")
    p.add_argument("--out", default=None, help="results folder (default: results/<run name>)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("perf", help="predicted step time and its per-op breakdown")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--backend", default="auto", choices=("auto", "roofline"))
    p.add_argument("--gpu-catalog", default=None, help="TOML file with extra GPUs")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--prefill-tokens", type=int, help="one prefill chunk of N tokens")
    group.add_argument("--decode-batch", type=int, help="a decode step of B requests")
    p.add_argument("--context", type=int, default=None,
                   help="tokens already in KV (prefill: before the chunk; decode: per request)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_perf)

    p = sub.add_parser("models", help="list the model catalog")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_models)

    p = sub.add_parser("gpus", help="list the GPU catalog")
    p.add_argument("--catalog", default=None, help="TOML file with extra GPUs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_gpus)

    p = sub.add_parser("trace", help="inspect workload traces")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    q = tsub.add_parser("info", help="describe a trace file (or embedded:azure_conv_2023)")
    q.add_argument("file")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=cmd_trace_info)

    _add_optional_commands(sub)
    return parser


# Packages that own a command expose ``add_parser(subparsers)`` in a ``cli`` module; the
# parser they register sets ``handler`` to a function taking the parsed args.
COMMAND_MODULES = ("fleetsim.moe.cli", "fleetsim.search.cli", "fleetsim.sweep.cli",
                   "fleetsim.report.cli")


def _add_optional_commands(sub: Any) -> None:
    import importlib

    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and name.startswith(err.name):
                continue  # that package is not there (yet)
            raise
        module.add_parser(sub)


# ---- run ------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config

    config = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("results") / (
        Path(args.config).stem if args.config else "default")
    if out.exists() and not out.is_dir():
        raise FleetsimInputError("--out", str(out), "it is a file; give a folder path")
    console = Console(stderr=True)
    result = _run_with_progress(config, console)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "summary.json", result.summary)
    _write_json(out / "config.json", result.config)
    _write_requests_csv(out / "requests.csv", result.records.requests)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        Console().print(summary_table(result.summary))
        Console().print(f"results written to {out}/ (summary.json, requests.csv, config.json)")
    return 0


def _run_with_progress(config: Any, console: Console) -> Any:
    from fleetsim.run import run

    if not console.is_terminal:
        return run(config)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.fields[t]}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("sim", total=None, t="")

        def progress(now_s: float) -> None:
            bar.update(task, t=f"{now_s:,.0f} simulated s")

        return run(config, progress=progress)


def summary_table(s: dict[str, Any]) -> Table:
    """The run summary as a table: latency percentiles, then throughput and SLO figures."""
    table = Table(title=f"{s['model']} on {s['tp']}x {s['gpu']} — {s['workload']}")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "E2E (s)"),
                       ("queueing_s", "queueing (s)")):
        d = s[key]
        table.add_row(label, *(_fmt(d[c]) for c in ("mean", "p50", "p90", "p99")))
    thr, slo = s["throughput"], s["slo"]
    rows = [
        ("requests finished", f"{s['num_finished']:,} / {s['num_requests']:,}"),
        ("throughput (req/s)", _fmt(thr["requests_per_s"])),
        ("throughput (output tok/s)", _fmt(thr["output_tokens_per_s"])),
        ("throughput (input tok/s)", _fmt(thr["input_tokens_per_s"])),
        (f"SLO attainment (TTFT≤{slo['ttft_s']:g}s, TPOT≤{slo['tpot_s']:g}s)",
         f"{100 * slo['attainment']:.1f}%"),
        ("goodput (req/s)", _fmt(slo["goodput_requests_per_s"])),
        ("KV cache used (mean)", f"{100 * s['kv_cache']['mean_used_fraction']:.1f}%"),
        ("prefix-cache hit rate", f"{100 * s['kv_cache']['prefix_hit_rate']:.1f}%"),
        ("GPU busy (a step running)", f"{100 * s['gpu_busy_fraction']:.1f}%"),
        ("mean batch (requests / tokens per step)",
         f"{s['batch']['mean_running']:.1f} / {s['batch']['mean_tokens_per_step']:,.0f}"),
        ("preemptions", f"{s['num_preemptions']:,}"),
    ]
    for label, value in rows:
        table.add_row(label, value, "", "", "")
    return table


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _write_requests_csv(path: Path, req: dict[str, Any]) -> None:
    """One row per finished request, by request id."""
    from fleetsim.metrics.summary import per_request_latencies

    lat = per_request_latencies(req)
    order = req["request_id"].argsort(kind="stable")
    header = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s",
              "e2e_s", "queueing_delay_s", "preemptions", "prefix_hit_tokens", "replica_id")
    cols = (req["request_id"], req["arrival_s"], req["num_prompt_tokens"],
            req["num_output_tokens"], lat["ttft_s"], lat["tpot_s"], lat["e2e_s"],
            lat["queueing_s"], req["num_preemptions"], req["num_prefix_hit_tokens"],
            req["replica_id"])
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        lists = [c[order].tolist() for c in cols]
        for row in zip(*lists, strict=True):
            w.writerow(["" if isinstance(x, float) and x != x else
                        (f"{x:.6f}" if isinstance(x, float) else x) for x in row])
    os.replace(tmp, path)


# ---- catalog and perf -----------------------------------------------------------------
def cmd_perf(args: argparse.Namespace) -> int:
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.perf import (
        breakdown_table,
        breakdown_to_dict,
        kv_capacity_blocks,
        predict_breakdown,
    )

    if args.decode_batch is not None and args.context is None:
        raise FleetsimInputError("--context", None, "a decode step needs --context C "
                                 "(KV tokens per request)")
    for name in ("prefill_tokens", "decode_batch", "context", "tp"):
        v = getattr(args, name)
        if v is not None and v < (0 if name == "context" else 1):
            raise FleetsimInputError(f"--{name.replace('_', '-')}", v, "must be a positive integer")
    model = get_model(args.model)
    gpu = get_gpu(args.gpu, args.gpu_catalog)
    kv_capacity_blocks(model, gpu, args.tp, 16)  # a shape whose weights do not fit is an error
    b = predict_breakdown(model, gpu, args.tp, prefill_tokens=args.prefill_tokens,
                          context_tokens=args.context or 0, decode_batch=args.decode_batch,
                          backend=args.backend)
    if args.json:
        print(json.dumps(breakdown_to_dict(b), indent=2))
    else:
        Console().print(breakdown_table(b))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from fleetsim.models import list_models

    models = list_models()
    if args.json:
        print(json.dumps([_model_row(m) for m in models], indent=2))
        return 0
    table = Table(title="models")
    for col in ("name", "params (B)", "layers", "hidden", "heads/kv", "experts (active)",
                "attention", "context"):
        table.add_column(col)
    for m in models:
        r = _model_row(m)
        table.add_row(r["name"], f"{r['params_b']:.1f}", str(r["num_layers"]),
                      str(r["hidden_size"]), f"{r['num_attention_heads']}/{r['num_kv_heads']}",
                      f"{r['num_experts']} ({r['num_experts_per_token']})" if r["num_experts"]
                      else "-", r["attention"], f"{r['max_context_tokens']:,}")
    Console().print(table)
    return 0


def _model_row(m: Any) -> dict[str, Any]:
    return {
        "name": m.name, "params_b": m.num_params / 1e9, "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads, "num_experts": m.num_experts,
        "num_experts_per_token": m.num_experts_per_token,
        "attention": "MLA" if m.uses_mla else ("GQA" if m.num_kv_heads < m.num_attention_heads
                                                else "MHA"),
        "max_context_tokens": m.max_context_tokens,
    }


def cmd_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from fleetsim.hardware import list_gpus

    gpus = list_gpus(args.catalog)
    if args.json:
        print(json.dumps([asdict(g) for g in gpus], indent=2))
        return 0
    table = Table(title="GPUs")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM TB/s", "NVLink GB/s",
                "net GB/s", "$/h", "measured tables"):
        table.add_column(col)
    for g in gpus:
        table.add_row(g.name, f"{g.peak_bf16_flops / 1e12:,.0f}", f"{g.peak_fp8_flops / 1e12:,.0f}",
                      f"{g.hbm_bytes / 1e9:,.0f}", f"{g.hbm_bw_bytes_per_s / 1e12:.2f}",
                      f"{g.nvlink_bw_bytes_per_s / 1e9:,.0f}",
                      f"{g.network_bw_bytes_per_s / 1e9:,.0f}", f"{g.price_per_hour_usd:.2f}",
                      g.aic_system or "none (roofline)")
    Console().print(table)
    return 0


def cmd_trace_info(args: argparse.Namespace) -> int:
    from fleetsim.workloads import trace_info

    info = trace_info(args.file)
    if args.json:
        print(json.dumps(info, indent=2, default=float))
        return 0
    table = Table(title=f"trace {args.file}")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in _flatten(info):
        table.add_row(key, _fmt(value) if isinstance(value, float) else str(value))
    Console().print(table)
    return 0


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        if isinstance(v, dict):
            rows.extend(_flatten(v, f"{prefix}{k}."))
        else:
            rows.append((f"{prefix}{k}", v))
    return rows


if __name__ == "__main__":
    sys.exit(main())
