"""One serving replica: continuous batching over a paged KV cache (vLLM v1 style).

Each step the batching policy plans tokens per request; the engine applies the plan (admit,
preempt, allocate blocks), asks the performance model for the step's duration and schedules
one ``STEP_END`` event. At the step's end it commits the tokens, emits outputs, finishes
requests and plans the next step at once.

Decode fast-forward (``window.py``): when a plan only decodes every running request and the
policy says the plan would repeat, the engine advances many steps in one event, with results
bit-identical to stepping one at a time. Anything from outside that touches the replica in
the middle of a window (an arrival, a KV transfer in or out) first cuts the window back to the
step in progress (``interrupt``), so the outside world always sees the replica as
step-by-step simulation would.

Roles: a ``mixed`` replica prefills and decodes; a ``prefill`` replica hands every request
off after its first token (``on_prefill_done``) and keeps its KV until the transfer is done
(``release_handoff``); a ``decode`` replica takes requests whose KV arrives (``accept_decode``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from fleetsim.core.simulator import Simulator
from fleetsim.errors import PlanError
from fleetsim.metrics.recorder import Recorder
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.request import Request
from fleetsim.serving.window import DecodeWindows, Step


class EventKind(IntEnum):
    """Same-time order: every arrival at time t joins a queue before any step planned at t."""

    ARRIVAL = 0
    TRANSFER_START = 1  # KV transfers (P/D): bytes start flowing after the link latency
    TRANSFER_CHECK = 2  # a transfer may have finished; its KV joins the decode batch
    STEP_END = 3
    WAKE_UP = 4  # an idle replica plans its first step after all same-time inputs


class Replica:
    """A replica engine bound to a simulator. ``submit`` requests; results go to ``recorder``."""

    def __init__(
        self,
        sim: Simulator,
        *,
        step_model: StepTimeModel,
        kv: KVCache,
        batch_policy: Any,
        order_key: Callable[[Request, float], tuple],
        recorder: Recorder,
        max_batched_tokens: int,
        max_running: int,
        fast_forward: bool = True,
        debug: bool = False,
        replica_id: int = 0,
        role: str = "mixed",
        on_prefill_done: Callable[[Replica, Request], None] | None = None,
        on_blocks_freed: Callable[[Replica], None] | None = None,
        next_input_hint_s: Callable[[], float] | None = None,
    ) -> None:
        self.sim = sim
        self.step_model = step_model
        self.kv = kv
        self.batch_policy = batch_policy
        self.order_key = order_key
        self.recorder = recorder
        self.max_batched_tokens = max_batched_tokens
        self.max_running_total = max_running
        self.fast_forward = fast_forward and getattr(batch_policy, "fast_forward_safe", False)
        # The policy promises that with nothing waiting and every running request decoding,
        # its plan decodes each of them once: the engine then opens a window without asking.
        self._decode_all_when_idle = self.fast_forward and getattr(
            batch_policy, "decodes_all_when_idle", False)
        self.debug = debug
        self.replica_id = replica_id
        self.role = role
        self.on_prefill_done = on_prefill_done  # prefill role: hand the request off
        self.on_blocks_freed = on_blocks_freed  # decode role: pending transfers may fit now
        # Known tokens still to compute over all queued requests: prefill backlog plus one per
        # decoding request. Decode steps leave it unchanged (one computed, one emitted), so
        # routers can read it mid-window at O(1).
        self._load_tokens = 0
        # Finish times of the requests that finish inside the window in flight, sorted; the
        # counter above already left them out (``load_tokens`` adds back those still ahead).
        self._finish_times: list[float] = []
        # Requests holding blocks outside the running batch: handoffs awaiting transfer
        # (prefill role) and reservations for KV on its way in (decode role).
        self._holders: dict[int, Request] = {}
        self._step: Step | None = None
        self._windows = DecodeWindows(kv, step_model, next_input_hint_s)
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self._running_keys: list[tuple] = []
        self._waiting_keys: list[tuple] = []
        self._by_id: dict[int, Request] = {}
        self._num_prefilling = 0  # running requests that are not decoding one token a step
        self.busy = False
        self.until_s = math.inf
        self._pending_kv_seconds = 0.0

    # ---- queues ----------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """A request arrives now: queue it and start a step if the replica is idle."""
        self.interrupt()
        self._by_id[req.id] = req
        self._load_tokens += req.num_tokens - req.num_computed_tokens
        self._enqueue(self.waiting, self._waiting_keys, req)
        self._wake()

    def accept_decode(self, req: Request) -> None:
        """Decode role: ``req``'s KV has arrived (its blocks were reserved here with
        ``reserve_decode``); it joins the running batch at the next step."""
        self.interrupt()
        del self._holders[req.id]
        req.is_running = True
        self._load_tokens += req.num_tokens - req.num_computed_tokens
        self._enqueue(self.running, self._running_keys, req)
        self._wake()

    @property
    def load_tokens(self) -> int:
        """Known tokens still to compute over all queued requests: prefill backlog plus one
        per decoding request, as of now (exact mid-window: decode steps leave it unchanged,
        and finishes inside the window count once their time has come)."""
        ft = self._finish_times
        if ft:
            # Inputs at a finish time come before the step ends then (event order).
            return self._load_tokens + len(ft) - bisect.bisect_left(ft, self.sim.now_s)
        return self._load_tokens

    @property
    def max_running(self) -> int:
        """Running slots the batching policy may fill: the limit, less the slots promised to
        KV transfers on their way in (decode role)."""
        return self.max_running_total - self.num_reserved

    @property
    def num_reserved(self) -> int:
        """Requests whose KV is on its way in (decode role)."""
        return len(self._holders) if self.role == "decode" else 0

    def can_reserve_decode(self, num_tokens: int) -> bool:
        """Could a request with ``num_tokens`` of KV (plus its next token) move in now?"""
        self.interrupt()
        kv = self.kv
        return (len(self.running) + self.num_reserved < self.max_running_total
                and kv.num_blocks_for(num_tokens + 1) <= kv.num_available_blocks)

    def reserve_decode(self, req: Request) -> None:
        """Take the blocks ``req``'s transferred KV will fill (and its next token)."""
        self.interrupt()
        self._by_id[req.id] = req
        self._holders[req.id] = req
        self.kv.allocate(req, self.kv.num_blocks_for(req.num_computed_tokens + 1))

    def release_handoff(self, req: Request) -> None:
        """Prefill role: ``req``'s KV has left; free its blocks (it may unblock admission)."""
        self.interrupt()
        del self._holders[req.id]
        self.kv.release(req)
        self._wake()

    def _wake(self) -> None:
        if not self.busy:
            self.busy = True
            self.sim.schedule(self.sim.now_s, EventKind.WAKE_UP, self)

    def interrupt(self) -> None:
        """Cut an ongoing fast-forward window back to the step in progress at ``now``."""
        step = self._step
        if step is None or step.window is None or step.window.settled:
            return
        if self._windows.cut(step, self.sim.now_s):
            ft = self._finish_times
            keep = bisect.bisect_right(ft, step.end_s)
            self._load_tokens += len(ft) - keep  # no longer finishing inside the window
            del ft[keep:]
            self.sim.schedule(step.end_s, EventKind.STEP_END, (self, step))
        self._settle(step)

    def _enqueue(self, queue: list[Request], keys: list[tuple], req: Request) -> None:
        key = self.order_key(req, self.sim.now_s)
        at = bisect.bisect_right(keys, key)
        keys.insert(at, key)
        queue.insert(at, req)

    def _dequeue(self, queue: list[Request], keys: list[tuple], req: Request) -> None:
        at = queue.index(req)
        del queue[at]
        del keys[at]

    # ---- step start ------------------------------------------------------------------
    def wake_up(self) -> None:
        """Handler of ``WAKE_UP``: the idle replica starts stepping."""
        self._start_step()

    def _start_step(self) -> None:
        running = self.running
        if not running:
            if not self.waiting:
                self.busy = False
                return
        elif (self._decode_all_when_idle and not self.waiting and not self._num_prefilling
              and len(running) <= self.max_batched_tokens and self._open_idle_window()):
            return
        now_s = self.sim.now_s
        plan = self.batch_policy.plan(self, now_s)
        for rid in plan.preempt:
            self._preempt(self._lookup(rid, plan))
        step = Step(now_s)
        kv = self.kv
        total = 0
        all_decode = not plan.preempt and len(plan.tokens_by_request) == len(self.running)
        by_id, decodes, chunks = self._by_id, step.decodes, step.chunks
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        # Hot loop (once per request per step): block arithmetic inlined from KVCache.
        for rid, num_new in plan.tokens_by_request.items():
            req = by_id.get(rid)
            if req is None:
                raise PlanError(f"plan names unknown request {rid}: {plan}")
            if not req.is_running:
                self._admit(req)
                all_decode = False
            todo = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if not 0 < num_new <= todo:
                raise PlanError(f"request {rid}: {num_new} tokens planned, {todo} computable")
            needed = (-(-(req.num_computed_tokens + num_new) // bs) - req.num_private_blocks
                      - req.num_cached_entries * per_entry)
            if needed > 0:
                if needed <= kv.num_free_blocks:  # KVCache.allocate without eviction, inlined
                    kv.num_free_blocks -= needed
                    req.num_private_blocks += needed
                else:
                    kv.allocate(req, needed)
            if todo == 1 and req.num_output_tokens > 0:
                decodes.append(req)
            else:
                chunks.append((req, num_new))
                all_decode = False
            total += num_new
        if total > self.max_batched_tokens:
            raise PlanError(f"plan computes {total} tokens, budget {self.max_batched_tokens}")
        if total == 0:
            if self._holders and not self.running:
                # Waiting requests need blocks that KV transfers still hold (outgoing on a
                # prefill replica, incoming on a decode one): sleep until a transfer finishes
                # (release_handoff / accept_decode wake us).
                self.busy = False
                self._step = None
                return
            # Otherwise an empty plan would never make progress: a policy bug.
            raise PlanError(f"empty plan with {len(self.running)} running, "
                            f"{len(self.waiting)} waiting at {now_s} s")
        step.num_tokens = total
        step.num_running = len(self.running)
        step.num_waiting = len(self.waiting)
        self.busy = True
        if all_decode and self.fast_forward:
            end_s = self._try_fast_forward(step)
        else:
            end_s = now_s + self._single_step_time(step)
        step.end_s = end_s
        self._step = step
        self.sim.schedule(end_s, EventKind.STEP_END, (self, step))

    def _open_idle_window(self) -> bool:
        """Nothing waits and every running request decodes: the plan is known (the policy
        said so), so open a window without planning, if the first step's blocks are free."""
        step = Step(self.sim.now_s)
        step.decodes = self.running.copy()
        if self._windows.open(
                step, self.until_s,
                self.on_blocks_freed is None and self.until_s == math.inf) is None:
            return False
        if self.debug:
            self._check_idle_promise(step.decodes)
        step.num_running = len(step.decodes)
        self._note_finishes(step)
        self.busy = True
        self._step = step
        self.sim.schedule(step.end_s, EventKind.STEP_END, (self, step))
        return True

    def _check_idle_promise(self, decodes: list[Request]) -> None:
        """Debug: the policy's plan must be what ``decodes_all_when_idle`` promised."""
        plan = self.batch_policy.plan(self, self.sim.now_s)
        if plan.preempt or dict(plan.tokens_by_request) != {r.id: 1 for r in decodes}:
            raise PlanError(
                f"{type(self.batch_policy).__name__} declares decodes_all_when_idle, but with "
                f"nothing waiting it planned {dict(plan.tokens_by_request)} preempting "
                f"{list(plan.preempt)} instead of one token for each running request")

    def _lookup(self, rid: int, plan: Any) -> Request:
        req = self._by_id.get(rid)
        if req is None:
            raise PlanError(f"plan names unknown request {rid}: {plan}")
        return req

    def _admit(self, req: Request) -> None:
        self._dequeue(self.waiting, self._waiting_keys, req)
        self.kv.admit(req)
        self._load_tokens -= req.num_prefix_hit_tokens
        req.is_running = True
        self._num_prefilling += 1
        self._enqueue(self.running, self._running_keys, req)
        if math.isnan(req.first_scheduled_s):
            req.first_scheduled_s = self.sim.now_s

    def _preempt(self, req: Request) -> None:
        """Evict by recompute: drop its KV; it re-enters the waiting queue."""
        if req not in self.running:
            raise PlanError(f"plan preempts request {req.id}, which is not running")
        self._dequeue(self.running, self._running_keys, req)
        if req.num_computed_tokens < req.num_tokens - 1 or not req.num_output_tokens:
            self._num_prefilling -= 1
        self.kv.release(req)
        # Work since the last admission's prefix hit is lost (STYLE's conservation formula).
        req.num_recomputed_tokens += req.num_computed_tokens - req.num_prefix_hit_tokens
        self._load_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.is_running = False
        self._enqueue(self.waiting, self._waiting_keys, req)

    def _single_step_time(self, step: Step) -> float:
        chunks = [(n, r.num_computed_tokens) for r, n in step.chunks]
        kv_tokens = 0
        for r in step.decodes:
            kv_tokens += r.num_computed_tokens
        duration_s = self.step_model.step_time_s(chunks, len(step.decodes), kv_tokens)
        self._pending_kv_seconds = self.kv.num_used_blocks * duration_s
        return duration_s

    # ---- fast-forward ----------------------------------------------------------------
    def _try_fast_forward(self, step: Step) -> float:
        end_s = self._windows.open(step, self.until_s)
        assert end_s is not None  # the plan took the first step's blocks
        self._note_finishes(step)
        return end_s

    def _note_finishes(self, step: Step) -> None:
        """Take the window's finishers out of the load counter now, keeping their times so
        ``load_tokens`` stays exact until they come."""
        w = step.window
        assert w is not None
        k, ends = step.num_steps, w.ends
        ft = [ends[left - 1] for left in w.lefts if left <= k]
        if ft:
            ft.sort()
            self._finish_times = ft
            self._load_tokens -= len(ft)

    def _settle(self, step: Step) -> None:
        """Take the blocks and commit the tokens of ``step``'s window (its length is final),
        finish the requests whose last step is before its last one, and compute its KV
        block-seconds. Those finishing at its last step are left for its end."""
        w = step.window
        assert w is not None
        if w.settled:
            return
        w.settled = True
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        k = step.num_steps
        ends = w.ends
        end_s = ends[k - 1]
        taken = 0
        # Blocks in use change only when a decoder takes a new block at the start of step
        # j >= 1, or frees all at a finish; the change lasts until the window's end.
        late = 0.0
        before: list[tuple[int, int, Request]] = []
        at_end = w.at_end
        for i, (r, left) in enumerate(zip(step.decodes, w.lefts, strict=True)):
            c = r.num_computed_tokens
            held = r.num_private_blocks + r.num_cached_entries * per_entry
            s_i = left if left < k else k
            first = -(-(c + 1) // bs)
            if first < held:
                first = held
            j = first * bs - c  # the first step that needs another block
            while j < s_i:
                late += end_s - ends[j - 1]
                j += bs
            extra = -(-(c + s_i) // bs) - held
            if extra > 0:
                r.num_private_blocks += extra
                taken += extra
            r.num_computed_tokens = c + s_i
            r.num_computed_tokens_total += s_i
            r.num_output_tokens += s_i
            if left < k:
                before.append((left, i, r))
            elif left == k:
                at_end.append(r)
        kv.num_free_blocks -= taken
        if before:
            before.sort()  # finish order: by step, then batch order (as step by step)
            for left, _, r in before:
                t = ends[left - 1]
                used = kv.num_used_blocks
                self._finish(r, t)
                late -= (end_s - t) * (used - kv.num_used_blocks)
                w.finish_steps.append(left)
        w.kv_seconds = w.used0 * (end_s - step.start_s) + late

    def _finish(self, r: Request, t: float) -> None:
        self._dequeue(self.running, self._running_keys, r)
        self.kv.release(r)
        del self._by_id[r.id]
        r.finish_s = t
        r.is_running = False
        self.recorder.on_finish(self.replica_id, r)

    def _finish_window(self, step: Step, now_s: float) -> list[Request]:
        """A window's end: settle it, finish its last step's requests, record it (one
        timeline row per stretch with a fixed batch)."""
        self._settle(step)
        w = step.window
        assert w is not None
        self._finish_times = []
        for r in w.at_end:
            self._finish(r, now_s)
        rec, rid, ends = self.recorder, self.replica_id, w.ends
        n, a, t = len(step.decodes), 0, step.start_s
        for left in w.finish_steps:
            if left > a:
                rec.on_step(rid, ends[left - 1], ends[left - 1] - t, 0.0, left - a,
                            n * (left - a), self.kv.num_used_blocks, n, step.num_waiting)
                a, t = left, ends[left - 1]
            n -= 1
        rec.on_step(rid, now_s, now_s - t, w.kv_seconds, step.num_steps - a,
                    n * (step.num_steps - a), self.kv.num_used_blocks, n, step.num_waiting)
        return w.at_end

    # ---- step end --------------------------------------------------------------------
    def finish_step(self, step: Step) -> None:
        """Commit the step's tokens at ``sim.now_s`` and plan the next step."""
        now_s = self.sim.now_s
        if step is not self._step or now_s != step.end_s:
            return  # the end of a window that was cut back since
        self._step = None
        if step.window is not None:
            done = self._finish_window(step, now_s)
        else:
            done = self._finish_single_step(step, now_s)
        if self.debug:
            self._check()
        if done and self.on_blocks_freed is not None:
            self.on_blocks_freed(self)
        self._start_step()

    def _finish_single_step(self, step: Step, now_s: float) -> list[Request]:
        """Commit one step's chunks and decodes; returns the requests it finished."""
        kv = self.kv
        done: list[Request] = []
        handoff: list[Request] = []
        hands_off = self.role == "prefill"
        for r, n in step.chunks:
            r.num_computed_tokens += n
            r.num_computed_tokens_total += n
            self._load_tokens -= n
            kv.promote(r)
            if r.num_computed_tokens == r.num_tokens:
                self._num_prefilling -= 1
                self._emit(r, now_s, 1, done)
                if r.num_output_tokens < r.max_output_tokens:
                    self._load_tokens += 1
                    if hands_off:
                        handoff.append(r)
            elif r.num_output_tokens and r.num_computed_tokens == r.num_tokens - 1:
                self._num_prefilling -= 1  # a recompute's last token: it decodes from now on
        for r in step.decodes:
            r.num_computed_tokens += 1
            r.num_computed_tokens_total += 1
            r.num_output_tokens += 1
            if r.num_output_tokens >= r.max_output_tokens:
                done.append(r)
                self._load_tokens -= 1
        for r in done:
            self._finish(r, now_s)
        for r in handoff:
            # The request leaves the batch but its KV stays until the transfer is done.
            self._dequeue(self.running, self._running_keys, r)
            del self._by_id[r.id]
            r.is_running = False
            self._load_tokens -= 1
            self._holders[r.id] = r
            self.on_prefill_done(self, r)  # type: ignore[misc]
        self.recorder.on_step(
            self.replica_id, now_s, now_s - step.start_s, self._pending_kv_seconds, 1,
            step.num_tokens, kv.num_used_blocks, step.num_running, step.num_waiting)
        return done

    def _check(self) -> None:
        """Debug invariants: queue limits, the load counter and KV block conservation."""
        assert len(self.running) + self.num_reserved <= self.max_running_total
        decoding = sum(r.num_output_tokens > 0 and r.num_computed_tokens == r.num_tokens - 1
                       for r in self.running)
        assert self._num_prefilling == len(self.running) - decoding
        queued = self.running + self.waiting
        expected = sum(r.num_tokens - r.num_computed_tokens for r in queued)
        assert self._load_tokens == expected, (self._load_tokens, expected)
        self.kv.check(self.running + list(self._holders.values()))

    @staticmethod
    def _emit(r: Request, now_s: float, num: int, done: list[Request]) -> None:
        if r.num_output_tokens == 0:
            r.first_token_s = now_s
        r.num_output_tokens += num
        if r.num_output_tokens >= r.max_output_tokens:
            done.append(r)

