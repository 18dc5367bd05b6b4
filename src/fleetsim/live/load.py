"""``fleetsim load``: replay a trace's arrivals against an OpenAI-compatible server.

Each row is sent at its arrival time (divided by ``rate_scale``) by an async client, as a
streamed request with the row's prompt length and ``max_tokens`` = its output length
(``ignore_eos``/``min_tokens`` set for vLLM). Completions requests carry the prompt as token
ids, so any server counts exactly the trace's tokens; rows that share ``hash_ids`` share
real token prefixes (``tokens.synthetic_prompt_ids``). The report uses the names and units of
vLLM's ``benchmark_serving``: TTFT (first content chunk), TPOT ((E2E - TTFT)/(output - 1)),
ITL (gaps between content chunks) and E2EL, in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from numpy.typing import NDArray

from fleetsim.live.lag import DEFAULT_WARN_S, LagMonitor
from fleetsim.live.protocol import REQUEST_ID_HEADER
from fleetsim.live.tokens import (
    DEFAULT_HASH_BLOCK_TOKENS,
    count_tokens,
    prefix_hashes,
    synthetic_prompt_ids,
    synthetic_prompt_text,
)
from fleetsim.workloads.workload import Workload


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it (seconds; NaN when not reached)."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens_asked: int
    hash_ids: tuple[int, ...] = ()
    request_id: str = ""
    ok: bool = False
    error: str = ""
    ttft_s: float = float("nan")
    e2e_s: float = float("nan")
    num_output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    sent_s: float = float("nan")
    """When it was sent, in seconds from the start of the load."""
    text_parts: list[str] = field(default_factory=list)
    """The generated text, chunk by chunk."""
    lag_s: float = 0.0
    """The load generator's worst lag while this request was due or in flight: how late it
    was sent, or its event loop's lag (``lag.py``), whichever is larger."""

    @property
    def tpot_s(self) -> float:
        n = self.num_output_tokens
        return (self.e2e_s - self.ttft_s) / (n - 1) if self.ok and n > 1 else float("nan")


def build_body(workload: Workload, i: int, *, model: str, endpoint: str,
               hash_block_tokens: int) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Request body of row ``i``, and the prefix hashes of its prompt."""
    n = int(workload.num_prompt_tokens[i])
    out = int(workload.num_output_tokens[i])
    common = {"model": model, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
              "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        text = _chat_text(n, i)
        return {**common, "messages": [{"role": "user", "content": text}]}, ()
    ids = synthetic_prompt_ids(n, workload.hash_ids[i] if workload.hash_ids else (),
                               workload.hash_block_tokens, seed=i)
    return {**common, "prompt": ids}, prefix_hashes(ids, hash_block_tokens)


def _chat_text(num_tokens: int, seed: int) -> str:
    """Content whose chat prompt (``protocol._chat_prompt``) has ``num_tokens`` tokens."""
    overhead = count_tokens("<|user|>\nabcd\n<|assistant|>\n") - 1
    return synthetic_prompt_text(max(1, num_tokens - overhead), seed).lstrip()


JSON_HEADERS = {"Content-Type": "application/json"}


async def send_one(client: httpx.AsyncClient, url: str, body: bytes, outcome: Outcome) -> None:
    """Send one streamed request (``body``: its JSON, encoded ahead so that the client's
    own encoding is not counted in the server's latency) and fill ``outcome``."""
    t0 = time.monotonic()
    last = t0
    headers = {**JSON_HEADERS, REQUEST_ID_HEADER: outcome.request_id}
    try:
        async with client.stream("POST", url, content=body, headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                outcome.error = f"HTTP {resp.status_code}: {text[:200]}"
                return
            num_chunks = 0
            usage: int | None = None
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    outcome.error = f"stream error: {obj['error'].get('message', obj['error'])}"
                    return
                if obj.get("usage"):
                    usage = obj["usage"].get("completion_tokens")
                text = _content(obj)
                if text:
                    outcome.text_parts.append(text)
                    now = time.monotonic()
                    if num_chunks == 0:
                        outcome.ttft_s = now - t0
                    else:
                        outcome.itl_s.append(now - last)
                    last = now
                    num_chunks += 1
            outcome.e2e_s = time.monotonic() - t0
            outcome.num_output_tokens = usage if usage is not None else num_chunks
            outcome.ok = num_chunks > 0
            if not outcome.ok:
                outcome.error = "the stream ended without output"
    except (httpx.HTTPError, ValueError) as err:
        outcome.error = f"{type(err).__name__}: {err}"


def _content(obj: dict[str, Any]) -> str:
    return "".join(choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                   for choice in obj.get("choices") or ())


async def run_load(workload: Workload, base_url: str, *, model: str,
                   endpoint: str = "completions", max_concurrency: int | None = None,
                   timeout_s: float = 600.0,
                   hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS,
                   lag_warn_s: float = DEFAULT_WARN_S,
                   on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Replay ``workload`` (arrivals in seconds from now) against ``base_url``. Request
    ``i`` carries ``X-Request-Id: <run id>-<i>``, which the gateway and the emulated backend
    record too. ``on_done`` is called as each request ends (a progress bar)."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    url = base_url.rstrip("/") + path
    limit = max_concurrency or len(workload) or 1
    gate = asyncio.Semaphore(limit)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0),
                                 limits=limits) as client:
        loop = asyncio.get_running_loop()
        lag = LagMonitor("load", warn_s=lag_warn_s)
        lag.start()
        run_id = uuid.uuid4().hex[:12]
        start = loop.time()
        tasks = []
        for i in range(len(workload)):
            body, hashes = build_body(workload, i, model=model, endpoint=endpoint,
                                      hash_block_tokens=hash_block_tokens)
            at = float(workload.arrival_s[i])
            outcome = Outcome(i, at, int(workload.num_prompt_tokens[i]),
                              int(workload.num_output_tokens[i]), hashes,
                              request_id=f"{run_id}-{i}")
            outcomes.append(outcome)
            payload = json.dumps(body).encode()
            delay = start + at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

            async def one(body: bytes = payload, outcome: Outcome = outcome,
                          due: float = start + at) -> None:
                async with gate:
                    t0 = time.monotonic()
                    # Waiting at the gate is --max-concurrency at work, not lag.
                    late = loop.time() - due if max_concurrency is None else 0.0
                    outcome.sent_s = loop.time() - start
                    try:
                        await asyncio.wait_for(send_one(client, url, body, outcome),
                                               timeout_s)
                    finally:
                        outcome.lag_s = max(late, lag.lag_since(t0))
                        if on_done is not None:
                            on_done(outcome)

            tasks.append(loop.create_task(one()))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        lag.stop()
        for outcome, result in zip(outcomes, results, strict=True):
            if isinstance(result, BaseException) and not outcome.error:
                outcome.error = f"{type(result).__name__}: {result}"
    return outcomes


def report(outcomes: list[Outcome], duration_s: float) -> dict[str, Any]:
    """vLLM ``benchmark_serving``'s metrics (ms), plus p50/p90 and the failures."""
    ok = [o for o in outcomes if o.ok]
    out_tokens = sum(o.num_output_tokens for o in ok)
    in_tokens = sum(o.num_prompt_tokens for o in ok)
    r: dict[str, Any] = {
        "completed": len(ok), "failed": len(outcomes) - len(ok),
        "duration": duration_s, "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration_s if duration_s > 0 else 0.0,
        "output_throughput": out_tokens / duration_s if duration_s > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s
        if duration_s > 0 else 0.0,
    }
    series = {"ttft": [o.ttft_s for o in ok], "tpot": [o.tpot_s for o in ok],
              "itl": [x for o in ok for x in o.itl_s], "e2el": [o.e2e_s for o in ok]}
    for name, values in series.items():
        v = np.array(values, dtype=np.float64) * 1000.0
        v = v[np.isfinite(v)]
        stats = ((np.mean(v), np.median(v), np.std(v), *np.percentile(v, [50, 90, 99]))
                 if v.size else (0.0,) * 6)
        for key, x in zip(("mean", "median", "std", "p50", "p90", "p99"), stats, strict=True):
            r[f"{key}_{name}_ms"] = float(x)
    r["errors"] = sorted({o.error for o in outcomes if not o.ok})[:5]
    r["max_lag_ms"] = max((o.lag_s for o in outcomes), default=0.0) * 1000.0
    return r


def bench_json(outcomes: list[Outcome], duration_s: float, *, setup: dict[str, Any],
               percentiles: list[float], percentile_metrics: list[str] | tuple[str, ...],
               goodput: dict[str, float] | None = None, detailed: bool = False
               ) -> dict[str, Any]:
    """The load as ``vllm bench serve --save-result`` writes it (``vllm_json.bench_result``:
    the same keys as ``fleetsim run --vllm-json``), plus ``max_lag_ms``."""
    from fleetsim.vllm_json import bench_result

    ok = np.array([o.ok for o in outcomes], dtype=bool)

    def col(name: str) -> NDArray[np.float64]:
        return np.array([getattr(o, name) for o in outcomes], dtype=np.float64)

    r = bench_result(setup=setup, duration=duration_s, ok=ok, start_s=col("sent_s"),
                     ttft_s=col("ttft_s"), e2e_s=col("e2e_s"),
                     input_lens=np.array([o.num_prompt_tokens for o in outcomes], np.int64),
                     output_lens=np.array([o.num_output_tokens for o in outcomes], np.int64),
                     itls=[o.itl_s for o in outcomes], percentiles=percentiles,
                     percentile_metrics=percentile_metrics, goodput=goodput,
                     detailed=detailed, errors=[o.error for o in outcomes],
                     generated_texts=["".join(o.text_parts) for o in outcomes])
    r["max_lag_ms"] = max((o.lag_s for o in outcomes), default=0.0) * 1000.0
    r["error_messages"] = sorted({o.error for o in outcomes if not o.ok})[:5]
    return r
