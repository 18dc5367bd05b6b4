"""``fleetsim emulate``, ``fleetsim gateway``, ``fleetsim load`` and ``fleetsim compare``.

The servers listen on 127.0.0.1 unless ``--host`` says otherwise, print one line with their
URL when ready, and stop cleanly on SIGINT/SIGTERM (in-flight streams get ``--drain-s``
seconds to finish, then end with an error event); exit code 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number
from fleetsim.live.lag import DEFAULT_WARN_S
from fleetsim.vllm_json import add_vllm_json_flags
from fleetsim.workloads.shorthand import add_workload_flags, workload_overrides

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
PORT_HELP = "TCP port (default: one the system picks, printed when ready)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the live commands."""
    p = subparsers.add_parser("emulate", help="OpenAI-compatible server whose token timing "
                              "comes from the replica engine, in real time")
    p.add_argument("config", nargs="?", help="TOML config file (optional; engine, policy, "
                   "cluster as for fleetsim run)")
    p.add_argument("--config", dest="config_flag", default=None, help="same as the positional")
    p.add_argument("--model", default=None, help="model (default: the config's)")
    p.add_argument("--gpu", default=None, help="GPU (default: the config's)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set engine.max_running=64")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall second (default 1: real time)")
    p.add_argument("--served-model-name", default=None,
                   help="model name clients use (default: --model as given)")
    p.add_argument("--max-num-requests", type=int, default=1024,
                   help="requests in flight before 429 (default 1024)")
    p.add_argument("--record", default=None, metavar="FILE.jsonl",
                   help="write each finished request (engine timing) as a trace row")
    p.add_argument("--response-mode", choices=("filler", "echo", "random"), default="filler",
                   help="output text: filler words (default), the prompt's tokens echoed, or "
                   "random words (seeded by the request's seed, else its id)")
    _server_flags(p)
    p.set_defaults(handler=cmd_emulate)

    p = subparsers.add_parser("gateway", help="OpenAI-compatible proxy that routes to backends "
                              "with fleetsim's routers")
    p.add_argument("--backend", action="append", required=True, metavar="URL",
                   help="an OpenAI-compatible server, e.g. http://127.0.0.1:8001 (repeat)")
    p.add_argument("--router", default="least_loaded",
                   help="round_robin | least_loaded | power_of_two | prefix_affinity | "
                   "pkg.mod:Class (default least_loaded)")
    p.add_argument("--max-in-flight", type=int, default=1024,
                   help="requests in flight before 429 (default 1024)")
    p.add_argument("--max-attempts", type=int, default=3,
                   help="backends tried per request before giving up (default 3)")
    p.add_argument("--record", default=None, metavar="FILE.jsonl",
                   help="write the traffic served as a trace (fleetsim's JSONL)")
    p.add_argument("--seed", type=int, default=0, help="seed of random routers")
    p.add_argument("--health-check-interval-s", type=float, default=5.0,
                   help="seconds between active GET /health checks of each backend (default "
                   "5; 0: passive health only)")
    _server_flags(p)
    p.set_defaults(handler=cmd_gateway)

    p = subparsers.add_parser("load", help="send a trace's requests, or vllm bench serve's "
                              "random/sharegpt ones, to a server and report TTFT/TPOT/ITL/E2EL "
                              "(vLLM benchmark names and result file)")
    p.add_argument("trace", nargs="?", default=None,
                   help="trace file (any format fleetsim run reads) or embedded:NAME; "
                   "without it, --dataset-name's requests")
    p.add_argument("--url", "--base-url", dest="url", required=True,
                   help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: the server's first)")
    p.add_argument("--dataset-name", choices=("random", "sharegpt"), default=None,
                   help="vLLM's datasets without a trace: random (--isl/--osl tokens, "
                   "default 1024/128) or sharegpt (ShareGPT's lengths, embedded)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated requests "
                   "(the same flags and seed give fleetsim run the same requests)")
    p.add_argument("--rate-scale", type=float, default=1.0,
                   help="multiply a trace's arrival rate (default 1)")
    p.add_argument("--max-requests", type=int, default=None, help="send only the first N")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request (default 600)")
    p.add_argument("--ready-check-timeout-sec", type=float, default=600.0,
                   help="wait this long for the server to list a model before sending "
                   "(vLLM bench serve's flag; default 600, 0: ask once)")
    p.add_argument("--hash-block-tokens", type=int, default=16,
                   help="block of the prefix hashes written with --out (default 16)")
    p.add_argument("--out", default=None, metavar="FILE.jsonl",
                   help="write every request with its measured latencies (a trace)")
    p.add_argument("--json", action="store_true",
                   help="print the result (vLLM's result file) as JSON")
    p.add_argument("--metric-percentiles", "--percentiles", dest="percentiles",
                   default="90,99", metavar="P,P,...",
                   help="percentiles in the result, beside mean, median and std (default "
                   "90,99)")
    p.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS",
                   help="SLOs for request_goodput, e.g. ttft:200 tpot:50 (vLLM's --goodput)")
    p.add_argument("--save-result", action="store_true",
                   help="write the result file as vLLM names it "
                   "(LABEL-RATEqps[-concurrencyC]-MODEL-DATE.json)")
    p.add_argument("--result-dir", default=None, help="folder of --save-result's file")
    p.add_argument("--result-filename", default=None, help="name of --save-result's file")
    p.add_argument("--vllm-json", default=None, metavar="FILE",
                   help="write the result file here (as fleetsim run --vllm-json)")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    add_vllm_json_flags(p)
    add_workload_flags(p)
    _lag_flag(p)
    p.set_defaults(handler=cmd_load)

    p = subparsers.add_parser("compare", help="live latency percentiles against fleetsim run's")
    p.add_argument("live", help="trace with measured latencies (gateway --record, load --out)")
    p.add_argument("sim_dir", help="results folder of fleetsim run on the same traffic")
    p.add_argument("--engine", action="append", default=None, metavar="EMULATED.jsonl",
                   help="what fleetsim emulate --record wrote for the same traffic (repeat "
                   "for each backend): also measure the front end (live TTFT - engine TTFT "
                   "per request)")
    p.add_argument("--json", action="store_true")
    _lag_flag(p)
    p.set_defaults(handler=cmd_compare)


def _server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 "
                   "or :: for every interface, as vllm serve --host)")
    p.add_argument("--port", type=int, default=0, help=PORT_HELP)
    p.add_argument("--hash-block-tokens", type=int, default=16,
                   help="tokens per prefix-hash block (default 16, vLLM's block size)")
    p.add_argument("--max-body-bytes", type=int, default=8 * 2**20,
                   help="largest request body (default 8 MiB; larger: 400)")
    p.add_argument("--request-timeout-s", type=float, default=600.0,
                   help="longest a request may take (default 600)")
    p.add_argument("--drain-s", type=float, default=10.0,
                   help="on SIGINT/SIGTERM, seconds in-flight streams get to finish")
    p.add_argument("--log-level", default="warning",
                   help=f"uvicorn's: {' | '.join(LOG_LEVELS)} (default warning)")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="count text prompts with this Hugging Face tokenizer.json (or the "
                   "model folder holding one; needs the tokenizers package; default: the "
                   "documented counting rule, docs/live.md)")
    _lag_flag(p)


def _lag_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lag-warn-ms", type=float, default=1e3 * DEFAULT_WARN_S,
                   help="warn when the event loop falls this far behind real time (default "
                   f"{1e3 * DEFAULT_WARN_S:g}; the lag is also written to --record/--out rows)")


def _check_server_flags(args: argparse.Namespace) -> None:
    check_number(args.port, "--port", lo=0, hi=65535, integer=True)
    check_number(args.hash_block_tokens, "--hash-block-tokens", lo=1, hi=2**20, integer=True)
    check_number(args.max_body_bytes, "--max-body-bytes", lo=1024, hi=2**31, integer=True)
    check_number(args.request_timeout_s, "--request-timeout-s", lo=0.001, hi=86400.0)
    check_number(args.drain_s, "--drain-s", lo=0.0, hi=3600.0)
    check_number(args.lag_warn_ms, "--lag-warn-ms", lo=0.1, hi=1e6)
    if args.log_level.lower() not in LOG_LEVELS:
        raise FleetsimInputError("--log-level", args.log_level, f"use one of "
                                 f"{', '.join(LOG_LEVELS)}")
    args.log_level = args.log_level.lower()
    from fleetsim.live.tokens import load_tokenizer

    args.tokenize = load_tokenizer(args.tokenizer)  # fails now on a bad one


def cmd_emulate(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config
    from fleetsim.live.emulate import EmulatedBackend
    from fleetsim.live.engine import LiveEngine

    _check_server_flags(args)
    check_number(args.speed, "--speed", lo=1e-3, hi=1e4)
    check_number(args.max_num_requests, "--max-num-requests", lo=1, hi=10**7, integer=True)
    if args.config and args.config_flag:
        raise FleetsimInputError("--config", args.config_flag, "give the config file once")
    overrides = list(args.overrides)
    for flag, key in (("model", "model"), ("gpu", "hardware.gpu"), ("tp", "hardware.tp")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}" if flag == "tp" else f'{key}="{value}"')
    config = load_config(args.config or args.config_flag, overrides)
    engine = LiveEngine(config, speed=args.speed, hash_block_tokens=args.hash_block_tokens,
                        max_num_requests=args.max_num_requests)
    pools = engine.pool_infos
    what = ", ".join(f"{p['num_replicas']}x {p['gpu']} tp{p['tp']} ({p['num_kv_blocks']:,} "
                     f"KV blocks)" for p in pools)

    def make_app() -> Any:
        return EmulatedBackend(engine, served_model=args.served_model_name or args.model,
                               max_body_bytes=args.max_body_bytes,
                               request_timeout_s=args.request_timeout_s, record=args.record,
                               tokenizer=args.tokenize, lag_warn_s=args.lag_warn_ms / 1e3,
                               response_mode=args.response_mode)

    return _run_server(make_app, args, f"emulating {engine.model.name} on {what}, speed "
                       f"{args.speed:g}x")


def cmd_gateway(args: argparse.Namespace) -> int:
    from fleetsim.live.gateway import Gateway, check_backends

    _check_server_flags(args)
    check_number(args.max_in_flight, "--max-in-flight", lo=1, hi=10**7, integer=True)
    check_number(args.max_attempts, "--max-attempts", lo=1, hi=100, integer=True)
    check_number(args.health_check_interval_s, "--health-check-interval-s", lo=0.0, hi=3600.0)
    backends = check_backends(args.backend)
    from fleetsim.policies.routing import make_router
    from fleetsim.registry import PolicySpec

    make_router(PolicySpec(name=args.router), "--router")  # fail now on a bad name

    def make_app() -> Any:
        return Gateway(backends, router=args.router, max_in_flight=args.max_in_flight,
                       max_attempts=args.max_attempts, record=args.record,
                       hash_block_tokens=args.hash_block_tokens,
                       max_body_bytes=args.max_body_bytes,
                       request_timeout_s=args.request_timeout_s, seed=args.seed,
                       tokenizer=args.tokenize, lag_warn_s=args.lag_warn_ms / 1e3,
                       health_check_interval_s=args.health_check_interval_s)

    return _run_server(make_app, args, f"routing with {args.router} over {len(backends)} "
                       f"backend(s)")


def _run_server(make_app: Any, args: argparse.Namespace, what: str) -> int:
    from fleetsim.live.server import bind, serve

    sock = bind(host=args.host, port=args.port)

    def ready(url: str) -> None:
        print(f"fleetsim {args.command}: {what}; listening on {url}", flush=True)

    async def main() -> None:
        await serve(make_app(), sock, drain_s=args.drain_s, on_ready=ready,
                    log_level=args.log_level)

    try:
        _run_async(main())
    except BaseException as err:
        # uvicorn re-raises the signal it handled once it has shut down: SIGINT as
        # KeyboardInterrupt, SIGTERM as the CLI's Terminated (by name: under ``python -m``
        # that class lives in __main__).
        if type(err).__name__ not in ("KeyboardInterrupt", "Terminated"):
            raise
    finally:
        sock.close()
    print(f"fleetsim {args.command}: stopped", file=sys.stderr, flush=True)
    return 0


def _run_async(coro: Any) -> Any:
    """Run ``coro`` on uvloop when it is installed (less latency per token), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def cmd_load(args: argparse.Namespace) -> int:
    from fleetsim.cli import bench_date, print_json
    from fleetsim.live.gateway import check_url
    from fleetsim.live.load import bench_json, run_load
    from fleetsim.vllm_json import parse_goodput, parse_metrics, parse_percentiles

    args.url = check_url("--url", args.url)
    check_number(args.rate_scale, "--rate-scale", lo=1e-6, hi=1e6)
    check_number(args.hash_block_tokens, "--hash-block-tokens", lo=1, hi=2**20, integer=True)
    check_number(args.timeout_s, "--timeout-s", lo=0.001, hi=86400.0)
    check_number(args.ready_check_timeout_sec, "--ready-check-timeout-sec", lo=0.0,
                 hi=86400.0)
    check_number(args.lag_warn_ms, "--lag-warn-ms", lo=0.1, hi=1e6)
    if args.max_requests is not None:
        check_number(args.max_requests, "--max-requests", lo=1, hi=10**8, integer=True)
    percentiles = parse_percentiles(args.percentiles)
    metrics = parse_metrics(args.percentile_metrics)
    goodput = parse_goodput(args.goodput)
    workload, request_rate = load_workload(args)
    for flag in ("out", "vllm_json"):
        if getattr(args, flag):
            check_writable(f"--{flag.replace('_', '-')}", getattr(args, flag))
    model = wait_ready(args.url, args.ready_check_timeout_sec, model=args.model)
    t0 = time.monotonic()
    outcomes = _run_async(_load_with_progress(args, workload, model, run_load))
    result = bench_json(
        outcomes, time.monotonic() - t0, percentiles=percentiles, percentile_metrics=metrics,
        goodput=goodput, detailed=args.save_detailed,
        setup={"date": bench_date(), "endpoint_type": _BACKENDS[args.endpoint],
               "backend": _BACKENDS[args.endpoint], "label": args.label, "model_id": model,
               "tokenizer_id": model, "num_prompts": len(workload),
               "request_rate": request_rate,
               "burstiness": args.burstiness if args.burstiness is not None else 1.0,
               "max_concurrency": args.max_concurrency})
    if args.out:
        write_outcomes(args.out, outcomes, args.hash_block_tokens)
    for path in _result_paths(args, result, model):
        write_atomically(path, json_text(result))
    if args.json:
        print_json(result)
    else:
        Console().print(load_table(result, args.url))
    return 0 if result["failed"] == 0 else 1


_BACKENDS = {"completions": "openai", "chat": "openai-chat"}
"""``--endpoint`` -> the name ``vllm bench serve --backend`` gives that endpoint."""


def load_workload(args: argparse.Namespace) -> tuple[Any, float | str | None]:
    """The requests to send and the result's ``request_rate`` (None for a trace): a trace
    as recorded (``--rate-scale``, ``--max-requests``, ``--num-prompts`` apply), or vLLM's
    ``random``/``sharegpt`` requests built as ``fleetsim run`` builds them from the same
    flags and seed."""
    from fleetsim.config import load_config
    from fleetsim.run import seed_streams
    from fleetsim.workloads import load_trace
    from fleetsim.workloads.config import build_workload
    from fleetsim.workloads.transforms import head, scale_rate

    if args.max_concurrency is not None:
        check_number(args.max_concurrency, "--max-concurrency", lo=1, hi=10**6, integer=True)
    if args.trace is not None and args.dataset_name is not None:
        raise FleetsimInputError("--dataset-name", args.dataset_name, "give a trace or a "
                                 "dataset, not both")
    if args.trace is None and args.dataset_name is None and args.isl is None:
        raise FleetsimInputError("trace", None, "give a trace file (or embedded:NAME), "
                                 "--dataset-name random|sharegpt, or --isl/--osl")
    check_number(args.seed, "--seed", lo=0, hi=2**63 - 1, integer=True)
    rate: float | str | None = None
    if args.trace is not None:
        overrides = [x for x in workload_overrides(args)
                     if not x.startswith("workload.max_concurrency")]
        workload = load_trace(args.trace)
        if any(x.startswith("workload.max_requests") for x in overrides):
            workload = head(workload, args.num_prompts)
    else:
        if args.dataset_name == "sharegpt":
            overrides = _sharegpt_overrides(args)
        else:
            if args.isl is None and args.osl is None:
                args.isl, args.osl = RANDOM_DEFAULT_LENS
            overrides = workload_overrides(args)
        config = load_config(None, [*overrides, f"seed={args.seed}"])
        workload = build_workload(config.workload, seed_streams(config.seed, (
            "workload", "routing"))["workload"])
        rate = "inf" if config.workload.arrival == "at_once" else config.workload.rate_per_s
    workload = scale_rate(workload, args.rate_scale)
    if args.max_requests is not None:
        workload = head(workload, args.max_requests)
    return workload, rate


RANDOM_DEFAULT_LENS = (1024, 128)
"""``vllm bench serve --dataset-name random``'s default input and output lengths."""


def _sharegpt_overrides(args: argparse.Namespace) -> list[str]:
    """ShareGPT's prompt and output lengths (the embedded ``sharegpt_lengths``, as vLLM's
    sharegpt dataset takes each conversation's first turn), ``--osl`` fixing the output;
    arrivals as for ``random``."""
    if args.isl is not None:
        raise FleetsimInputError("--isl", args.isl, "sharegpt takes its prompt lengths from "
                                 "the data; use --dataset-name random for fixed ones")
    osl = args.osl
    # The arrival flags as for random (lengths replaced below).
    arrivals = argparse.Namespace(**{**vars(args), "isl": 1, "osl": 1})
    out = [x for x in workload_overrides(arrivals) if not x.startswith(
        ("workload.prompt_tokens", "workload.output_tokens"))]
    empirical = "{{kind='empirical', path='embedded:sharegpt_lengths', column='{}'}}"
    out.append("workload.prompt_tokens=" + empirical.format("num_prefill_tokens"))
    out.append("workload.output_tokens=" + (f"{{kind='fixed', value={osl}}}" if osl else
                                            empirical.format("num_decode_tokens")))
    return out


async def _load_with_progress(args: argparse.Namespace, workload: Any, model: str,
                              run_load: Any) -> Any:
    """``run_load`` under a progress bar out of N (on a terminal, unless --disable-tqdm)."""
    console = Console(stderr=True)
    kw = {"model": model, "endpoint": args.endpoint, "max_concurrency": args.max_concurrency,
          "timeout_s": args.timeout_s, "hash_block_tokens": args.hash_block_tokens,
          "lag_warn_s": args.lag_warn_ms / 1e3}
    if args.disable_tqdm or not console.is_terminal:
        return await run_load(workload, args.url, **kw)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn("load"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("load", total=len(workload))
        return await run_load(workload, args.url, **kw,
                              on_done=lambda _: bar.advance(task))


def _result_paths(args: argparse.Namespace, result: dict[str, Any], model: str) -> list[Path]:
    """Where the result file goes: --vllm-json, and --save-result's name as vLLM's."""
    paths = [Path(args.vllm_json)] if args.vllm_json else []
    if args.save_result:
        concurrency = (f"-concurrency{args.max_concurrency}"
                       if args.max_concurrency is not None else "")
        rate = result["request_rate"] if result["request_rate"] is not None else "trace"
        name = args.result_filename or (f"{args.label or result['backend']}-{rate}qps"
                                        f"{concurrency}-{model.split('/')[-1]}-"
                                        f"{result['date']}.json")
        folder = Path(args.result_dir) if args.result_dir else Path(".")
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(folder / name)
    return paths


def json_text(result: dict[str, Any]) -> str:
    from fleetsim.inputs import to_json

    return to_json(result) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """``text`` to a temporary file renamed over ``path`` (an interruption leaves an earlier
    file whole)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_writable(flag: str, path: str) -> None:
    """Fail now (one line) if ``path`` cannot be written later; leaves it as it is."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir() or not parent.is_dir() or not os.access(parent, os.W_OK) or \
            (target.exists() and not os.access(target, os.W_OK)):
        raise FleetsimInputError(flag, path, "cannot write it (check the folder exists and "
                                 "is writable)")


def write_outcomes(path: str, outcomes: list[Any], hash_block_tokens: int) -> None:
    """The measured requests as a trace, written whole to a temporary file then renamed
    over ``path``: an interrupted load leaves an earlier file as it was."""
    import json
    import tempfile

    from fleetsim.live.trace import trace_row

    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for o in outcomes:
                row = trace_row(arrival_s=o.arrival_s, num_prompt_tokens=o.num_prompt_tokens,
                                num_output_tokens=o.num_output_tokens, hash_ids=o.hash_ids,
                                ttft_s=o.ttft_s if o.ok else None,
                                tpot_s=o.tpot_s if o.ok and o.num_output_tokens > 1 else None,
                                e2e_s=o.e2e_s if o.ok else None,
                                status="ok" if o.ok else "error",
                                hash_block_tokens=hash_block_tokens,
                                request_id=o.request_id, lag_s=o.lag_s)
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


READY_POLL_S = 0.25
"""Pause between readiness checks: short, since servers that start together (the README's
block) are usually up within a few seconds."""


def wait_ready(url: str, timeout_s: float, *, model: str | None = None) -> str:
    """Wait until ``url`` lists a model (``GET /v1/models``), as ``vllm bench serve
    --ready-check-timeout-sec`` waits for its server; return ``model`` or the first listed.

    A gateway whose backends are still starting answers 503 or an empty list: both mean
    "not yet". After ``timeout_s`` (0: one try) fail with one line naming the last answer."""
    import httpx

    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            r = httpx.get(url.rstrip("/") + "/v1/models", timeout=10.0)
            if r.status_code == 200:
                data = r.json()["data"]
                if data:
                    return model or str(data[0]["id"])
                last = "it lists no model yet"
            else:
                last = f"HTTP {r.status_code}"
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as err:
            last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if time.monotonic() + READY_POLL_S > deadline:
            raise FleetsimInputError("--url", url, f"not ready after {timeout_s:g} s ({last});"
                                     f" start the server, check the URL or raise "
                                     f"--ready-check-timeout-sec") from None
        if not said:
            print(f"fleetsim load: waiting up to {timeout_s:g} s for {url} to be ready",
                  file=sys.stderr, flush=True)
            said = True
        time.sleep(READY_POLL_S)


def load_table(r: dict[str, Any], url: str) -> Table:
    """The result laid out as ``vllm bench serve`` prints it (the statistics it carries)."""
    t = Table(title=f"Serving Benchmark Result ({url})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("Successful requests", f"{r['completed']}"), ("Failed requests", f"{r['failed']}"),
            ("Benchmark duration (s)", f"{r['duration']:.2f}"),
            ("Total input tokens", f"{r['total_input_tokens']}"),
            ("Total generated tokens", f"{r['total_output_tokens']}"),
            ("Request throughput (req/s)", f"{r['request_throughput']:.2f}")]
    if r.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", f"{r['request_goodput']:.2f}"))
    rows += [("Output token throughput (tok/s)", f"{r['output_throughput']:.2f}"),
             ("Peak output token throughput (tok/s)", f"{r['max_output_tokens_per_s']:.2f}"),
             ("Peak concurrent requests", f"{r['max_concurrent_requests']}"),
             ("Total Token throughput (tok/s)", f"{r['total_token_throughput']:.2f}")]
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}
    for key, name in names.items():
        for k, v in r.items():
            m = re.fullmatch(rf"(mean|median|p[0-9.]+)_{key}_ms", k)
            if m and isinstance(v, int | float):
                label = m.group(1).capitalize() if m.group(1)[0] == "m" else \
                    m.group(1).upper()
                rows.append((f"{label} {name} (ms)", f"{v:.2f}"))
    for label, value in rows:
        t.add_row(label, value)
    for err in r.get("error_messages", ()):
        t.add_row("error", err[:100])
    return t


def cmd_compare(args: argparse.Namespace) -> int:
    from fleetsim.cli import print_json
    from fleetsim.live.compare import (
        MIN_MATCHED_SHARE,
        STATS,
        compare,
        frontend_overhead,
        lag_report,
    )

    check_number(args.lag_warn_ms, "--lag-warn-ms", lo=0.1, hi=1e6)
    warn_s = args.lag_warn_ms / 1e3
    result = compare(args.live, args.sim_dir)
    result["lag_s"] = {"live": lag_report(args.live, warn_s)}
    if args.engine is not None:
        result["frontend_overhead_s"] = frontend_overhead(args.live, args.engine)
        for i, path in enumerate(args.engine):
            result["lag_s"][f"engine {i + 1}" if len(args.engine) > 1 else "engine"] = \
                lag_report(path, warn_s)
    warnings = _compare_warnings(result, MIN_MATCHED_SHARE)
    result["warnings"] = warnings
    if args.json:
        print_json(result)
        return 0
    t = Table(title=f"live ({result['num_live']} requests) vs predicted "
              f"({result['num_predicted']})")
    for col in ("latency (ms)", "live", "predicted", "diff"):
        t.add_column(col, justify="left" if col.startswith("latency") else "right")
    for k in ("ttft_s", "tpot_s", "e2e_s"):
        for s in STATS:
            a, b, e = (result[k]["live"][s], result[k]["predicted"][s], result[k]["error"][s])
            t.add_row(f"{k[:-2].upper()} {s}", _ms(a), _ms(b),
                      f"{100 * e:+.1f}%" if e is not None else "-")
    Console().print(t)
    for who, lag in result["lag_s"].items():
        if lag["num_rows"]:
            print(f"event-loop lag of the {who} trace's writer: p50 {_ms(lag['p50'])} ms, "
                  f"p99 {_ms(lag['p99'])} ms, max {_ms(lag['max'])} ms")
    fe = result.get("frontend_overhead_s")
    if fe is not None:
        print(f"front end (live TTFT - engine TTFT, {fe['num_matched']} of {fe['num_live']} "
              f"requests matched by {fe['matched_by']}): "
              + ", ".join(f"{s} {_ms(fe[s])} ms" for s in STATS)
              + f"; to include it: --set cluster.frontend_overhead_s={fe['mean']:.4f}")
    for line in warnings:
        print(f"fleetsim compare: warning: {line}", file=sys.stderr)
    return 0


def _compare_warnings(result: dict[str, Any], min_share: float) -> list[str]:
    out = []
    for who, lag in result["lag_s"].items():
        if lag["num_rows"] and lag["num_over"]:
            out.append(f"the {who} trace's writer ran up to {_ms(lag['max'])} ms behind real "
                       f"time ({lag['num_over']} of {lag['num_rows']} requests over "
                       f"{_ms(lag['warn_s'])} ms): its latencies include CPU starvation, "
                       f"which the simulator does not model")
    fe = result.get("frontend_overhead_s")
    if fe is not None and fe["matched_share"] < min_share:
        out.append(f"only {fe['num_matched']} of {fe['num_live']} live requests matched the "
                   f"engine trace ({100 * fe['matched_share']:.0f}% < "
                   f"{100 * min_share:.0f}%): the front-end figure may not describe the traffic")
    return out


def _ms(x: float | None) -> str:
    return f"{1000 * x:.1f}" if x is not None else "-"
