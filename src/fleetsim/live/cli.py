"""``fleetsim emulate``, ``fleetsim gateway``, ``fleetsim load`` and ``fleetsim compare``.

The servers listen on 127.0.0.1 unless ``--host`` says otherwise, print one line with their
URL when ready, and stop cleanly on SIGINT/SIGTERM (in-flight streams get ``--drain-s``
seconds to finish, then end with an error event); exit code 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number
from fleetsim.live.lag import DEFAULT_WARN_S
from fleetsim.vllm_json import add_vllm_json_flags
from fleetsim.workloads.shorthand import add_workload_flags

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
    from fleetsim.live.bench import (
        BACKENDS,
        check_writable,
        json_text,
        load_workload,
        result_paths,
        wait_ready,
        write_atomically,
        write_outcomes,
    )
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
        setup={"date": bench_date(), "endpoint_type": BACKENDS[args.endpoint],
               "backend": BACKENDS[args.endpoint], "label": args.label, "model_id": model,
               "tokenizer_id": model, "num_prompts": len(workload),
               "request_rate": request_rate,
               "burstiness": args.burstiness if args.burstiness is not None else 1.0,
               "max_concurrency": args.max_concurrency})
    if args.out:
        write_outcomes(args.out, outcomes, args.hash_block_tokens)
    for path in result_paths(args, result, model):
        write_atomically(path, json_text(result))
    if args.json:
        print_json(result)
    else:
        Console().print(load_table(result, args.url))
    return 0 if result["failed"] == 0 else 1


async def _load_with_progress(args: argparse.Namespace, workload: Any, model: str,
                              run_load: Any) -> Any:
    """``run_load`` under a progress bar out of N (on a terminal, unless --disable-tqdm)."""
    console = Console(stderr=True)
    kw = {"model": model, "endpoint": args.endpoint, "max_concurrency": args.max_concurrency,
          "timeout_s": args.timeout_s, "hash_block_tokens": args.hash_block_tokens,
          "lag_warn_s": args.lag_warn_ms / 1e3}
    if args.disable_tqdm or not console.is_terminal:
        return await run_load(workload, args.url, **kw)
    from fleetsim.output import progress_bar

    with progress_bar(console, "load") as bar:
        task = bar.add_task("load", total=len(workload), note="")
        return await run_load(workload, args.url, **kw,
                              on_done=lambda _: bar.advance(task))


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
