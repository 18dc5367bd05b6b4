"""What ``fleetsim load`` does around sending: wait for the server, build the requests (a
trace, or ``vllm bench serve``'s random/sharegpt datasets as ``fleetsim run`` builds them),
and write its files whole (a trace of what was measured, the result file as vLLM names it)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number
from fleetsim.workloads.shorthand import workload_overrides

BACKENDS = {"completions": "openai", "chat": "openai-chat"}
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
            overrides = sharegpt_overrides(args)
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


def sharegpt_overrides(args: argparse.Namespace) -> list[str]:
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


def result_paths(args: argparse.Namespace, result: dict[str, Any], model: str) -> list[Path]:
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
