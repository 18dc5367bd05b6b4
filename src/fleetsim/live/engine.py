"""The replica engine advanced in real time: the emulated backend's core.

A ``LiveEngine`` holds the cluster a ``SimConfig`` describes (usually one replica) on its own
simulator, and an asyncio task that keeps simulated time equal to wall-clock time times
``speed``: it runs the simulator up to now, tells each request's waiter how many tokens the
engine has emitted, and sleeps until the next event or the next arrival, whichever comes
first (an arrival wakes it at once; the sleep is an ``Alarm``, a timerfd precise to ~0.1 ms
where the loop's own timers round to 1 ms). A request is scheduled at the moment the server
received it (``received_s``, before its body was read and parsed), or at the engine's now if
the engine has already moved past that, or at the previous request's arrival (so ids keep
arrival order). The engine thus sees the arrival times it would see in ``fleetsim run`` of the
recorded trace (``tests/unit/test_live_emulate`` checks the two agree to the nanosecond).

Decode fast-forward is off: every step is its own event, so tokens leave at the step that
emits them (results are identical either way; see docs/engine.md). The engine keeps no
history: its recorder is replaced every ``RECORDER_RESET_EVERY`` finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from fleetsim.config import SimConfig
from fleetsim.core.simulator import Simulator
from fleetsim.errors import FleetsimInputError
from fleetsim.live.alarm import Alarm
from fleetsim.live.protocol import ApiError, overloaded
from fleetsim.models import get_model
from fleetsim.policies import make_batch_policy, make_ordering
from fleetsim.policies.eviction import make_eviction
from fleetsim.policies.routing import make_router
from fleetsim.run import build_pools, engine_settings, seed_streams
from fleetsim.serving.cluster import build_cluster
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request
from fleetsim.serving.settings import PlugIns
from fleetsim.workloads.loaders import read_column

RECORDER_RESET_EVERY = 1024
IDLE_WAKE_S = 1.0
"""Longest sleep of the driver with nothing scheduled (a wait with a timeout, in case)."""
OUTPUT_LENGTHS = ("embedded:azure_conv_2023", "GeneratedTokens")
"""Where output lengths are sampled from when a request gives no max_tokens."""


class EngineStopped(Exception):
    """The engine stopped (shutdown or an engine error) before the request finished."""


class LiveRequest:
    """A request inside the live engine, and what its waiter has been told."""

    __slots__ = ("req", "changed", "done", "num_emitted", "finished", "cancelled", "error",
                 "sampled_length", "request_id", "received_t")

    def __init__(self, req: Request, sampled_length: bool) -> None:
        self.req = req
        self.changed = asyncio.Event()
        self.done = asyncio.Event()
        """Set once the request finished or failed."""
        self.num_emitted = 0
        """Output tokens the engine had emitted at the last advance."""
        self.finished = False
        self.cancelled = False
        self.error: str | None = None
        self.sampled_length = sampled_length
        """True when the output length was sampled (finish reason "stop", not "length")."""
        self.request_id = ""
        """The HTTP request's id (``X-Request-Id``), set by the server that submitted it."""
        self.received_t = 0.0
        """Monotonic time the server received it."""

    async def wait(self, timeout_s: float) -> None:
        """Until the engine emits, finishes or fails this request (TimeoutError after
        ``timeout_s``)."""
        if not self.changed.is_set():
            async with asyncio.timeout(timeout_s):
                await self.changed.wait()
        self.changed.clear()
        if self.error is not None:
            raise EngineStopped(self.error)


class LiveEngine:
    """The cluster of ``config`` advanced in real time (``speed`` simulated s per wall s).

    ``submit`` from the event loop's thread only; ``start``/``stop`` the driver task."""

    def __init__(self, config: SimConfig, *, speed: float = 1.0, hash_block_tokens: int = 16,
                 max_num_requests: int = 1024, clock: Callable[[], float] = time.monotonic,
                 seed: int | None = None) -> None:
        eng = config.engine
        if hash_block_tokens % eng.block_size:
            raise FleetsimInputError("--hash-block-tokens", hash_block_tokens,
                                     f"must be a multiple of engine.block_size "
                                     f"({eng.block_size})")
        if not (math.isfinite(speed) and speed > 0):
            raise FleetsimInputError("--speed", speed, "must be a number > 0 (1 = real time)")
        self.config = config
        self.model = get_model(config.model)
        self.speed = speed
        self.hash_block_tokens = hash_block_tokens
        self.max_num_requests = max_num_requests
        self._clock = clock
        self._t0 = clock()
        self._init_cluster(config)
        self._active: dict[int, LiveRequest] = {}
        self._num_finished = 0
        self._last_arrival_s = 0.0
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.failure: str | None = None
        self.on_finish: Callable[[LiveRequest], None] | None = None
        """Told of every request that finished or was cut short (after its waiter)."""
        self._lengths = read_column(*OUTPUT_LENGTHS)
        self._rng = np.random.default_rng(config.seed if seed is None else seed)

    def _init_cluster(self, config: SimConfig) -> None:
        model = self.model
        pools, self.pool_infos = build_pools(config, model)
        self.sim = sim = Simulator()
        self._recorder = Recorder()
        policy = config.policy
        # Steps are paced by the wall clock here: no fast-forward windows.
        settings = replace(engine_settings(config, model), fast_forward=False)
        plugins = PlugIns(
            make_batch_policy=lambda: make_batch_policy(policy.batching),
            order_key=make_ordering(policy.ordering),
            router=make_router(config.cluster.router),
            decode_router=make_router(config.cluster.decode_router, "cluster.decode_router"),
            eviction_key=make_eviction(policy.eviction),
            rng=seed_streams(config.seed, ("workload", "routing"))["routing"])
        self.cluster = build_cluster(sim, pools, settings, plugins, recorder=self._recorder,
                                     hash_block_tokens=self.hash_block_tokens)
        self._source = _Source()
        self.cluster.attach_source(self._source)
        entry = [r for r in self.cluster.replicas if r.role != "decode"]
        self.max_request_blocks = max(r.kv.num_blocks for r in entry)

    # ---- time ------------------------------------------------------------------------
    def now_s(self) -> float:
        """Simulated now: wall-clock seconds since the engine was built, times ``speed``."""
        return (self._clock() - self._t0) * self.speed

    # ---- requests --------------------------------------------------------------------
    @property
    def num_active(self) -> int:
        return len(self._active)

    def sample_output_tokens(self, num_prompt_tokens: int) -> int:
        """An output length drawn from the Azure 2023 conversation trace's, within the
        model's context."""
        room = self.model.max_context_tokens - num_prompt_tokens
        return max(1, min(room, int(self._rng.choice(self._lengths))))

    def sim_time_of(self, wall_s: float) -> float:
        """The simulated time of the wall-clock instant ``wall_s`` (of ``clock``)."""
        return (wall_s - self._t0) * self.speed

    def submit(self, num_prompt_tokens: int, max_output_tokens: int | None,
               hash_ids: tuple[int, ...] = (), *,
               received_s: float | None = None) -> LiveRequest:
        """A request arrives: at wall time ``received_s`` (of ``clock``; default now), or at
        the engine's now if that is later. Raises ``ApiError`` (400 too long, 429 full, 503
        stopped)."""
        if self.failure is not None or self._task is None:
            raise ApiError(503, f"the engine is not running ({self.failure or 'stopped'})",
                           kind="server_error", code="unavailable")
        if len(self._active) >= self.max_num_requests:
            raise overloaded(f"the engine ({self.max_num_requests} requests in flight)")
        sampled = max_output_tokens is None
        out = self.sample_output_tokens(num_prompt_tokens) if sampled else max_output_tokens
        assert out is not None
        self._check_fits(num_prompt_tokens, out)
        # Never before an earlier submit's arrival: ids stay in arrival order (the recorded
        # trace is written in id order and traces are sorted by arrival).
        t = max(self.now_s() if received_s is None else self.sim_time_of(received_s),
                self.sim.now_s, self._last_arrival_s)
        self._last_arrival_s = t
        req = Request(id=self.cluster.new_request_id(), arrival_s=t,
                      num_prompt_tokens=num_prompt_tokens, max_output_tokens=out,
                      hash_ids=hash_ids)
        self.cluster.submit_at(t, req)
        live = LiveRequest(req, sampled)
        self._active[req.id] = live
        self._kick()
        return live

    def _check_fits(self, num_prompt: int, num_output: int) -> None:
        limit = self.model.max_context_tokens
        if num_prompt + num_output > limit:
            raise ApiError(400, f"this model's maximum context length is {limit} tokens; the "
                           f"request has {num_prompt} prompt tokens and asks for {num_output} "
                           f"output tokens", param="max_tokens", code="context_length_exceeded")
        bs = self.config.engine.block_size
        need = -(-(num_prompt + num_output) // bs)
        if need > self.max_request_blocks:
            raise ApiError(400, f"the request needs {need} KV blocks of {bs} tokens but a "
                           f"replica holds {self.max_request_blocks}; shorten it",
                           param="max_tokens", code="context_length_exceeded")

    def cancel(self, live: LiveRequest, reason: str = "the client disconnected") -> None:
        """Abort ``live`` in the engine now (``Cluster.abort``): it leaves the batch, its KV
        is freed and it is recorded as aborted with ``reason``; its waiter is released."""
        if live.finished or live.cancelled:
            return
        live.cancelled = True
        if self._task is None or self.failure is not None:
            return  # stopped or failed: the engine runs no more (its waiters were released)
        self.advance()  # the engine at now (the request has arrived by then)
        if not live.finished:
            self.cluster.abort(live.req.id, reason)
            self.advance()  # hands the aborted request out
        self._kick()

    # ---- the driver ------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver task on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self, reason: str = "the server is shutting down") -> None:
        """Stop the driver; requests still in flight fail with ``reason``."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.fail_all(reason)

    def fail_all(self, reason: str) -> None:
        """Release every waiter with an error (streams end with an error event)."""
        for live in self._active.values():
            live.error = reason
            live.changed.set()
            live.done.set()
        self._active.clear()

    def _kick(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop, self._clock)
        try:
            while True:
                self.advance()
                nxt = self.sim.peek_s()
                now = self._clock()
                wake_s = now + IDLE_WAKE_S if nxt == math.inf else min(
                    now + IDLE_WAKE_S, self._t0 + nxt / self.speed)
                self._wake = wake = loop.create_future()
                alarm.set(wake_s, wake)
                await wake
        except asyncio.CancelledError:
            raise
        except Exception as err:  # an engine bug: fail every request, refuse new ones
            self.failure = f"engine error: {type(err).__name__}: {err}"
            self.fail_all(self.failure)
            raise
        finally:
            alarm.close()

    def advance(self) -> None:
        """Run the simulator up to now and tell waiters what changed."""
        self.sim.run(max(self.now_s(), self.sim.now_s))
        active = self._active
        for live in active.values():
            n = live.req.num_output_tokens
            if n != live.num_emitted:
                live.num_emitted = n
                live.changed.set()
        finished = self._source.finished
        if finished:
            for req in finished:
                live = active.pop(req.id, None)
                if live is None:
                    continue  # failed already (the engine was stopped)
                live.num_emitted = req.num_output_tokens
                live.finished = True
                live.changed.set()
                live.done.set()
                if self.on_finish is not None:
                    self.on_finish(live)
            self._num_finished += len(finished)
            finished.clear()
            if self._num_finished >= RECORDER_RESET_EVERY:
                self._reset_recorder()

    def _reset_recorder(self) -> None:
        self._num_finished = 0
        self._recorder = recorder = Recorder(pool_of=self.cluster.pool_of)
        self.cluster.recorder = recorder
        for replica in self.cluster.replicas:
            replica.recorder = recorder

    # ---- what /metrics shows -----------------------------------------------------------
    def stats(self) -> dict[str, float]:
        reps = self.cluster.replicas
        used = sum(r.kv.num_used_blocks for r in reps)
        total = sum(r.kv.num_blocks for r in reps)
        return {"num_running": sum(len(r.running) for r in reps),
                "num_waiting": sum(len(r.waiting) for r in reps),
                "kv_cache_usage": used / total if total else 0.0,
                "num_active": len(self._active)}


class _Source:
    """The cluster's request source: arrivals come from ``submit``; finishes are kept for
    the driver to hand out after each advance."""

    wants_finishes = True
    num_requests = None

    def __init__(self) -> None:
        self.finished: list[Request] = []

    def start(self, ctx: Any) -> None:
        return None

    def on_arrival(self, req: Request, ctx: Any) -> None:
        return None

    def on_finish(self, req: Request, ctx: Any) -> None:
        self.finished.append(req)


