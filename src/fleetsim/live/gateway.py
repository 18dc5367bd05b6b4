"""``fleetsim gateway``: an OpenAI-compatible proxy that picks backends with fleetsim's routers.

Each request is validated (the same 400s as the emulated backend), its prompt counted and
hashed (``tokens.py``), and routed by a router of ``policies/routing.py`` over the healthy
backends (``backends.py``). The body goes to the backend unchanged; a streamed response
passes through chunk by chunk as it arrives. A request is tried again on another backend
(at most ``max_attempts`` in all) when its backend cannot be reached, answers 5xx or 429, or
breaks before anything reached the client; a stream that breaks after that ends with an
error event. A client that disconnects closes the backend request, which cancels it there.
With ``record``, every request becomes a row of a trace (``trace.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fleetsim.errors import FleetsimInputError
from fleetsim.live.backends import BackendView, GatewayView
from fleetsim.live.common import make_starlette, version
from fleetsim.live.lag import DEFAULT_WARN_S, LagMonitor
from fleetsim.live.metrics import LiveMetrics
from fleetsim.live.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    REQUEST_ID_HEADER,
    ApiError,
    ParsedRequest,
    error_body,
    overloaded,
    parse_request,
    read_json_body,
    request_id_of,
    sse,
)
from fleetsim.live.server import LiveApp
from fleetsim.live.tokens import Tokenize, prefix_hashes, tokenize
from fleetsim.live.trace import TraceWriter, trace_row
from fleetsim.policies.routing import make_router
from fleetsim.registry import PolicySpec
from fleetsim.serving.request import Request

DEFAULT_HEALTH_CHECK_INTERVAL_S = 5.0
"""Seconds between active health checks (Envoy's and Kubernetes' readiness probes use 5-10 s)."""
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
GAUGES = {"num_requests_in_flight": "Requests being served",
          "num_backends_healthy": "Backends not ejected",
          "backend_load_tokens": "Outstanding tokens over all backends",
         "event_loop_lag_seconds": "Latest lag of the gateway's event loop behind real time"}
# Not copied from a backend's answer: hop-by-hop headers, and ``date``/``server``, which the
# gateway's own HTTP server writes (copied, a client would get each twice).
_NOT_FORWARDED = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive",
                            "content-encoding", "date", "server"})
BACKEND_HEADER = "x-fleetsim-backend"
"""Response header naming the backend that served the request (as llm-d's gateway says which
endpoint it picked)."""


def check_url(flag: str, url: str) -> str:
    """``url`` as a server's base URL (http(s)://host:port, no trailing ``/`` or ``/v1``),
    or one line naming ``flag``, the value and the form expected."""
    fix = "expected a URL like http://127.0.0.1:8001"
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port out of 0..65535 or not a number
    except ValueError as err:
        raise FleetsimInputError(flag, url, f"{err}; {fix}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FleetsimInputError(flag, url, fix)
    if port == 0:
        raise FleetsimInputError(flag, url, f"port 0 cannot be connected to; {fix}")
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


def check_backends(urls: Sequence[str]) -> list[str]:
    """The backend URLs, checked (http(s)://host:port, no duplicates)."""
    out = []
    for url in urls:
        u = check_url("--backend", url)
        if u in out:
            raise FleetsimInputError("--backend", url, "given twice")
        out.append(u)
    return out


class _Attempt(Exception):
    """A try on one backend failed in a way another backend may not."""


class Gateway(LiveApp):
    """The gateway's app."""

    def __init__(self, backends: Sequence[str], *, router: str = "least_loaded",
                 max_in_flight: int = 1024, max_attempts: int = 3,
                 record: str | Path | None = None, hash_block_tokens: int = 16,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout_s: float = 600.0, connect_timeout_s: float = 5.0,
                 seed: int = 0, tokenizer: Tokenize = tokenize,
                 lag_warn_s: float = DEFAULT_WARN_S,
                 health_check_interval_s: float = DEFAULT_HEALTH_CHECK_INTERVAL_S) -> None:
        self.health_check_interval_s = health_check_interval_s
        self.tokenizer = tokenizer
        self.lag = LagMonitor("gateway", warn_s=lag_warn_s)
        self.backends = [BackendView(i, url, hash_block_tokens=hash_block_tokens)
                         for i, url in enumerate(check_backends(backends))]
        self.router_name = router
        self.router = make_router(PolicySpec(name=router), "--router")
        self.rng = np.random.default_rng(seed)
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.hash_block_tokens = hash_block_tokens
        self.max_body_bytes = max_body_bytes
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.recorder = TraceWriter(record) if record is not None else None
        self.metrics = LiveMetrics(self._gauges, GAUGES)
        self.client: httpx.AsyncClient | None = None
        self.num_in_flight = 0
        self.draining = False
        self._next_seq = 0
        self._t0 = time.monotonic()
        self._streams: set[asyncio.Task[Any]] = set()
        self.abort_reason: str | None = None
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
        limits = httpx.Limits(max_connections=self.max_in_flight + 16,
                              max_keepalive_connections=256)
        timeout = httpx.Timeout(self.request_timeout_s, connect=self.connect_timeout_s)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            self.client = client
            self.lag.start()
            checks = (asyncio.get_running_loop().create_task(self._check_health())
                      if self.health_check_interval_s > 0 else None)
            try:
                yield
            finally:
                if checks is not None:
                    checks.cancel()
                self.lag.stop()
                self.abort_in_flight("the gateway is shutting down")
                if self.recorder is not None:
                    self.recorder.close()

    def now_s(self) -> float:
        return time.monotonic() - self._t0

    async def _check_health(self) -> None:
        """Active health checks: every backend's ``GET /health``, every interval."""
        assert self.client is not None
        client, timeout = self.client, self.connect_timeout_s

        async def check(b: BackendView) -> None:
            try:
                r = await client.get(f"{b.url}/health", timeout=timeout)
                # 5xx is "not ready" (vLLM and emulate answer 503 while starting or
                # draining); a 404 is a server without the endpoint: up, judged passively.
                b.health_ok = r.status_code < 500
            except httpx.HTTPError:
                b.health_ok = False

        while True:
            await asyncio.gather(*(check(b) for b in self.backends))
            await asyncio.sleep(self.health_check_interval_s)

    # ---- LiveApp -------------------------------------------------------------------
    def begin_drain(self) -> None:
        self.draining = True

    def abort_in_flight(self, reason: str) -> None:
        self.abort_reason = reason
        for task in list(self._streams):
            task.cancel(reason)

    def _gauges(self) -> dict[str, float]:
        now = self.now_s()
        return {"num_requests_in_flight": self.num_in_flight,
                "num_backends_healthy": sum(b.healthy(now) for b in self.backends),
                "backend_load_tokens": sum(b.load_tokens for b in self.backends),
                "event_loop_lag_seconds": self.lag.current_s()}

    # ---- small endpoints -------------------------------------------------------------
    async def health(self, request: HttpRequest) -> Response:
        now = self.now_s()
        if self.draining or not any(b.healthy(now) for b in self.backends):
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def models(self, request: HttpRequest) -> Response:
        """The union of the backends' models (those that answer within the connect
        timeout); 503 when none answers."""
        assert self.client is not None
        client, timeout = self.client, self.connect_timeout_s

        async def ask(b: BackendView) -> list[dict[str, Any]]:
            try:
                r = await client.get(f"{b.url}/v1/models", timeout=timeout)
                data = r.json().get("data", []) if r.status_code == 200 else []
                return [m for m in data if isinstance(m, dict) and "id" in m]
            except (httpx.HTTPError, ValueError, AttributeError):
                return []

        seen: dict[str, dict[str, Any]] = {}
        for models in await asyncio.gather(*(ask(b) for b in self.backends)):
            for m in models:
                seen.setdefault(m["id"], m)
        if not seen:
            # As a load balancer with no healthy upstream answers: clients (``fleetsim load``,
            # ``vllm bench serve``) read 503 as "not ready yet", an empty 200 as "no model".
            return JSONResponse(error_body("no backend lists a model (none is up yet)",
                                           "server_error", code="unavailable"),
                                status_code=503, headers={"Retry-After": "1"})
        return JSONResponse({"object": "list", "data": list(seen.values())})

    async def completions(self, request: HttpRequest) -> Response:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self._serve(request, "chat")

    # ---- proxying --------------------------------------------------------------------
    async def _serve(self, request: HttpRequest, kind: str) -> Response:
        arrival_s = self.now_s()
        # The arrival's place in the recorded trace is taken with its time: a later request
        # may be read and served while this one's body is still arriving.
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        request_id = request_id_of(request)
        try:
            if self.draining:
                raise ApiError(503, "the gateway is shutting down", kind="server_error",
                               code="unavailable")
            if self.num_in_flight >= self.max_in_flight:
                raise overloaded(f"the gateway ({self.max_in_flight} requests in flight)")
            parsed = parse_request(kind, await read_json_body(request, self.max_body_bytes),
                                   self.tokenizer)
        except ApiError as err:
            if self.recorder is not None:
                self.recorder.skip(seq)  # refused at the door: no row
            self.metrics.requests.labels("rejected", str(err.status)).inc()
            rejected = err.response()
            rejected.headers[REQUEST_ID_HEADER] = request_id
            return rejected
        except BaseException:  # e.g. the client left while its body was arriving
            if self.recorder is not None:
                self.recorder.skip(seq)
            raise
        req = Request(id=seq, arrival_s=arrival_s, num_prompt_tokens=parsed.num_prompt_tokens,
                      max_output_tokens=parsed.max_tokens or 1,
                      hash_ids=prefix_hashes(parsed.prompt_tokens, self.hash_block_tokens))
        flight = _Flight(self, parsed, req, request_id)
        self.num_in_flight += 1
        self.metrics.prompt_tokens.inc(parsed.num_prompt_tokens)
        handed_over = False
        try:
            response = await flight.open()
            handed_over = isinstance(response, _RelayResponse)
            return response
        finally:
            if not handed_over:
                flight.close()

    def route(self, req: Request, exclude: set[int]) -> BackendView:
        """The backend the router picks among the healthy ones not tried yet."""
        now = self.now_s()
        pool = [b for b in self.backends if b.replica_id not in exclude]
        healthy = [b for b in pool if b.healthy(now)] or pool
        i = self.router.route(GatewayView(healthy, self.rng), req, now)
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or \
                not 0 <= i < len(healthy):
            raise RuntimeError(f"router {self.router_name} returned {i!r}, not an index "
                               f"0..{len(healthy) - 1}")
        backend = healthy[int(i)]
        backend.remember(req.hash_ids)
        return backend


class _RelayResponse(StreamingResponse):
    """A stream that always releases its request, even if it never started."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Any, **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()

class _Flight:
    """One request through the gateway: its attempts, its stream, its row of the trace."""

    def __init__(self, gw: Gateway, parsed: ParsedRequest, req: Request,
                 request_id: str) -> None:
        self.gw = gw
        self.request_id = request_id
        self.parsed = parsed
        self.req = req
        self.body = json.dumps(parsed.body).encode()
        self.path = "/v1/chat/completions" if parsed.kind == "chat" else "/v1/completions"
        self.backend: BackendView | None = None
        self.t0 = time.monotonic()
        self.first_token_t: float | None = None
        self.last_token_t: float | None = None
        self.num_chunks = 0
        self.num_usage_tokens: int | None = None
        self.status = "error"
        self.closed = False

    async def open(self) -> Response:
        """Try backends until one answers; a streaming 200 is handed to the client as a
        stream, anything else as a whole response."""
        gw, tried = self.gw, set[int]()
        last_error = "no backend"
        for attempt in range(min(gw.max_attempts, len(gw.backends))):
            backend = gw.route(self.req, tried)
            tried.add(backend.replica_id)
            if attempt:
                gw.metrics.retries.inc()
            self.backend = backend
            backend.dispatched(self.req)
            try:
                return await self._try(backend)
            except _Attempt as err:
                last_error = str(err)
                backend.done(self.req)
                backend.failed(gw.now_s())
        self.backend = None
        gw.metrics.requests.labels("error", "502").inc()
        return JSONResponse(error_body(f"no backend could serve the request ({last_error})",
                                       "server_error", code="bad_gateway"), status_code=502)

    async def _try(self, backend: BackendView) -> Response:
        client = self.gw.client
        assert client is not None
        url = f"{backend.url}{self.path}"
        try:
            request = client.build_request("POST", url, content=self.body,
                                           headers={"content-type": "application/json",
                                                    REQUEST_ID_HEADER: self.request_id})
            resp = await client.send(request, stream=True)
        except httpx.HTTPError as err:
            raise _Attempt(f"{backend.url}: {type(err).__name__}: {err}") from None
        if resp.status_code != 200 or not self.parsed.stream:
            try:
                content = await resp.aread()
            except httpx.HTTPError as err:
                raise _Attempt(f"{backend.url}: {type(err).__name__} reading the response") \
                    from None
            finally:
                await resp.aclose()
            if resp.status_code in RETRYABLE_STATUS:
                raise _Attempt(f"{backend.url} answered {resp.status_code}")
            if resp.status_code == 200:
                self._count_whole(content)
                self.status = "ok"
            else:
                self.status = f"http_{resp.status_code}"
            backend.succeeded()
            self.gw.metrics.requests.labels("ok" if resp.status_code == 200 else "error",
                                            str(resp.status_code)).inc()
            headers = {k: v for k, v in resp.headers.items()
                       if k.lower() not in _NOT_FORWARDED}
            headers.update(self._headers(backend))
            return Response(content, status_code=resp.status_code, headers=headers)
        return _RelayResponse(self._relay(resp, backend), lambda: self._closed(resp),
                              status_code=200, media_type="text/event-stream",
                              headers={"Cache-Control": "no-cache", **self._headers(backend)})

    def _headers(self, backend: BackendView) -> dict[str, str]:
        return {REQUEST_ID_HEADER: self.request_id, BACKEND_HEADER: backend.url}

    async def _closed(self, resp: httpx.Response) -> None:
        await resp.aclose()
        self.close()

    async def _relay(self, resp: httpx.Response, backend: BackendView) -> AsyncIterator[bytes]:
        """The backend's stream, chunk by chunk as it arrives."""
        gw = self.gw
        task = asyncio.current_task()
        assert task is not None
        gw._streams.add(task)
        buffer = b""
        done = False
        outcome = ("cancelled", "499")
        try:
            async for chunk in resp.aiter_raw():
                yield chunk
                buffer = self._scan(buffer + chunk, backend)
                if self.status == "ok":
                    done = True
            if not done:
                raise httpx.RemoteProtocolError("the stream ended before [DONE]")
            backend.succeeded()
            outcome = ("ok", "200")
        except httpx.HTTPError as err:
            backend.failed(gw.now_s())
            self.status = "error"
            outcome = ("error", "502")
            yield sse(error_body(f"the backend {backend.url} failed mid-stream "
                                 f"({type(err).__name__}: {err})", "server_error",
                                 code="backend_error"))
        except asyncio.CancelledError:
            if gw.abort_reason is None:
                raise  # the client went away
            # The gateway shuts down: tell the client, end the stream cleanly.
            self.status = "error"
            outcome = ("error", "503")
            yield sse(error_body(gw.abort_reason, "server_error", code="unavailable"))
        finally:
            gw._streams.discard(task)
            gw.metrics.requests.labels(*outcome).inc()
            await resp.aclose()
            self.close()

    def _scan(self, data: bytes, backend: BackendView) -> bytes:
        """Count the tokens in complete SSE lines of ``data``; return the incomplete rest."""
        *lines, rest = data.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.status = "ok"
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                continue
            if isinstance(obj, dict):
                self._on_event(obj, backend)
        return rest

    def _on_event(self, obj: dict[str, Any], backend: BackendView) -> None:
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.num_usage_tokens = usage["completion_tokens"]
        for choice in obj.get("choices") or ():
            if isinstance(choice, dict) and (choice.get("text") or
                                             (choice.get("delta") or {}).get("content")):
                now = time.monotonic()
                if self.first_token_t is None:
                    self.first_token_t = now
                    backend.first_token(self.req)
                    self.gw.metrics.ttft.observe(now - self.t0)
                self.last_token_t = now
                self.num_chunks += 1
                self.req.num_output_tokens += 1
                self.gw.metrics.generation_tokens.inc()

    def _count_whole(self, content: bytes) -> None:
        try:
            usage = json.loads(content).get("usage") or {}
            n = int(usage.get("completion_tokens", 0))
        except (ValueError, AttributeError, TypeError):
            n = 0
        self.num_usage_tokens = n
        self.gw.metrics.generation_tokens.inc(n)

    def close(self) -> None:
        """The request is over: free its load, record it (once)."""
        if self.closed:
            return
        self.closed = True
        gw = self.gw
        gw.num_in_flight -= 1
        if self.backend is not None:
            self.backend.done(self.req)
        end = time.monotonic()
        e2e = end - self.t0
        n = self.num_usage_tokens if self.num_usage_tokens is not None else self.num_chunks
        ttft = tpot = None
        if self.first_token_t is not None:
            ttft = self.first_token_t - self.t0
            if n > 1:
                tpot = (end - self.first_token_t) / (n - 1)
        if self.status == "ok":
            gw.metrics.e2e.observe(e2e)
            if tpot is not None:
                gw.metrics.tpot.observe(tpot)
        if gw.recorder is not None:
            gw.recorder.write(self.req.id, trace_row(
                arrival_s=self.req.arrival_s, num_prompt_tokens=self.req.num_prompt_tokens,
                num_output_tokens=n, hash_ids=self.req.hash_ids, ttft_s=ttft, tpot_s=tpot,
                e2e_s=e2e if self.status == "ok" else None, status=self.status,
                hash_block_tokens=gw.hash_block_tokens, request_id=self.request_id,
                lag_s=gw.lag.lag_since(self.t0),
                backend=self.backend.url if self.backend is not None else None,
                endpoint=self.parsed.kind))
