"""``fleetsim emulate``: an OpenAI-compatible server whose tokens come from the replica engine.

Each request enters the ``LiveEngine`` (continuous batching, KV capacity, chunked prefill,
preemption, prefix caching) and its tokens leave when the engine emits them: one server-sent
event per token when streaming, the whole text at the finish otherwise. Prompt tokens are
counted by a real tokenizer when given (``--tokenizer``), else by the rule of ``tokens.py``
(or taken as given when the prompt is token ids); the
output length is ``max_tokens``, or when absent a length sampled from the Azure 2023
conversation trace (finish reason "stop"). The output text is filler, one token per word.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleetsim.live.common import make_starlette, version, wait_or_disconnect
from fleetsim.live.engine import EngineStopped, LiveEngine, LiveRequest
from fleetsim.live.lag import DEFAULT_WARN_S, LagMonitor
from fleetsim.live.metrics import LiveMetrics, VllmMetrics
from fleetsim.live.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    REQUEST_ID_HEADER,
    SSE_DONE,
    ApiError,
    ParsedRequest,
    chunk_body,
    completion_body,
    error_body,
    new_id,
    parse_request,
    read_json_body,
    request_id_of,
    sse,
    usage_chunk,
)
from fleetsim.live.server import LiveApp
from fleetsim.live.tokens import FILLER_WORDS, Tokenize, output_text, prefix_hashes, tokenize
from fleetsim.live.trace import TraceWriter, trace_row

GAUGES = {
    "num_requests_running": "Requests in the engine's running batches",
    "num_requests_waiting": "Requests waiting for admission",
    "kv_cache_usage_perc": "Share of KV blocks in use (0-1)",
    "num_requests_in_flight": "Requests submitted and not yet finished",
    "event_loop_lag_seconds": "Latest lag of the server's event loop behind real time",
}


class EmulatedBackend(LiveApp):
    """The emulated backend's app around a ``LiveEngine``."""

    def __init__(self, engine: LiveEngine, *, served_model: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout_s: float = 600.0, record: str | Path | None = None,
                 tokenizer: Tokenize = tokenize, lag_warn_s: float = DEFAULT_WARN_S,
                 response_mode: str = "filler") -> None:
        if response_mode not in RESPONSE_MODES:
            raise ValueError(f"response_mode must be one of {RESPONSE_MODES}, got "
                             f"{response_mode!r}")
        self.response_mode = response_mode
        self.engine = engine
        self.lag = LagMonitor("emulate", warn_s=lag_warn_s)
        self.tokenizer = tokenizer
        self.served_model = served_model or engine.config.model
        # Also answer to the catalog's name of the model (``Llama-3.1-8B``).
        self.model_names = {self.served_model, engine.model.name}
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.draining = False
        self.created = int(time.time())
        self.recorder = TraceWriter(record) if record is not None else None
        self.metrics = LiveMetrics(self._gauges, GAUGES)
        self.vllm_metrics = VllmMetrics(self.metrics.registry, self._vllm_gauges,
                                        model_name=self.served_model,
                                        max_model_len=engine.model.max_context_tokens)
        engine.on_finish = self._on_engine_finish
        self.asgi = make_starlette([
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.health, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", self.metrics.endpoint, methods=["GET"]),
        ], self._lifespan)

    @asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        self.engine.start()
        self.lag.start()
        try:
            yield
        finally:
            self.lag.stop()
            await self.engine.stop()
            if self.recorder is not None:
                self.recorder.close()

    # ---- LiveApp -------------------------------------------------------------------
    def begin_drain(self) -> None:
        self.draining = True

    def abort_in_flight(self, reason: str) -> None:
        self.engine.fail_all(reason)

    def _gauges(self) -> dict[str, float]:
        s = self.engine.stats()
        return {"num_requests_running": s["num_running"], "num_requests_waiting":
                s["num_waiting"], "kv_cache_usage_perc": s["kv_cache_usage"],
                "num_requests_in_flight": s["num_active"],
                "event_loop_lag_seconds": self.lag.current_s()}

    def _vllm_gauges(self) -> dict[str, float]:
        s = self.engine.stats()
        return {"vllm:num_requests_running": s["num_running"],
                "vllm:num_requests_waiting": s["num_waiting"],
                "vllm:kv_cache_usage_perc": s["kv_cache_usage"],
                "vllm:gpu_cache_usage_perc": s["kv_cache_usage"]}

    # ---- endpoints -----------------------------------------------------------------
    async def health(self, request: HttpRequest) -> Response:
        if self.draining or self.engine.failure is not None:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.served_model, "object": "model", "created": self.created,
            "owned_by": "fleetsim", "max_model_len": self.engine.model.max_context_tokens}]})

    async def completions(self, request: HttpRequest) -> Response:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._serve(request, "chat")

    async def _serve(self, request: HttpRequest, kind: str) -> Response:
        t0 = time.monotonic()
        request_id = request_id_of(request)
        headers = {REQUEST_ID_HEADER: request_id}
        lives: list[LiveRequest] = []
        try:
            if self.draining:
                raise ApiError(503, "the server is shutting down", kind="server_error",
                               code="unavailable")
            parsed = parse_request(kind, await read_json_body(request, self.max_body_bytes),
                                   self.tokenizer)
            if parsed.model not in self.model_names:
                raise ApiError(404, f"the model {parsed.model!r} does not exist; this server "
                               f"serves {self.served_model!r}", param="model",
                               code="model_not_found")
            # One engine request per choice (vLLM fans n and a prompt batch out the same
            # way; the n copies of a prompt share its prefix blocks).
            for prompt in parsed.prompts:
                hashes = prefix_hashes(prompt, self.engine.hash_block_tokens)
                for _ in range(parsed.n):  # a loop: those admitted before a 429 are kept
                    lives.append(self.engine.submit(len(prompt), parsed.max_tokens,  # noqa: PERF401
                                                    hashes, received_s=t0))
        except ApiError as err:
            for live in lives:  # a batch admitted in part is not admitted
                self.engine.cancel(live, err.message)
            self.metrics.requests.labels("rejected", str(err.status)).inc()
            rejected = err.response()
            rejected.headers.update(headers)
            return rejected
        for i, live in enumerate(lives):
            live.request_id = request_id if i == 0 else f"{request_id}-{i}"
            live.received_t = t0
        self.metrics.prompt_tokens.inc(parsed.num_prompt_tokens)
        texts = [self._text_of(parsed, i, request_id) for i in range(len(lives))]
        if parsed.stream:
            return StreamingResponse(self._stream(parsed, lives, texts, request_id, t0),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", **headers})
        response = await self._complete(request, parsed, lives, texts, request_id, t0)
        response.headers.update(headers)
        return response

    def _text_of(self, parsed: ParsedRequest, choice: int, request_id: str) -> TokenText:
        """The text of each output token of ``choice`` by ``--response-mode``."""
        if self.response_mode == "echo":
            prompt = parsed.prompts[choice // parsed.n]
            return lambda i: _token_text(prompt[i % len(prompt)])
        if self.response_mode == "random":
            seed = parsed.body.get("seed")
            rng = random.Random(f"{request_id}/{choice}" if seed is None else f"{seed}/{choice}")
            words = [rng.choice(FILLER_WORDS) for _ in range(64)]
            return lambda i: " " + words[i % len(words)]
        return output_text

    async def _complete(self, request: HttpRequest, parsed: ParsedRequest,
                        lives: list[LiveRequest], texts: list[TokenText], request_id: str,
                        t0: float) -> Response:
        deadline = t0 + self.request_timeout_s
        try:
            for live in lives:
                present = await wait_or_disconnect(request, live.done,
                                                   max(0.0, deadline - time.monotonic()))
                if not present:
                    for other in lives:
                        self.engine.cancel(other)
                    self.metrics.requests.labels("cancelled", "499").inc()
                    return Response(status_code=499)
        except TimeoutError:
            for live in lives:
                self.engine.cancel(live, "the request timed out")
            self.metrics.requests.labels("error", "504").inc()
            return JSONResponse(error_body("the request timed out", "timeout",
                                           code="timeout"), status_code=504)
        failed = next((live.error for live in lives if live.error is not None), None)
        if failed is not None:
            self.metrics.requests.labels("error", "503").inc()
            return JSONResponse(error_body(failed, "server_error", code="unavailable"),
                                status_code=503)
        choices = []
        for live, text in zip(lives, texts, strict=True):
            n = live.req.num_output_tokens
            choices.append(("".join(text(i) for i in range(n)), _finish_reason(live)))
            self._observe(t0, live, n)
        self.metrics.requests.labels("ok", "200").inc()
        num_output = sum(live.req.num_output_tokens for live in lives)
        return JSONResponse(completion_body(parsed, new_id(parsed.kind, request_id), choices,
                                            num_output))

    async def _stream(self, parsed: ParsedRequest, lives: list[LiveRequest],
                      texts: list[TokenText], request_id: str,
                      t0: float) -> AsyncIterator[bytes]:
        rid, created = new_id(parsed.kind, request_id), int(time.time())
        sent = [0] * len(lives)
        closed = [False] * len(lives)
        deadline = time.monotonic() + self.request_timeout_s
        outcome = ("cancelled", "499")
        try:
            while not all(closed):
                await _wait_any([lv for lv, c in zip(lives, closed, strict=True) if not c],
                                deadline - time.monotonic())
                for k, live in enumerate(lives):
                    if closed[k]:
                        continue
                    while sent[k] < live.num_emitted:
                        yield sse(chunk_body(parsed, rid, created, texts[k](sent[k]),
                                             first=sent[k] == 0, index=k))
                        sent[k] += 1
                        self.metrics.generation_tokens.inc()
                        if sent[k] == 1 and k == 0:
                            self.metrics.ttft.observe(time.monotonic() - t0)
                    if live.finished:
                        closed[k] = True
                        yield sse(chunk_body(parsed, rid, created, None, _finish_reason(live),
                                             first=sent[k] == 0, index=k))
                        self._observe(t0, live, sent[k], count_tokens=False)
            if parsed.include_usage:
                yield sse(usage_chunk(parsed, rid, created, sum(sent)))
            yield SSE_DONE
            outcome = ("ok", "200")
        except (TimeoutError, EngineStopped) as err:
            message = "the request timed out" if isinstance(err, TimeoutError) else str(err)
            outcome = ("error", "504" if isinstance(err, TimeoutError) else "503")
            yield sse(error_body(message, "server_error", code="unavailable"))
        finally:
            self.metrics.requests.labels(*outcome).inc()
            for live in lives:
                if not live.finished:
                    self.engine.cancel(live, "the request timed out" if outcome[1] == "504"
                                       else "the client disconnected")

    def _observe(self, t0: float, live: LiveRequest, n: int, *,
                 count_tokens: bool = True) -> None:
        """Server-side latencies, in wall seconds (TTFT of non-streamed requests is the
        engine's, scaled to wall time)."""
        req, m = live.req, self.metrics
        e2e = time.monotonic() - t0
        if count_tokens:
            m.generation_tokens.inc(n)
            m.ttft.observe((req.first_token_s - req.arrival_s) / self.engine.speed)
        m.e2e.observe(e2e)
        if n > 1:
            m.tpot.observe((req.finish_s - req.first_token_s) / (n - 1) / self.engine.speed)

    def _on_engine_finish(self, live: LiveRequest) -> None:
        req = live.req
        n = req.num_output_tokens
        tpot = (req.finish_s - req.first_token_s) / (n - 1) if n > 1 else None
        speed = self.engine.speed
        self.vllm_metrics.finished(
            finished_reason="abort" if live.cancelled else _finish_reason(live),
            num_prompt_tokens=req.num_prompt_tokens, num_output_tokens=n,
            num_prefix_hit_tokens=req.num_prefix_hit_tokens,
            num_preemptions=req.num_preemptions,
            ttft_s=(req.first_token_s - req.arrival_s) / speed,
            queue_s=(req.first_scheduled_s - req.arrival_s) / speed,
            e2e_s=(req.finish_s - req.arrival_s) / speed,
            tpot_s=tpot / speed if tpot is not None else None)
        if self.recorder is None:
            return
        self.recorder.write(req.id, trace_row(
            arrival_s=req.arrival_s, num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=n, hash_ids=req.hash_ids,
            ttft_s=req.first_token_s - req.arrival_s, tpot_s=tpot,
            e2e_s=req.finish_s - req.arrival_s,
            status="cancelled" if live.cancelled else "ok",
            hash_block_tokens=self.engine.hash_block_tokens, request_id=live.request_id,
            lag_s=self.lag.lag_since(live.received_t),
            **({"abort_reason": req.abort_reason} if req.abort_reason else {}),
            num_prefix_hit_tokens=req.num_prefix_hit_tokens,
            num_preemptions=req.num_preemptions))


TokenText = Callable[[int], str]
"""Output token index -> its text."""
RESPONSE_MODES = ("filler", "echo", "random")


def _token_text(token: str | int) -> str:
    return f" {token}" if isinstance(token, int) else token


async def _wait_any(lives: list[LiveRequest], timeout_s: float) -> None:
    """Until one of ``lives`` has news (TimeoutError after ``timeout_s``)."""
    if len(lives) == 1:
        await lives[0].wait(timeout_s)
        return
    if not any(live.changed.is_set() for live in lives):
        waiters = [asyncio.ensure_future(live.changed.wait()) for live in lives]
        try:
            done, _ = await asyncio.wait(waiters, timeout=max(0.0, timeout_s),
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        if not done:
            raise TimeoutError
    for live in lives:
        live.changed.clear()


def _finish_reason(live: LiveRequest) -> str:
    return "stop" if live.sampled_length or live.cancelled else "length"


def emulated_backend(config: str | None = None, overrides: tuple[str, ...] | list[str] = (), *,
                     speed: float = 1.0, max_num_requests: int = 1024,
                     hash_block_tokens: int = 16, **app_kw: Any) -> EmulatedBackend:
    """An emulated backend for a config file and ``--set``-style overrides (what
    ``fleetsim emulate`` builds), e.g. for ``ServerThread(lambda: emulated_backend())``."""
    from fleetsim.config import load_config

    engine = LiveEngine(load_config(config, list(overrides)), speed=speed,
                        max_num_requests=max_num_requests, hash_block_tokens=hash_block_tokens)
    return EmulatedBackend(engine, **app_kw)
