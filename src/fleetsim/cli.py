"""The ``fleetsim`` command: parse arguments, build a config, run, print and write results.

Any ``FleetsimInputError`` becomes one line on stderr and exit code 2, with no traceback.
Results are written by ``fleetsim.results``: where they go is checked before the work, and
the folder is replaced as a set only after the run succeeded, so a failed or interrupted run
never clobbers earlier results. SIGTERM is handled like Ctrl-C (exit 130 / 143, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetsim.errors import FleetsimInputError
from fleetsim.formatting import fmt_number as _fmt
from fleetsim.output import add_format_flag, emit, output_format, print_table

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

EXIT_INPUT_ERROR = 2


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that half-written results are cleaned up."""


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_commands_needed(argv)).parse_args(argv)
    previous = _on_sigterm_raise()
    try:
        handler = getattr(args, "handler", None) or args.func
        with warnings.catch_warnings():
            # numpy's RuntimeWarnings (a mean of no finished requests, 0/0) are not messages
            # for the user: the NaN they leave is shown as "—" or empty, and strict JSON
            # output refuses it by name (inputs.to_json), so stderr keeps its one-line rule.
            warnings.simplefilter("ignore", RuntimeWarning)
            return int(handler(args) or 0)
    except FleetsimInputError as err:
        print(f"fleetsim: error: {_one_line(str(err))}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt:
        print("fleetsim: interrupted; earlier results are unchanged", file=sys.stderr)
        return 130
    except Terminated:
        print("fleetsim: terminated; earlier results are unchanged", file=sys.stderr)
        return 143
    except MemoryError:
        print("fleetsim: error: out of memory; simulate fewer requests (workload.max_requests)"
              " or a shorter window", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except BrokenPipeError:  # `fleetsim ... --json | head`: the reader left; stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _on_sigterm_raise() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def raise_terminated(signum: int, frame: Any) -> None:
        raise Terminated

    return signal.signal(signal.SIGTERM, raise_terminated)


def print_json(data: Any) -> None:
    """``data`` on stdout as strict JSON (no NaN or Infinity)."""
    from fleetsim.inputs import to_json

    print(to_json(data))


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``fleetsim`` parser: every command, or (``commands`` given) only those.

    Building every command imports every package that owns one (numpy, the reproductions,
    the servers...), about a second of start-up, so ``main`` builds only the command it was
    asked for; help and unknown commands get the full parser.
    """
    parser = argparse.ArgumentParser(
        prog="fleetsim",
        description="Simulate LLM serving on GPU clusters: latency, goodput and cost.",
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add in CORE_COMMANDS.items():
        if commands is None or name in commands:
            add(sub)
    _add_optional_commands(sub, commands)
    return parser


class _VersionAction(argparse.Action):
    """``--version``, with the line computed only when asked for (argparse's own action
    needs the text while the parser is built)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def _commands_needed(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The commands ``argv`` can reach: its command alone, none for a bare ``--version``,
    or None (all) for help, no command or an unknown one (argparse then lists them all)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None:
        top_help = any(a in ("-h", "--help") for a in argv)
        return () if "--version" in argv and not top_help else None
    known = {*CORE_COMMANDS, *(c for names in COMMAND_MODULES.values() for c in names)}
    return (command,) if command in known else None


def _add_run(sub: Any) -> None:
    from fleetsim.results import add_force_flag
    from fleetsim.vllm_json import add_vllm_json_flags
    from fleetsim.workloads.shorthand import add_workload_flags

    p = sub.add_parser("run", help="run a simulation (defaults: embedded Azure trace, "
                       "Llama-3.1-8B on one H100)")
    p.add_argument("config", nargs="?", help="TOML config file (optional)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set hardware.gpu=h200 (repeatable)")
    p.add_argument("--out", default=None,
                   help="results folder (default: results/<run name>, or results/<run name>-N "
                   "when that one holds results)")
    add_force_flag(p)
    add_format_flag(p)
    g = p.add_argument_group("model and hardware shorthands (win over --set of the same key)")
    g.add_argument("--model", default=None,
                   help="= --set model=NAME (a catalog name, a HF repo id or a config.json)")
    g.add_argument("--gpu", default=None, help="= --set hardware.gpu=NAME (see fleetsim gpus)")
    g.add_argument("--tp", default=None, metavar="N", help="= --set hardware.tp=N")
    g.add_argument("--pp", default=None, metavar="N",
                   help="= --set hardware.pp=N (pipeline stages; vLLM's -pp)")
    add_workload_flags(p)
    g = p.add_argument_group("evolving planner ([elastic] planner = evolve, docs/elastic.md)")
    g.add_argument("--llm-url", default=None, metavar="URL",
                   help="= --set elastic.planner.args.llm_url=URL: an OpenAI-compatible "
                   "endpoint (http://host:port/v1) that writes candidate policies")
    g.add_argument("--llm-model", default=None, metavar="NAME",
                   help="= --set elastic.planner.args.llm_model=NAME")
    p.add_argument("--vllm-json", metavar="FILE", default=None,
                   help="also write the result as `vllm bench serve` writes it (ms, its keys)")
    p.add_argument("--percentiles", default="99", metavar="P,P,...",
                   help="percentiles of the --vllm-json metrics (vLLM's "
                        "--metric-percentiles; default 99)")
    add_vllm_json_flags(p)
    p.set_defaults(handler=cmd_run)


def _add_perf(sub: Any) -> None:
    p = sub.add_parser("perf", help="predicted step time and its per-op breakdown")
    p.add_argument("--model", required=True)
    p.add_argument("--gpu", required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline stages: with N > 1, each stage's time, the sends between "
                   "stages and the step time the engine uses (docs/perf_model.md)")
    p.add_argument("--backend", default="auto", choices=("auto", "roofline"))
    p.add_argument("--gpu-catalog", default=None, help="TOML file with extra GPUs")
    p.add_argument("--prefill-tokens", type=int, help="one prefill chunk of N tokens")
    p.add_argument("--decode-batch", "--decode-seqs", dest="decode_batch", type=int,
                   help="a decode step of B requests; with --prefill-tokens, a mixed step")
    p.add_argument("--context", type=int, default=None,
                   help="tokens already in KV (prefill alone: before the chunk; decode: per "
                        "request)")
    p.add_argument("--prefill-context", type=int, default=None,
                   help="in a mixed step, tokens cached before the prefill chunk (default 0)")
    p.add_argument("--quantization", default=None, metavar="MODE",
                   help="weights/activations as vLLM's --quantization: fp8, fp8_block, int4_wo, "
                   "nvfp4, ... (fleetsim gpus lists each GPU's)")
    p.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE",
                   help="KV cache as vLLM's --kv-cache-dtype: auto (bf16) | bfloat16 | fp8")
    p.add_argument("--async-scheduling", action="store_true",
                   help="price the step as vLLM >= 0.14 runs it by default: the CPU cost "
                        "overlapped with the GPU (engine.async_scheduling)")
    add_format_flag(p)
    p.set_defaults(handler=cmd_perf)


def _add_models(sub: Any) -> None:
    p = sub.add_parser("models", help="list the model catalog")
    add_format_flag(p)
    p.set_defaults(handler=cmd_models)


def _add_gpus(sub: Any) -> None:
    p = sub.add_parser("gpus", help="list the GPU catalog")
    p.add_argument("--catalog", default=None, help="TOML file with extra GPUs")
    add_format_flag(p)
    p.set_defaults(handler=cmd_gpus)


def _add_trace(sub: Any) -> None:
    p = sub.add_parser("trace", help="inspect workload traces")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    q = tsub.add_parser("info", help="describe a trace file (or embedded:azure_conv_2023)")
    q.add_argument("file")
    add_format_flag(q)
    q.set_defaults(handler=cmd_trace_info)


def _add_config(sub: Any) -> None:
    p = sub.add_parser("config", help="the config reference: every key, its default and doc")
    p.add_argument("--dump", action="store_true",
                   help="print the full default config as TOML, each key with its doc")
    p.add_argument("--markdown", action="store_true",
                   help="print the reference as Markdown (docs/config.md is this output)")
    p.set_defaults(handler=cmd_config)


# Commands this module defines, in the order help lists them.
CORE_COMMANDS: dict[str, Callable[[Any], None]] = {
    "run": _add_run, "perf": _add_perf, "models": _add_models, "gpus": _add_gpus,
    "trace": _add_trace, "config": _add_config,
}

# Packages that own a command expose ``add_parser(subparsers)`` in a ``cli`` module; the
# parser they register sets ``handler`` to a function taking the parsed args. Each module is
# listed with the commands it registers, so that only the one asked for is imported
# (tests/unit/test_startup.py checks this list against what the modules register).
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "fleetsim.moe.cli": ("moe",),
    "fleetsim.search.cli": ("goodput", "slo-scale", "plan"),
    "fleetsim.sweep.cli": ("sweep",),
    "fleetsim.report.cli": ("report",),
    "fleetsim.repro.cli": ("repro",),
    "fleetsim.live.cli": ("emulate", "gateway", "load", "compare"),
    "fleetsim.rl.cli": ("rl",),
    "fleetsim.calibrate.cli": ("calibrate",),
}


def _add_optional_commands(sub: Any, commands: Collection[str] | None = None) -> None:
    import importlib

    for name, owned in COMMAND_MODULES.items():
        if commands is not None and not set(owned) & set(commands):
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name is not None and name.startswith(err.name):
                continue  # that package is not there (yet)
            raise
        module.add_parser(sub)


# ---- run ------------------------------------------------------------------------------
def version_line() -> str:
    from fleetsim.native import engine_build

    return f"fleetsim {engine_build()}"


def bench_date() -> str:
    """Now, as ``vllm bench serve`` dates its result (``%Y%m%d-%H%M%S``, local time); the
    front end reads the clock, the result builders take the date as given."""
    from datetime import datetime

    return datetime.now().strftime("%Y%m%d-%H%M%S")


def cmd_run(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config
    from fleetsim.results import check_out_dir, check_out_file, fresh_out_dir, write_run
    from fleetsim.vllm_json import parse_metrics, parse_percentiles, vllm_result
    from fleetsim.workloads.shorthand import workload_overrides

    fmt = output_format(args)
    # vLLM's benchmark result reports ITL: record it for --vllm-json.
    itl = ["engine.track_itl=true"] if args.vllm_json else []
    config = load_config(args.config, [*itl, *args.overrides, *hardware_overrides(args),
                                       *workload_overrides(args)])
    out = Path(args.out) if args.out else fresh_out_dir(Path("results") / (
        Path(args.config).stem if args.config else "default"))
    check_out_dir(out, force=args.force)
    percentiles = parse_percentiles(args.percentiles)
    parse_metrics(args.percentile_metrics)
    if args.vllm_json:
        check_out_file(Path(args.vllm_json), "--vllm-json")
    result = _run_with_progress(config, _progress_console())
    write_run(out, result.summary, result.config, result.records.requests, result.unfinished)
    if args.vllm_json:
        from fleetsim.inputs import to_json
        from fleetsim.results import write_file

        write_file(Path(args.vllm_json), to_json(vllm_result(
            result, percentiles, date=bench_date(), label=args.label,
            detailed=args.save_detailed,
            percentile_metrics=parse_metrics(args.percentile_metrics))) + "\n", "--vllm-json")
    emit(fmt, result.summary, lambda: summary_table(result.summary))
    warning = result.summary["overload"].get("warning")
    if warning:
        print(f"fleetsim: warning: {warning}", file=sys.stderr)
    if result.summary.get("num_unserved_skipped"):
        print(f"fleetsim: skipped {result.summary['num_unserved_skipped']} row(s) of the trace "
              f"that no server served (served: false)", file=sys.stderr)
    written = f"results written to {out}/ (summary.json, requests.csv, config.json)"
    if "elastic" in result.summary:
        written = written[:-1] + ", elastic_timeline.json)"
        if "evolution" in result.summary["elastic"]:
            written = written[:-1] + ", evolution_timeline.json)"
    if args.vllm_json:
        written += f"; vLLM-style result in {args.vllm_json}"
    print(written, file=sys.stderr if fmt != "table" else sys.stdout)
    return 0


def hardware_overrides(args: argparse.Namespace) -> list[str]:
    """The ``--set`` items that ``run --model/--gpu/--tp/--pp`` stand for. The names are
    checked where ``--set`` values are (the catalogs, when the config loads); ``--tp`` and
    ``--pp`` here, naming the flag."""
    out = []
    if args.model is not None:
        out.append(f"model={json.dumps(args.model)}")
    if args.gpu is not None:
        out.append(f"hardware.gpu={json.dumps(args.gpu)}")
    for flag, what in (("tp", "GPUs per replica"), ("pp", "pipeline stages")):
        value = getattr(args, flag, None)
        if value is None:
            continue
        try:
            n = int(value)
        except ValueError:
            raise FleetsimInputError(f"--{flag}", value, "expected an integer >= 1, e.g. "
                                     f"--{flag} 2") from None
        if n < 1:
            raise FleetsimInputError(f"--{flag}", value, f"must be >= 1 ({what})")
        out.append(f"hardware.{flag}={n}")
    for flag in ("llm_url", "llm_model"):  # the evolving planner's LLM proposer
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"elastic.planner.args.{flag}={json.dumps(value)}")
    return out


def _progress_console() -> Console | None:
    """rich's console on stderr when its progress bar can show there, else None.

    rich.console costs about 50 ms of a short run's start-up, so a pipe or a file (the tests,
    scripts, ``--format json``) does not import it, unless rich is told to treat it as a
    terminal (``FORCE_COLOR``, ``TTY_COMPATIBLE``): then rich decides, as before.
    """
    if not sys.stderr.isatty() and not {"FORCE_COLOR", "TTY_COMPATIBLE"} & set(os.environ):
        return None
    from rich.console import Console

    console = Console(stderr=True)
    return console if console.is_terminal else None


def _run_with_progress(config: Any, console: Console | None) -> Any:
    from fleetsim.run import run

    if console is None:
        return run(config)
    from rich.progress import (
        BarColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("simulating"), BarColumn(), TaskProgressColumn(),
                  TextColumn("{task.fields[t]}"), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("sim", total=None, t="")

        def progress(now_s: float, first_s: float = 0.0, last_s: float = 0.0) -> None:
            # Arrivals drive the bar: the share of the arrivals' span simulated so far.
            span = last_s - first_s
            if span > 0:
                done = min(max(now_s - first_s, 0.0), span)
                bar.update(task, total=span, completed=done,
                           t=f"{now_s:,.0f} of {last_s:,.0f} simulated s of arrivals"
                           if now_s <= last_s else f"draining, {now_s:,.0f} simulated s")
            else:
                bar.update(task, t=f"{now_s:,.0f} simulated s")

        return run(config, progress=progress)


ITL_OFF_HINT = "¹ ITL not recorded: turn it on with --set engine.track_itl=true (or --vllm-json)"


def summary_table(s: dict[str, Any]) -> Table:
    """The run summary as a table: latency percentiles, then throughput and SLO figures."""
    from rich.table import Table

    from fleetsim.formatting import hardware_label

    table = Table(title=f"{s['model']} on {hardware_label(s)} — {s['workload']}")
    table.add_column("metric")
    for col in ("mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"),
                       ("itl_s", "ITL, all gaps (s)"), ("e2e_s", "E2E (s)"),
                       ("queueing_s", "queueing (s)")):
        d = s[key]
        if key == "itl_s" and not d.get("num_gaps"):
            # ITL costs a record per token gap, so it is off by default: say how to turn it on
            label += " ¹"
        table.add_row(label, *(_fmt(d[c]) for c in ("mean", "p50", "p90", "p99")))
    thr, slo = s["throughput"], s["slo"]
    kv = s["kv_cache"]
    rows = [
        ("requests finished", f"{s['num_finished']:,} / {s['num_requests']:,}"),
        ("throughput (req/s)", _fmt(thr["requests_per_s"])),
        ("throughput (output tok/s)", _fmt(thr["output_tokens_per_s"])),
        ("throughput (input tok/s)", _fmt(thr["input_tokens_per_s"])),
        (f"SLO attainment (TTFT≤{slo['ttft_s']:g}s, TPOT≤{slo['tpot_s']:g}s)",
         f"{100 * slo['attainment']:.1f}%"),
        ("SLO-meeting rate at this load (req/s)", _fmt(slo["goodput_requests_per_s"])),
        ("KV blocks (all replicas)", f"{kv['num_blocks']:,}"),
        ("KV cache used (mean)", f"{100 * kv['mean_used_fraction']:.1f}%"),
        ("prefix-cache hit rate", f"{100 * kv['prefix_hit_rate']:.1f}%"),
        ("GPU busy (a step running)", f"{100 * s['gpu_busy_fraction']:.1f}%"),
        ("mean batch (requests / tokens per step)",
         f"{s['batch']['mean_running']:.1f} / {s['batch']['mean_tokens_per_step']:,.0f}"),
        ("preemptions", f"{s['num_preemptions']:,}"),
    ]
    fit = s.get("workload_fit") or {}
    if fit.get("num_over_long"):
        rows.append((f"over-long requests ({fit['over_long']}, context "
                     f"{fit['max_context_tokens']:,})", f"{fit['num_over_long']:,}"))
    elastic = s.get("elastic")
    if elastic is not None:
        rows.append(("elastic: changes / plans / requeued",
                     f"{elastic['num_changes']:,} / {elastic['num_plans']:,} / "
                     f"{elastic['num_requeued']:,}"))
        rows.append(("elastic: GPU-seconds held (USD)",
                     f"{elastic['gpu_seconds']:,.0f} ({elastic['usd']:,.2f})"))
    for label, value in rows:
        table.add_row(label, value, "", "", "")
    caption = f"fleetsim {s['engine_build']}" if s.get("engine_build") else ""
    if not s["itl_s"].get("num_gaps"):
        caption = f"{ITL_OFF_HINT}\n{caption}"
    warning = (s.get("overload") or {}).get("warning")
    if warning:
        caption = f"WARNING: {warning}\n{caption}"
    table.caption = caption or None
    return table


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

    if args.prefill_tokens is None and args.decode_batch is None:
        raise FleetsimInputError("--prefill-tokens", None, "give --prefill-tokens N, "
                                 "--decode-batch B --context C, or both (a mixed step)")
    if args.decode_batch is not None and args.context is None:
        raise FleetsimInputError("--context", None, "a decode step needs --context C "
                                 "(KV tokens per request)")
    if args.prefill_context is not None and (args.prefill_tokens is None
                                             or args.decode_batch is None):
        raise FleetsimInputError("--prefill-context", args.prefill_context,
                                 "is for mixed steps (--prefill-tokens with --decode-batch); "
                                 "a prefill alone takes --context")
    from fleetsim.inputs import MAX_TOKENS, check_number

    for name, lo, hi in (("prefill_tokens", 1, MAX_TOKENS), ("decode_batch", 1, MAX_TOKENS),
                         ("context", 0, MAX_TOKENS), ("prefill_context", 0, MAX_TOKENS),
                         ("tp", 1, 1024), ("pp", 1, 1024)):
        v = getattr(args, name)
        if v is not None:
            check_number(v, f"--{name.replace('_', '-')}", lo=lo, hi=hi, integer=True)
    from fleetsim.models.quantization import quantize
    from fleetsim.perf.breakdown import check_quantization

    model = get_model(args.model)
    gpu = get_gpu(args.gpu, args.gpu_catalog)
    try:
        model = quantize(model, args.quantization, args.kv_cache_dtype)
        check_quantization(model, gpu)
    except FleetsimInputError as err:  # name the flag, as the other checks here do
        flag = "--kv-cache-dtype" if "kv_cache_dtype" in err.where else "--quantization"
        raise FleetsimInputError(flag, err.value, err.fix) from None
    if args.tp > gpu.num_gpus_per_node:
        raise FleetsimInputError("--tp", args.tp, f"a {gpu.name} node has "
                                 f"{gpu.num_gpus_per_node} GPUs; tensor parallelism stays in one")
    block_size = 16
    if args.pp > 1:
        return _perf_pipeline(args, model, gpu, block_size)
    # a shape whose weights do not fit is an error; so is a step whose KV does not
    capacity = kv_capacity_blocks(model, gpu, args.tp, block_size) * block_size
    _check_perf_step(args, model.name, model.max_context_tokens, capacity, gpu.name, block_size)
    b = predict_breakdown(model, gpu, args.tp, prefill_tokens=args.prefill_tokens,
                          context_tokens=args.context or 0, decode_batch=args.decode_batch,
                          prefill_context_tokens=args.prefill_context, backend=args.backend,
                          async_scheduling=args.async_scheduling)
    emit(output_format(args), breakdown_to_dict(b), lambda: breakdown_table(b))
    return 0


def _perf_pipeline(args: argparse.Namespace, model: Any, gpu: Any, block_size: int) -> int:
    """``fleetsim perf --pp N``: the step's stages, sends and period (perf/pipeline_breakdown)."""
    from fleetsim.perf.pipeline import check_pp, pipeline_kv_capacity_blocks
    from fleetsim.perf.pipeline_breakdown import (
        pipeline_breakdown_table,
        pipeline_breakdown_to_dict,
        predict_pipeline_breakdown,
    )

    try:
        check_pp(model, gpu, args.tp, args.pp)
        capacity = pipeline_kv_capacity_blocks(model, gpu, args.tp, args.pp,
                                               block_size) * block_size
    except FleetsimInputError as err:  # name the flag, as the other checks here do
        raise FleetsimInputError(f"--{err.where}", err.value, err.fix) from None
    _check_perf_step(args, model.name, model.max_context_tokens, capacity, gpu.name, block_size)
    b = predict_pipeline_breakdown(model, gpu, args.tp, args.pp,
                                   prefill_tokens=args.prefill_tokens,
                                   context_tokens=args.context or 0,
                                   decode_batch=args.decode_batch,
                                   prefill_context_tokens=args.prefill_context,
                                   backend=args.backend, async_scheduling=args.async_scheduling)
    emit(output_format(args), pipeline_breakdown_to_dict(b), lambda: pipeline_breakdown_table(b))
    return 0


def _check_perf_step(args: argparse.Namespace, model: str, max_context: int, capacity: int,
                     gpu: str, block_size: int) -> None:
    """The step must be one the model and the replica's KV memory can hold: the model's
    context window per request, and every request's KV blocks in the replica."""
    context = args.context or 0
    mixed = args.prefill_tokens is not None and args.decode_batch is not None
    prefill_ctx = (args.prefill_context or 0) if mixed else context
    blocks = 0
    if args.prefill_tokens is not None:
        per_request = prefill_ctx + args.prefill_tokens
        flag = "--prefill-tokens"
        if per_request > max_context:
            raise FleetsimInputError(flag, args.prefill_tokens,
                                     f"{prefill_ctx} + {args.prefill_tokens} tokens exceed the "
                                     f"{max_context:,}-token context of {model}; lower it")
        blocks += -(-per_request // block_size)
    if args.decode_batch is not None:
        if context + 1 > max_context:
            raise FleetsimInputError("--context", context,
                                     f"{context} + 1 tokens exceed the {max_context:,}-token "
                                     f"context of {model}; lower it")
        blocks += args.decode_batch * -(-(context + 1) // block_size)
        flag = "--decode-batch"
    kv_tokens = blocks * block_size
    if kv_tokens > capacity:
        raise FleetsimInputError(flag, getattr(args, flag[2:].replace("-", "_")),
                                 f"the step holds {kv_tokens:,} KV tokens but {gpu} x{args.tp} "
                                 f"has room for {capacity:,}; lower it or raise --tp")


def cmd_models(args: argparse.Namespace) -> int:
    from rich.table import Table

    from fleetsim.models import list_models

    models = list_models()
    fmt = output_format(args)
    if fmt != "table":
        emit(fmt, [_model_row(m) for m in models], list)
        return 0
    table = Table(title="models")
    for col in ("name", "Hugging Face id", "params (B)", "layers", "hidden", "heads/kv",
                "experts (active)", "attention", "context"):
        table.add_column(col)
    for m in models:
        r = _model_row(m)
        table.add_row(r["name"], r["hf_id"] or "-", f"{r['params_b']:.1f}", str(r["num_layers"]),
                      str(r["hidden_size"]), f"{r['num_attention_heads']}/{r['num_kv_heads']}",
                      f"{r['num_experts']} ({r['num_experts_per_token']})" if r["num_experts"]
                      else "-", r["attention"], f"{r['max_context_tokens']:,}")
    print_table(table)
    return 0


def hf_id_of(name: str) -> str | None:
    from fleetsim.models.catalog import HF_IDS

    return next((hf for hf, n in HF_IDS.items() if n == name.lower()), None)


def _model_row(m: Any) -> dict[str, Any]:
    return {
        "name": m.name, "hf_id": hf_id_of(m.name), "params_b": m.num_params / 1e9,
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
        "num_kv_heads": m.num_kv_heads, "num_experts": m.num_experts,
        "num_experts_per_token": m.num_experts_per_token,
        "attention": "MLA" if m.uses_mla else ("GQA" if m.num_kv_heads < m.num_attention_heads
                                                else "MHA"),
        "max_context_tokens": m.max_context_tokens,
    }


def cmd_gpus(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from fleetsim.hardware import list_gpus
    from fleetsim.models.quantization import modes_for

    gpus = list_gpus(args.catalog)
    fmt = output_format(args)
    if fmt != "table":
        emit(fmt, [{**asdict(g), "compute_formats": list(g.compute_formats),
                    "quantization_modes": list(modes_for(g.compute_formats))} for g in gpus],
             list)
        return 0
    table = Table(title="GPUs")
    for col in ("name", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GB", "HBM TB/s", "NVLink GB/s",
                "net GB/s", "$/h", "measured tables", "quantization modes"):
        table.add_column(col)
    for g in gpus:
        fp8 = ("no FP8 units" if g.peak_fp8_flops is None
               else f"{g.peak_fp8_flops / 1e12:,.0f}")
        table.add_row(g.name, f"{g.peak_bf16_flops / 1e12:,.0f}", fp8,
                      f"{g.hbm_bytes / 1e9:,.0f}", f"{g.hbm_bw_bytes_per_s / 1e12:.2f}",
                      f"{g.nvlink_bw_bytes_per_s / 1e9:,.0f}",
                      f"{g.network_bw_bytes_per_s / 1e9:,.0f}", f"{g.price_per_hour_usd:.2f}",
                      g.aic_system or "none (roofline)", ", ".join(modes_for(g.compute_formats)))
    print_table(table)
    return 0


def cmd_trace_info(args: argparse.Namespace) -> int:
    from fleetsim.workloads import trace_info

    info = trace_info(args.file)
    emit(output_format(args), info, lambda: trace_info_tables(args.file, info))
    return 0


def trace_info_tables(name: str, info: dict[str, Any]) -> list[Table]:
    """``trace info`` for people: labelled rows with units, one number format per kind
    (counts and tokens with thousands separators, shares in %), and a sentence where a
    statistic does not apply; ``--format json|csv`` keeps the raw keys."""
    from rich.table import Table

    def num(v: Any, spec: str = ",.0f", unit: str = "") -> str:
        return "–" if v is None else f"{v:{spec}}{unit}"

    table = Table(title=f"trace {name}")
    table.add_column("")
    table.add_column("value", justify="right")
    cv = info.get("iat_cv")
    rows = [("requests", num(info["rows"])),
            ("span, first to last arrival", num(info["span_s"], ",.1f", " s")),
            ("mean arrival rate", num(info["mean_rate_per_s"], ",.2f", " req/s")),
            ("inter-arrival CV (1 = Poisson)", num(cv, ".2f") if cv is not None
             else "– (fewer than 2 arrival gaps)")]
    if info.get("hash_block_tokens") is None:
        rows.append(("prefix-block hashes", "none in this trace"))
    else:
        rows += [("hash block", num(info["hash_block_tokens"], ",d", " tokens")),
                 ("hash blocks (distinct)", f"{num(info['num_hash_blocks'], ',d')} "
                                            f"({num(info['num_distinct_hash_blocks'], ',d')})"),
                 ("blocks seen before (any cache)",
                  num(_pct(info["hash_block_reuse_share"]), ".1f", "%")),
                 ("prefix-hit blocks (infinite prefix cache)",
                  num(_pct(info["prefix_hit_block_share"]), ".1f", "%"))]
    for label, value in rows:
        table.add_row(label, value)
    lengths = Table(title="tokens per request")
    lengths.add_column("")
    stats = ("mean", "p50", "p90", "p99", "max")
    for stat in stats:
        lengths.add_column(stat, justify="right")
    for kind in ("prompt", "output"):
        lengths.add_row(kind, *(num(info[f"{kind}_tokens_{s}"]) for s in stats))
    return [table, lengths]


def _pct(share: float | None) -> float | None:
    return None if share is None else 100 * share


def cmd_config(args: argparse.Namespace) -> int:
    from fleetsim.configdoc import config_markdown, dump_toml

    if args.markdown:
        print(config_markdown(), end="")
    else:
        print(dump_toml(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
