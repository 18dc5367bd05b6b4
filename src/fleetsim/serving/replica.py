"""One serving replica: continuous batching over a paged KV cache (vLLM v1 style).

A step goes through four named phases: the batching policy *plans* it (``StepPlan``, read
from a ``ReplicaView``); the engine *applies* the plan (preempt, swap, migrate, admit,
allocate blocks, all checked); it *executes* the step (the performance model's duration, or
a fast-forward window of many decode steps, ``window.py``) with one ``STEP_END`` event; and
at the step's end it *commits* the tokens, emits outputs, finishes requests and plans the
next step at once.

Everything a policy, router or controller reads is exact at the time it reads it: reads go
through ``ReplicaView`` (``views.py``), and anything that reads or changes the replica in the
middle of a fast-forward window first calls ``interrupt``, which cuts the window back to the
step in progress and settles the steps done before now, so the replica is then exactly as
step-by-step simulation would have it.

Requests move through the states of ``request.py``. Any replica can hand a running request
off (a ``prefill`` replica does so after every first token; a policy may ``migrate``), keeping
its KV until the transfer is done (``release_handoff``), and take requests whose KV comes in
(``queue_incoming`` -> ``start_incoming`` -> ``accept_incoming``). Swapping to host memory
goes through the same transfer service.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Final

from fleetsim.core.simulator import Simulator
from fleetsim.errors import PlanError
from fleetsim.perf.base import StepTimeModel
from fleetsim.perf.step_model import TableStepModel
from fleetsim.serving import chunk_runs, itl
from fleetsim.serving.capabilities import capabilities_of
from fleetsim.serving.contract import BatchPolicy, RepeatRule, StepPlan
from fleetsim.serving.kv_cache import HostPool, KVCache, blocks_short
from fleetsim.serving.kv_keep import KeptKV, KVRetention
from fleetsim.serving.kv_moves import KVMoves
from fleetsim.serving.kv_placement import PlacementPort
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import (
    ABORTED,
    FINISHED,
    RUNNING,
    STATE_NAMES,
    WAITING,
    Request,
)
from fleetsim.serving.shared_steps import SharedSteps
from fleetsim.serving.speculative import Emission
from fleetsim.serving.transfers import TransferService
from fleetsim.serving.views import ReplicaView
from fleetsim.serving.window import DecodeWindows, Step, StepsHeld

# A timeline row: end_s, busy_s, KV block-seconds, steps, tokens, running, waiting.
Row = tuple[float, float, float, int, int, int, int]

STEP_END: Final = 40  # a step (or window) ends: commit it and plan the next
WAKE_UP: Final = 50  # an idle replica plans its first step after all same-time inputs

HandoffFn = Callable[["Replica", Request, "int | None"], None]


class Replica:
    """A replica engine bound to a simulator. ``submit`` requests; results go to ``recorder``.

    The queues (``running``, ``waiting``; ``moves`` holds the KV moving in and out) are the
    engine's own: policies and routers read them through ``view`` (a ``ReplicaView``).
    """

    def __init__(
        self,
        sim: Simulator,
        *,
        step_model: StepTimeModel,
        kv: KVCache,
        batch_policy: BatchPolicy,
        order_key: Callable[[Request, float], tuple],
        recorder: Recorder,
        max_batched_tokens: int,
        max_running: int,
        fast_forward: bool = True,
        debug: bool = False,
        replica_id: int = 0,
        role: str = "mixed",
        pool: str = "default",
        on_handoff: HandoffFn | None = None,
        on_finish: Callable[[Request], None] | None = None,
        next_input_hint_s: Callable[[], float] | None = None,
        timeline: tuple[float, float] | None = None,
        transfers: TransferService | None = None,
        host: HostPool | None = None,
        kv_bytes_per_token: float = 0.0,
        host_latency_s: float = 0.0,
        track_itl: bool = False,
        retention: KVRetention | None = None,
        speculative: Emission | None = None,
        shared: SharedSteps | None = None,
    ) -> None:
        self.sim = sim
        self.step_model = step_model
        self.kv = kv
        self.recorder = recorder
        self.max_batched_tokens = max_batched_tokens
        self.max_running_total = max_running
        self.debug = debug
        self.replica_id = replica_id
        self.role = role
        self.pool = pool
        self.on_handoff = on_handoff  # the cluster routes a handed-off request on
        self.on_finish = on_finish  # a request source wants to know (programs, RL)
        # Told when the replica runs out of work: an elastic cluster waits for a leaving
        # replica to run dry (``serving/elastic.py``), an instance group hears of an idle
        # member (``serving/groups.py``). One owner at a time (config refuses both at once).
        self.on_idle: Callable[[Replica], None] | None = None
        self.moves = KVMoves(self, transfers, host, kv_bytes_per_token, host_latency_s)
        self.track_itl = track_itl  # inter-token gaps (serving/itl.py), when asked for
        self.host = host
        # KV kept for follow-ups of finished requests (agents' tool waits), if asked for.
        self.kept = (KeptKV(self, retention, host, transfers, kv_bytes_per_token,
                            host_latency_s) if retention is not None else None)
        # A cluster-wide prefix pool (``KVPlacement.join_pool``) may take an arriving request
        # first, fetch the prefix segments other replicas hold into this one's cache, and
        # queue it itself (``queue_arrived``) once they land; False lets it queue now.
        self.prefix_fetch: Callable[[PlacementPort, Request], bool] | None = None
        # Speculative decoding: decode steps emit a scheduled number of tokens
        # (``serving/speculative.py``); windows follow the same schedule.
        self.speculative = speculative
        self._lookahead = speculative.num_lookahead_tokens if speculative is not None else 0
        self._fast_forward_wanted = fast_forward
        self._next_input_hint_s = next_input_hint_s
        self._timeline = timeline
        # Known tokens still to compute over all queued requests: prefill backlog plus one per
        # decoding request. Decode steps leave it unchanged (one computed, one emitted), so
        # routers can read it mid-window at O(1).
        self._load_tokens = 0
        # Finish times of the requests that finish inside the window in flight, sorted; the
        # counter above already left them out (``load_tokens`` adds back those still ahead).
        self._finish_times: list[float] = []
        self._step: Step | None = None
        self._windows = DecodeWindows(kv, step_model, next_input_hint_s, timeline, speculative)
        # The windows of each step model a group gave it (``regroup``), by the model's id (the
        # windows keep the model alive, so the id stays its own).
        self._windows_by_model: dict[int, DecodeWindows] = {}
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self._running_keys: list[tuple] = []
        self._waiting_keys: list[tuple] = []
        self._by_id: dict[int, Request] = {}
        # Requests that entered the queues from outside (arrivals, KV moved or swapped in):
        # a policy with per-request state learns of newcomers by comparing it with the count
        # it last saw, instead of a pass over every queue at every plan.
        self.num_entered = 0
        self._num_prefilling = 0  # running requests that are not decoding one token a step
        self.busy = False
        self.until_s = math.inf
        self._pending_kv_seconds = 0.0
        self._carried: list[Row] = []  # rows of a cut window, written with its last step
        # ``_finish`` bound once: each ``self._finish`` passed to a window's settle built a
        # bound method object when compiled.
        self._finish_fn: Callable[[Request, float], None] = self._finish
        # Migrations asked for from outside (a controller), applied at the next step
        # boundary: request_id -> destination replica.
        self._migrations: dict[int, int] = {}
        # An instance group (``groups.py``) holds a member at its next step boundary while it
        # changes the member's instances, and hears when a member runs out of work.
        self.group_hold: Callable[[Replica], None] | None = None
        self.batch_policy: BatchPolicy = batch_policy
        self.order_key = order_key
        self.fast_forward = False
        self._decode_all_when_idle = False
        self._chunk_runs = False
        self._mixed_runs = False
        self._plan_evicted = False  # the last plan's blocks evicted cached prefixes
        # How many steps its chunk runs price ahead, and the last run cut back (the prices
        # of the steps it did not reach, for the next run of the same request).
        self._run_cap = chunk_runs.RunCap()
        self._spare_run: chunk_runs.ChunkRun | None = None
        self._set_batch_policy(batch_policy)
        self.view = ReplicaView(self)
        # Steps that also draw on a capacity other replicas share (``shared_steps.py``).
        self.shared = shared
        if shared is not None:
            shared.replica = self

    # ---- policies --------------------------------------------------------------------
    def _set_batch_policy(self, policy: BatchPolicy) -> None:
        caps = capabilities_of(policy)
        self.batch_policy = policy
        self.fast_forward = self._fast_forward_wanted and caps.fast_forward_safe
        # The policy promises that with nothing waiting and every running request decoding,
        # its plan decodes each of them once: the engine then opens a window without asking.
        self._decode_all_when_idle = self._fast_forward_wanted and caps.decodes_all_when_idle
        # The policy repeats a lone prompt's whole-budget chunk (``chunk_runs.py``).
        self._chunk_runs = self._fast_forward_wanted and caps.prefill_chunks_repeat
        # ... and with every other running request decoding beside it (its decodes ride).
        self._mixed_runs = self._chunk_runs and caps.mixed_chunks_repeat
        # A policy whose priorities change as requests run brings its own ordering key (and
        # names the requests whose key changed in its plans' ``rekey``).
        own_key = getattr(policy, "order_key", None)
        if own_key is not None:
            self.order_key = own_key
            if self.running or self.waiting:
                self.resort()

    def set_policies(self, batch_policy: BatchPolicy | None = None,
                     order_key: Callable[[Request, float], tuple] | None = None) -> None:
        """Change the batching policy and/or the ordering at ``now`` (a controller's verb):
        the window in flight is cut back, queues are re-sorted under the new key, and the
        fast-forward capabilities are those the new policy declares."""
        self.interrupt()
        if batch_policy is not None:
            self._set_batch_policy(batch_policy)
        if order_key is not None:
            self.order_key = order_key
            self.resort()

    def resort(self) -> None:
        """Recompute every queued request's ordering key at ``now`` and re-sort (for keys
        that change as requests run, e.g. a multi-level feedback queue's levels)."""
        self.interrupt()
        now_s = self.sim.now_s
        for queue, keys in ((self.running, self._running_keys),
                            (self.waiting, self._waiting_keys)):
            pairs = sorted(((self.order_key(r, now_s), i, r) for i, r in enumerate(queue)),
                           key=lambda p: (p[0], p[1]))
            queue[:] = [r for _, _, r in pairs]
            keys[:] = [k for k, _, _ in pairs]

    # ---- inputs ----------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """A request arrives now: queue it and start a step if the replica is idle (once the
        KV it extends is back from host memory, or the prefix a pool fetches for it has
        landed, if either must come first)."""
        self.interrupt()
        req.replica_id = self.replica_id
        kept = self.kept
        if kept is not None and req.kv_from is not None and kept.reload(req):
            return
        fetch = self.prefix_fetch
        if fetch is not None and fetch(self, req):
            return
        self.queue_arrived(req)

    def queue_arrived(self, req: Request) -> None:
        """Arrived ``req`` joins the waiting queue (or, aborted while its parent's KV was
        reloaded, ends now)."""
        if req.abort_reason is not None:
            self._end_aborted(req)
            return
        req.state = WAITING
        req.num_lookahead_tokens = self._lookahead
        self.num_entered += 1
        self._by_id[req.id] = req
        self._load_tokens += req.num_tokens - req.num_computed_tokens
        self._enqueue(self.waiting, self._waiting_keys, req)
        self.wake()

    @property
    def load_tokens(self) -> int:
        """Known tokens still to compute over all queued requests: prefill backlog plus one
        per decoding request, as of now (exact mid-window: decode steps leave it unchanged,
        and finishes inside the window count once their time has come)."""
        ft = self._finish_times
        if ft:
            # Inputs at a finish time come before the step ends then (event order): the
            # finishes still to come are those at or after now (``bisect_left``, written out:
            # compiled, the bisect module is a generic call of ~700 instructions).
            now_s = self.sim.now_s
            lo, hi = 0, len(ft)
            while lo < hi:
                mid = (lo + hi) // 2
                if ft[mid] < now_s:
                    lo = mid + 1
                else:
                    hi = mid
            return self._load_tokens + len(ft) - lo
        step = self._step
        if step is not None:
            run = step.run
            if run is not None:  # its chunks done by now are computed
                return self._load_tokens - run.steps_before(self.sim.now_s) * run.chunk
        return self._load_tokens

    @property
    def max_running(self) -> int:
        """Running slots the batching policy may fill: the limit, less the slots promised to
        KV transfers on their way in."""
        return self.max_running_total - self.moves.num_reserved

    @property
    def swapped(self) -> list[Request]:
        """Requests whose KV is in host memory, in swap-out order."""
        return self.moves.swapped

    def wake(self) -> None:
        """Plan a step now if the replica is idle (after all same-time inputs), unless an
        instance group holds it at this boundary (it wakes it when done)."""
        if not self.busy and self.group_hold is None:
            self.busy = True
            self.sim.schedule(self.sim.now_s, WAKE_UP, self)

    def _enqueue(self, queue: list[Request], keys: list[tuple], req: Request) -> None:
        key = self.order_key(req, self.sim.now_s)
        if not keys or not key < keys[-1]:
            # ``bisect_right``'s answer when the key sorts last, as an arrival's does in
            # first-come order: one comparison, not a generic call and a search.
            keys.append(key)
            queue.append(req)
            return
        at = bisect.bisect_right(keys, key)
        keys.insert(at, key)
        queue.insert(at, req)

    def _dequeue(self, queue: list[Request], keys: list[tuple], req: Request) -> None:
        # ``queue.index(req)`` by identity, written out: requests compare by identity
        # (``eq=False``), but ``list.index`` asks each one ahead of ``req`` through the
        # generic rich comparison (a P/D decode instance of a thousand requests: 3.5% of an
        # ExpertPlex run, compiled).
        at = 0
        for r in queue:  # (iterating reads the list's items in place; ``queue[at]`` is a call)
            if r is req:
                break
            at += 1
        else:
            raise ValueError(f"request {req.id} is not in the queue")
        del queue[at]
        del keys[at]

    # ---- hooks for the KV moves (kv_moves.py) ----------------------------------------
    def adopt(self, req: Request) -> None:
        """``req`` is this replica's from now on (its KV is moving in)."""
        req.replica_id = self.replica_id
        self._by_id[req.id] = req

    def forget(self, req: Request) -> None:
        """``req`` is no longer this replica's (it was handed off)."""
        del self._by_id[req.id]

    def add_load_tokens(self, num_tokens: int) -> None:
        self._load_tokens += num_tokens

    def pass_on(self, req: Request, dst: int | None) -> None:
        """``req`` left (its KV still here until moved): the cluster sends it to ``dst``
        (None: the decode router picks)."""
        if self.on_handoff is None:
            raise PlanError(f"replica {self.replica_id} hands request {req.id} off, but it "
                            f"is not part of a cluster that can move it")
        self.on_handoff(self, req, dst)

    def join_running(self, req: Request) -> None:
        """``req``'s KV is in place here (moved or swapped in): it joins the running batch
        at the next step (or, if it was aborted on the way, leaves now)."""
        self.interrupt()
        req.state = RUNNING
        req.num_lookahead_tokens = self._lookahead
        self.num_entered += 1
        if req.abort_reason is not None:
            self._free_and_end(req)  # (its tokens never entered the load counter here)
            return
        self._load_tokens += req.num_tokens - req.num_computed_tokens
        if not self._is_decoding(req):
            self._num_prefilling += 1
        self._enqueue(self.running, self._running_keys, req)
        self.wake()

    def leave_running(self, req: Request, verb: str) -> None:
        """Take running ``req`` out of the batch (``verb`` names why, for errors)."""
        if req.state != RUNNING:
            raise PlanError(f"plan {verb} request {req.id}, which is {_state_name(req.state)}")
        self._dequeue(self.running, self._running_keys, req)
        if not self._is_decoding(req):
            self._num_prefilling -= 1

    @staticmethod
    def _is_decoding(req: Request) -> bool:
        return req.num_output_tokens > 0 and req.num_computed_tokens == req.num_tokens - 1

    def regroup(self, step_model: StepTimeModel, num_kv_blocks: int) -> None:
        """Take a new step model and KV capacity between steps (an instance group gave this
        member other instances, ``groups.py``). Shrinking evicts unreferenced cached
        prefixes first; the blocks requests hold must still fit."""
        if self._step is not None:
            raise PlanError(f"replica {self.replica_id} regrouped in the middle of a step")
        kv = self.kv
        delta = num_kv_blocks - kv.num_blocks
        if delta < 0:
            if kv.num_available_blocks < -delta:
                raise PlanError(f"group shrinks replica {self.replica_id} to {num_kv_blocks} "
                                f"KV blocks, but its requests hold {kv.num_used_blocks}")
            kv.take_blocks(-delta)
        else:
            kv.num_free_blocks += delta
        kv.num_blocks = num_kv_blocks
        self.step_model = step_model
        # A member goes back to the degrees it had, again and again: its windows for each
        # step model are kept, with the decode terms they read by batch size and the cap
        # they adapted (nothing else in them outlives a window; the cap changes speed, not
        # results). Building them anew was 1.4% of a LoongServe run on Mixed lengths.
        windows = self._windows_by_model.get(id(step_model))
        if windows is None:
            windows = DecodeWindows(kv, step_model, self._next_input_hint_s, self._timeline)
            self._windows_by_model[id(step_model)] = windows
        self._windows = windows

    # ---- step phase 1: plan ----------------------------------------------------------
    def wake_up(self) -> None:
        """Handler of ``WAKE_UP``: the idle replica starts stepping (unless a group holds it
        meanwhile: the group wakes it again once it has changed its instances)."""
        if self.group_hold is not None:
            self.busy = False
            if self.shared is not None:
                self.shared.announce()
            return
        self._start_step()

    @property
    def has_input_hint(self) -> bool:
        """Whether its windows know when its next input may come (``set_input_hint``)."""
        return self._next_input_hint_s is not None

    def set_input_hint(self, next_input_s: Callable[[], float]) -> None:
        """Let its windows stop at ``next_input_s()`` (the next input that may cut them),
        instead of being priced further and cut back there: speed only, a window may stop
        early anywhere."""
        self._next_input_hint_s = next_input_s
        self._windows.next_input_hint_s = next_input_s
        for windows in self._windows_by_model.values():  # (a group member's other degrees)
            windows.next_input_hint_s = next_input_s

    def peek_window(self, exact: bool = True) -> tuple[int, int, int] | None:
        """(decode steps each running request has done, fewest and most blocks they have
        taken) beyond what their fields and the KV cache show, at now: a window in flight
        read without cutting it (``DecodeWindows.peek``: the blocks exact or bounds; zeros
        when none). None: read it through ``interrupt``."""
        step = self._step
        if step is None or step.window is None:
            return (0, 0, 0) if step is None or step.run is None else None
        return self._windows.peek(step, self.sim.now_s, exact)

    @property
    def at_boundary(self) -> bool:
        """No step is in flight (a group may change this member's instances now)."""
        return self._step is None

    def holds(self, request_id: int) -> bool:
        """Is the request queued here (waiting, running, or its KV moving through)?"""
        return request_id in self._by_id

    def take_waiting(self, request_id: int) -> Request | None:
        """Take a waiting request out (to queue it elsewhere; it has no KV here), or None."""
        req = self._by_id.get(request_id)
        if req is None or req.state != WAITING:
            return None
        self.interrupt()
        self._dequeue(self.waiting, self._waiting_keys, req)
        self.forget(req)
        self._load_tokens -= req.num_tokens - req.num_computed_tokens
        return req

    def evict_all(self) -> list[Request]:
        """Take every waiting and running request out now, for an elastic cluster to queue
        elsewhere: a running one leaves the batch and its KV is dropped (its work in the
        step in progress and since its last admission is lost, counted as recomputed, as a
        preemption by recompute). Requests whose KV is moving (swaps, handoffs) stay."""
        self.interrupt()
        out: list[Request] = []
        for req in list(self.running):
            self.leave_running(req, "re-queues")
            self._drop_from_step(req)
            self.kv.release(req)
            self._load_tokens -= req.num_tokens - req.num_computed_tokens
            req.num_recomputed_tokens += req.num_computed_tokens - req.num_prefix_hit_tokens
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            req.state = WAITING
            self.forget(req)
            out.append(req)
        for req in list(self.waiting):
            taken = self.take_waiting(req.id)
            assert taken is not None
            out.append(taken)
        return out

    def abort(self, request_id: int, reason: str) -> bool:
        """End a request now, before it finishes (its client left): a waiting one leaves the
        queue; a running one leaves the batch and frees its KV at once, and its tokens in the
        step in progress are not committed (a cut window first settles the steps before
        now). It is recorded as aborted with ``reason`` (``Recorder.aborted``) and a source
        that wants finishes is told (``req.state == ABORTED``). A request whose KV is moving
        (swap, handoff, a reload from host) is aborted when its KV lands. False if the request
        is not here."""
        # Settled first: a request that a window in flight finished before now is gone
        # (it was still listed here until the window settled).
        self.interrupt()
        req = self._by_id.get(request_id)
        if req is None or req.abort_reason is not None:
            return False
        req.abort_reason = reason
        if req.state == WAITING:
            self._dequeue(self.waiting, self._waiting_keys, req)
            self._load_tokens -= req.num_tokens - req.num_computed_tokens
            self._end_aborted(req)
        elif req.state == RUNNING:
            self.leave_running(req, "aborts")
            self._drop_from_step(req)
            self._load_tokens -= req.num_tokens - req.num_computed_tokens
            self._free_and_end(req)
        return True

    def _drop_from_step(self, req: Request) -> None:
        """Take running ``req`` out of the step in progress (its work there is lost)."""
        step = self._step
        if step is None:
            return
        if req in step.decodes:
            step.decodes.remove(req)
            step.num_tokens -= 1
            return
        for i, (r, n) in enumerate(step.chunks):
            if r is req:
                del step.chunks[i]
                step.num_tokens -= n
                return

    def _free_and_end(self, req: Request) -> None:
        """Aborted ``req`` is out of the batch (or never joined it): free its KV, end it."""
        self.kv.release(req)
        self._end_aborted(req)
        if self.moves.incoming:  # KV waiting to move in may fit now
            self.moves.start_incoming()
        self.wake()

    def _end_aborted(self, req: Request) -> None:
        del self._by_id[req.id]
        req.state = ABORTED
        req.finish_s = self.sim.now_s
        self.recorder.on_abort(self.replica_id, req)
        if self.on_finish is not None:
            self.on_finish(req)

    def migrate_at_boundary(self, request_id: int, dst: int) -> None:
        """Move a running request and its KV to replica ``dst`` at the next step boundary (a
        controller's verb; a policy says ``migrate`` in its plan instead). One that has
        finished or left by then is ignored."""
        self.interrupt()
        self._migrations[request_id] = dst
        self.wake()

    def _apply_migrations(self) -> None:
        migrations, self._migrations = self._migrations, {}
        for rid, dst in migrations.items():
            req = self._by_id.get(rid)
            if req is not None and req.state == RUNNING:
                self._migrate(req, dst)

    def _start_step(self) -> None:
        shared = self.shared
        if shared is None:
            self._next_step()
            return
        # Replicas waiting on this one's steps (``StepPlan.wait_for_co_resident``) plan again
        # once it has started its next step, or stopped.
        shared.stop_waiting()
        self._next_step()
        shared.announce()

    def _next_step(self) -> None:
        if self._migrations:
            self._apply_migrations()
        running = self.running
        if not running:
            if not self.waiting and not self.swapped:
                self.busy = False
                if self.on_idle is not None:
                    self.on_idle(self)
                return
        elif (self._decode_all_when_idle and not self.waiting and not self.swapped
              and not self._num_prefilling and len(running) <= self.max_batched_tokens
              and self._open_idle_window()):
            return
        now_s = self.sim.now_s
        # A plan that only preempts frees blocks for the next one, at once, and one that only
        # re-keys re-sorts the queues: plan again (at most once per running request, then it
        # is a policy bug).
        for _ in range(len(running) + 2):
            plan = self.batch_policy.plan(self.view, now_s)
            step = self._apply(plan, now_s)
            if step is not _REPLAN:
                break
        else:
            raise PlanError(f"{type(self.batch_policy).__name__} keeps planning preemptions "
                            f"and no tokens at {now_s} s")
        if step is not None:
            rule = plan.repeat_rule
            if rule is not None and (plan.preempt or plan.swap_out or plan.swap_in
                                     or plan.migrate):
                rule = None  # a rule covers plans that only decode
            self._execute(step, now_s, plan.repeats, rule)

    def _open_idle_window(self) -> bool:
        """Nothing waits and every running request decodes: the plan is known (the policy
        said so), so open a window without planning, if the first step's blocks are free."""
        step = Step(self.sim.now_s, self.running.copy())
        # A source told of finishes may send a request at a finish: stop there.
        # Past finishes only when nobody must hear of them at once: a request source, KV
        # queued to move in here (a finish may make room for it), or the other members of a
        # prefix pool (a finish gives back the blocks it borrowed from them).
        through = (self.on_finish is None and self.until_s == math.inf
                   and not self.moves.incoming and self.kv.prefix.peers is None)
        shared = self.shared
        beside = False
        held: StepsHeld | None = None
        if shared is not None:
            if shared.others_waiting():
                if shared.rule_waiter() is None or self.speculative is not None:
                    return False  # one woken at this step would cut the window back at once
                held = shared.steps_held  # (it sleeps through the steps its rule holds)
            if not shared.alone():
                # Its steps' length depends on the others: a window only beside one job
                # (``beside.py``), else one step at a time, as jobs.
                if self.speculative is not None or not shared.can_window_beside():
                    return False
                beside = True
        if beside:
            assert shared is not None
            if shared.open_beside(self._windows, step, self.until_s, through) is None:
                return False
        elif self._windows.open(step, self.until_s, through, held=held) is None:
            return False
        elif shared is not None:
            shared.hold()
        if self.debug:
            self._check_idle_promise(step.decodes)
        step.num_running = len(step.decodes)
        self._note_finishes(step)
        self.busy = True
        self._step = step
        self.schedule_end(step, step.end_s)
        return True

    def _check_idle_promise(self, decodes: list[Request]) -> None:
        """Debug: the policy's plan must be what ``decodes_all_when_idle`` promised."""
        plan = self.batch_policy.plan(self.view, self.sim.now_s)
        if (plan.preempt or plan.swap_out or plan.swap_in or plan.migrate
                or dict(plan.tokens_by_request) != {r.id: 1 for r in decodes}):
            raise PlanError(
                f"{type(self.batch_policy).__name__} declares decodes_all_when_idle, but with "
                f"nothing waiting it planned {plan} instead of one token for each running "
                f"request")

    # ---- step phase 2: apply ---------------------------------------------------------
    def _apply(self, plan: StepPlan, now_s: float) -> Step | None:
        """Apply ``plan``: its verbs, then admissions and block allocations, all checked.
        Returns the step to execute, or None when the replica sleeps."""
        for rid in plan.rekey:
            self._rekey(self._lookup(rid, plan))
        for rid in plan.preempt:
            self._preempt(self._lookup(rid, plan))
        moves = self.moves
        for rid in plan.swap_out:
            moves.swap_out(self._lookup(rid, plan))
        for rid, dst in plan.migrate:
            self._migrate(self._lookup(rid, plan), dst)
        for rid in plan.swap_in:
            moves.swap_in(self._lookup(rid, plan))
        step = Step(now_s)
        kv = self.kv
        self._plan_evicted = False
        total = 0
        all_decode = (not plan.preempt and not plan.swap_out and not plan.migrate
                      and len(plan.tokens_by_request) == len(self.running))
        by_id, decodes, chunks = self._by_id, step.decodes, step.chunks
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        # Plans name the running requests in batch order, then admissions (``serve_running``,
        # ``admit_waiting``): take a request from the batch when it is the next one there,
        # else look it up (a lookup compares keys in a dict of every queued request: 9% of
        # a StreamRL run's CPU). The same request either way: ids are unique here.
        running = self.running
        num_running = len(running)
        at = 0
        # Hot loop (once per request per step).
        for rid, num_new in plan.tokens_by_request.items():
            if at < num_running and running[at].id == rid:
                req = running[at]
                at += 1
            else:
                found = by_id.get(rid)
                if found is None:
                    raise PlanError(f"plan names unknown request {rid}: {plan}")
                req = found
            state = req.state
            if state != RUNNING:
                if state != WAITING:
                    raise PlanError(f"plan gives tokens to request {rid}, which is "
                                    f"{_state_name(state)}: {plan}")
                self._admit(req)
                all_decode = False
            todo = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            if not 0 < num_new <= todo:
                raise PlanError(f"request {rid}: {num_new} tokens planned, {todo} computable")
            needed = blocks_short(req, req.num_computed_tokens + num_new, bs, per_entry)
            if needed > 0:
                if needed <= kv.num_free_blocks:  # KVCache.allocate without eviction, inlined
                    kv.num_free_blocks -= needed
                    req.num_private_blocks += needed
                else:
                    kv.allocate(req, needed)
                    self._plan_evicted = True
            if todo == 1 and req.num_output_tokens > 0:
                decodes.append(req)
            else:
                chunks.append((req, num_new))
                all_decode = False
            total += num_new
        if total > self.max_batched_tokens:
            raise PlanError(f"plan computes {total} tokens, budget {self.max_batched_tokens}")
        if plan.wait_for_co_resident:
            shared = self.shared
            if total or plan.preempt or plan.swap_out or plan.swap_in or plan.migrate:
                raise PlanError(f"a plan that waits for co-resident replicas does nothing "
                                f"else: {plan}")
            if shared is None or not shared.wait(plan.wait_rule):
                raise PlanError(f"plan waits for co-resident replicas, but none shares "
                                f"replica {self.replica_id}'s resource or runs a step at "
                                f"{now_s} s: nothing would wake it")
            self.busy = False
            self._step = None
            return None
        if total == 0:
            if (plan.preempt or (plan.rekey and not (
                    plan.swap_out or plan.swap_in or plan.migrate))) and self.waiting:
                return _REPLAN
            moving = plan.swap_out or plan.swap_in or plan.migrate or moves.swaps_in_flight()
            held = (moves.holds_blocks_for_others()
                    or (self.kept is not None and self.kept.holds_blocks())
                    or bool(self.kv.prefix.lent))
            if moving or (held and not self.running):
                # The plan waits for blocks that transfers still hold (outgoing KV, incoming
                # KV, swaps), that are kept for follow-ups or that other replicas' requests
                # borrowed from a prefix pool: sleep until one finishes, a time-to-live ends
                # or a borrower gives them back (its callback wakes us).
                self.busy = False
                self._step = None
                return None
            # Otherwise an empty plan would never make progress: a policy bug.
            raise PlanError(f"empty plan with {len(self.running)} running, "
                            f"{len(self.waiting)} waiting, {len(self.swapped)} swapped at "
                            f"{now_s} s")
        step.num_tokens = total
        step.num_running = len(self.running)
        step.num_waiting = len(self.waiting)
        step.is_all_decode = all_decode
        return step

    def _rekey(self, req: Request) -> None:
        """``req``'s ordering key changed: move it to its place under the new key (a
        request outside the queues gets its key when it enters one)."""
        state = req.state
        if state == RUNNING:
            self._dequeue(self.running, self._running_keys, req)
            self._enqueue(self.running, self._running_keys, req)
        elif state == WAITING:
            self._dequeue(self.waiting, self._waiting_keys, req)
            self._enqueue(self.waiting, self._waiting_keys, req)

    def _lookup(self, rid: int, plan: StepPlan) -> Request:
        req = self._by_id.get(rid)
        if req is None:
            raise PlanError(f"plan names unknown request {rid}: {plan}")
        return req

    def _admit(self, req: Request) -> None:
        self._dequeue(self.waiting, self._waiting_keys, req)
        self.kv.admit(req)
        if req.kv_from is not None and self.kept is not None:
            self.kept.on_admit(req)
        self._load_tokens -= req.num_prefix_hit_tokens
        req.state = RUNNING
        self._num_prefilling += 1
        self._enqueue(self.running, self._running_keys, req)
        if math.isnan(req.first_scheduled_s):
            req.first_scheduled_s = self.sim.now_s

    def _preempt(self, req: Request) -> None:
        """Evict by recompute: drop its KV; it re-enters the waiting queue."""
        self.leave_running(req, "preempts")
        self.kv.release(req)
        # Work since the last admission's prefix hit is lost (STYLE's conservation formula).
        req.num_recomputed_tokens += req.num_computed_tokens - req.num_prefix_hit_tokens
        self._load_tokens += req.num_computed_tokens
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.state = WAITING
        self._enqueue(self.waiting, self._waiting_keys, req)

    def _migrate(self, req: Request, dst: int) -> None:
        """Move a running request (and its KV) to replica ``dst``: it leaves the batch now,
        its blocks stay here until the transfer is done."""
        if self.on_handoff is None:
            raise PlanError(f"plan migrates request {req.id}, but replica {self.replica_id} "
                            f"is not part of a cluster that can move it")
        self.leave_running(req, "migrates")
        self.moves.hand_off(req, dst)

    # ---- step phase 3: execute -------------------------------------------------------
    def _execute(self, step: Step, now_s: float, repeats: bool = False,
                 rule: RepeatRule | None = None) -> None:
        self.busy = True
        # A prefix-pool member with requests waiting plans every step: what they cost to
        # admit moves with the whole pool (another member's cache, or a local eviction of a
        # block the pool still holds elsewhere, which makes it cheaper), so its plan need not
        # repeat. ``repeats``: this plan says it repeats (``StepPlan.repeats``), as every
        # all-decode plan of a fast-forward-safe policy does. ``rule``: the plan decodes
        # some running requests and repeats under the policy's rule (``StepPlan.repeat_rule``):
        # an exact window over those requests, the others paused (not with speculation,
        # whose windows this does not cover).
        if rule is not None and not step.chunks and step.decodes and (
                self._fast_forward_wanted and self.speculative is None):
            window = True
        else:
            rule = None
            window = step.is_all_decode and (
                self.fast_forward or (repeats and self._fast_forward_wanted))
        # A plan whose blocks evicted cached prefixes may be followed by another: a waiting
        # request that would have pinned an evicted entry (a prefix hit) now needs fewer
        # available blocks to be admitted, and may fit the next step.
        window = window and not (self.waiting and (self.kv.prefix.peers is not None
                                                   or self._plan_evicted))
        shared = self.shared
        beside = False  # a window beside the resource's one other job (``beside.py``)
        held: StepsHeld | None = None
        if shared is not None:
            if shared.others_waiting():
                if shared.rule_waiter() is None or self.speculative is not None:
                    window = False  # one woken at this step would cut the window back at once
                else:
                    held = shared.steps_held  # (it sleeps through the steps its rule holds)
            if shared.alone():
                shared.hold()
            elif window and (rule is None or not rule.per_step) and (
                    self.speculative is None and shared.can_window_beside()):
                beside = True  # (a rule whose policy reads each step: one step at a time)
            else:
                self._step = step
                shared.run_as_job(step)  # its STEP_END comes when the job is done
                return
        if window:
            if beside:
                assert shared is not None
                end_s = shared.open_beside(self._windows, step, self.until_s, rule=rule)
            else:
                end_s = self._windows.open(step, self.until_s, rule=rule, held=held)
            assert end_s is not None  # the plan took the first step's blocks
            self._note_finishes(step)
        else:
            step_s = self._single_step_time(step)
            end_s = now_s + step_s
            if self._chunk_runs and len(step.chunks) == 1 and (
                    self._mixed_runs or not step.decodes):
                end_s = self._open_run(step, step_s, end_s)
        step.end_s = end_s
        self._step = step
        self.schedule_end(step, end_s)

    def _open_run(self, step: Step, first_s: float, end_s: float) -> float:
        """A step whose plan the policy repeats (``chunk_runs.py``: a prompt's chunk of the
        budget that every other running request's decode leaves): make it a run of that
        request's chunks, if a second one joins. Returns the step's end."""
        req, n = step.chunks[0]
        decodes = step.decodes
        # (the prompt last in batch order: a request admitted by this very plan may sort
        # ahead of the decodes, and then takes the whole budget at the next step)
        running = self.running
        if (n + len(decodes) != self.max_batched_tokens
                or len(running) != len(decodes) + 1 or running[-1] is not req or self.swapped
                or self.moves.swaps_in_flight() or self.shared is not None
                or self.speculative is not None or self.on_idle is not None
                or self.kv.prefix.peers is not None
                or not chunk_runs.prices_purely(self.step_model)):
            return end_s
        run = chunk_runs.open_run(self.step_model, req, n, step.start_s, first_s,
                                  self.until_s, self.kv, self._run_cap.steps, self._spare_run,
                                  decodes, _context_tokens(decodes))
        self._spare_run = None
        if run is None:
            return end_s
        step.run = run
        return run.ends[-1]

    def _cut_run(self, step: Step, k: int) -> None:
        """Settle the run's steps before step ``k`` and leave step ``k``, in progress, as an
        ordinary step (its end and its start, its blocks taken)."""
        run = step.run
        assert run is not None
        step.run = None  # (settled once; the debug check's reads then need no settling)
        self._load_tokens -= run.settle(k, self.kv, self.recorder, self.replica_id,
                                        step.num_running, step.num_waiting, self.track_itl)
        if k:
            if self.debug:
                self._check_run_promise(run, run.ends[k - 1])
            self._pending_kv_seconds = run.start(k, self.kv)
            step.start_s = run.ends[k - 1]
        step.end_s = run.ends[k]

    def _check_run_promise(self, run: chunk_runs.ChunkRun, at_s: float) -> None:
        """Debug: at a run's step boundary, the policy's plan must be what
        ``prefill_chunks_repeat`` (``mixed_chunks_repeat``, with decodes) promised: the
        request's next chunk, and a token for each decode."""
        plan = self.batch_policy.plan(self.view, at_s)
        expected = {r.id: 1 for r in run.decodes}
        expected[run.req.id] = run.chunk
        if (plan.preempt or plan.swap_out or plan.swap_in or plan.migrate or plan.rekey
                or dict(plan.tokens_by_request) != expected):
            promise = "mixed_chunks_repeat" if run.decodes else "prefill_chunks_repeat"
            raise PlanError(
                f"{type(self.batch_policy).__name__} declares {promise}, but at {at_s} s, "
                f"with request {run.req.id}'s prompt rest over its chunk and "
                f"{len(run.decodes)} others decoding, it planned {plan} instead of "
                f"{expected}")

    @property
    def current_step(self) -> Step | None:
        """The step (or window) in progress, if any."""
        return self._step

    def schedule_step_end(self, step: Step) -> None:
        """``step``'s end is known now (a shared-resource job finished): its ``STEP_END``."""
        self.schedule_end(step, step.end_s)

    def schedule_end(self, step: Step, end_s: float) -> None:
        """``step``'s ``STEP_END`` at ``end_s``, the one that counts (``Step.end_gen``)."""
        step.end_event = self.sim.schedule(end_s, STEP_END, self._end_payload(step))

    def _end_payload(self, step: Step) -> tuple[Replica, Step, int]:
        """A new ``STEP_END`` payload for ``step``: the ones before go stale."""
        step.end_gen += 1
        return self, step, step.end_gen

    def set_pending_kv_seconds(self, kv_seconds: float) -> None:
        self._pending_kv_seconds = kv_seconds

    def _single_step_time(self, step: Step) -> float:
        chunks = [(n, r.num_computed_tokens) for r, n in step.chunks]
        kv_tokens = _context_tokens(step.decodes)
        model = self.step_model
        if isinstance(model, TableStepModel):  # (the usual model: a direct call when compiled)
            duration_s = model.step_time_s(chunks, len(step.decodes), kv_tokens)
        else:
            duration_s = model.step_time_s(chunks, len(step.decodes), kv_tokens)
        self._pending_kv_seconds = self.kv.num_used_blocks * duration_s
        return duration_s

    def _note_finishes(self, step: Step) -> None:
        """Take the window's finishers out of the load counter now, keeping their times so
        ``load_tokens`` stays exact until they come."""
        w = step.window
        assert w is not None
        if w.lazy:  # (noted as the window opened: its end times are not stored)
            ft = w.finish_times
        else:
            k, ends = step.num_steps, w.ends
            ft = [ends[left - 1] for left in w.lefts if left <= k]
        if ft:
            ft.sort()
            self._finish_times = ft
            self._load_tokens -= len(ft)

    # ---- fast-forward: exact state at any time ----------------------------------------
    def interrupt(self) -> None:
        """Make the replica's state exact at ``now``: cut an ongoing fast-forward window
        back to the step in progress, settle the steps before it, and leave that step as an
        ordinary one (committed at its end, as step by step)."""
        shared = self.shared
        if shared is not None and shared.wait_rule is not None:
            shared.drop_wait_rule()  # (asleep under a wait rule: its state is read or changes)
        step = self._step
        if step is None:
            return
        if step.window is None:
            run = step.run
            if run is not None:  # a chunk run: cut back to the step in progress
                # (its last step ends at or after now: its STEP_END has not come)
                k = run.steps_before(self.sim.now_s)
                self._cut_run(step, k)
                self._run_cap.cut(k)
                self._spare_run = run  # (its prices of the steps after k, for the next run)
                if k < len(run.ends) - 1:
                    step.end_event = self.sim.move_earlier(step.end_event, step.end_s,
                                                           STEP_END, self._end_payload(step))
            return
        if self._windows.cut(step, self.sim.now_s):
            # (its end event moves up: the one at the old end would only be popped and
            # ignored)
            step.end_event = self.sim.move_earlier(step.end_event, step.end_s, STEP_END,
                                                   self._end_payload(step))
        k = step.num_steps
        w = step.window
        if self.track_itl:
            self._windows.materialize(step, k)
            itl.on_window(step, k - 1, self.recorder)
        self._windows.settle(step, k - 1, self._finish_fn)
        last_start_s = w.ends[k - 2] if k > 1 else step.start_s
        rule = w.rule
        if not w.exact:
            # Its rows wait for the step in progress, which continues the last stretch: they
            # are written as one when it ends (``_commit_step``), as many rows as a window.
            self._carried = self._window_rows(step, k - 1, last_start_s)
        else:
            # An exact window: one row per step done, as step by step wrote them.
            self._write_step_rows(step, k - 1)
        if rule is not None:
            rule.ran(k, last_start_s)  # (the step in progress was planned too, by its count)
        # The step in progress: the decoders left, their blocks for it already taken.
        decodes, lefts = step.decodes, w.lefts
        remaining = [decodes[i] for i in range(len(decodes)) if lefts[i] >= k]
        self._load_tokens += len(self._finish_times) - len(w.finish_steps)
        self._finish_times = []
        step.start_s = last_start_s
        step.window = None
        step.decodes = remaining
        step.num_steps = 1
        step.num_tokens = len(remaining)
        if rule is None:  # (a rule's window: the running requests it pauses count)
            step.num_running = len(remaining)
        if w.exact:  # (nothing finished before its last step)
            self._pending_kv_seconds = self.kv.num_used_blocks * w.step_s[k - 1]
        else:
            self._pending_kv_seconds = self.kv.num_used_blocks * (step.end_s - step.start_s)
        if shared is not None and shared.in_window_beside():
            shared.end_beside(step)  # the shared resource as stepping has it now

    def _window_rows(self, step: Step, num_steps: int, horizon_s: float,
                     write: bool = False) -> list[Row]:
        """Timeline rows of a window's first ``num_steps`` settled steps: one per stretch
        with a fixed batch, the KV block-seconds on the last (a window lies in one bin).
        ``write``: record them now (as ``_write_rows`` would) and return none: no row tuple
        built only to be taken apart again."""
        w = step.window
        assert w is not None
        rows: list[Row] = []
        ends = w.ends
        n, a, t = len(step.decodes), 0, step.start_s
        # Running requests a repeat rule's window leaves paused count as running, as in step
        # by step's rows (none in an ordinary window: it decodes every running request).
        paused = step.num_running - n
        # tokens emitted through step x: one per decoder and step, or the speculative schedule
        emitted = self._windows.emitted_through if w.emitted0 else None
        waiting = step.num_waiting
        # Each stretch's row waits for the next one's: the last one takes the KV seconds.
        pending = False
        end_p = busy_p = 0.0
        steps_p = tokens_p = running_p = 0
        for left in w.finish_steps:
            if left > a:
                if pending:
                    self._window_row(rows, write, end_p, busy_p, 0.0, steps_p, tokens_p,
                                     running_p, waiting)
                pending = True
                end_p, busy_p, steps_p = ends[left - 1], ends[left - 1] - t, left - a
                running_p = n + paused
                tokens_p = (n * (left - a) if emitted is None
                            else emitted(step, left) - emitted(step, a))
                a, t = left, ends[left - 1]
            n -= 1
        if num_steps > a:
            if pending:
                self._window_row(rows, write, end_p, busy_p, 0.0, steps_p, tokens_p,
                                 running_p, waiting)
            pending = True
            end_p, busy_p, steps_p = horizon_s, horizon_s - t, num_steps - a
            running_p = n + paused
            tokens_p = (n * (num_steps - a) if emitted is None
                        else emitted(step, num_steps) - emitted(step, a))
        if pending:
            self._window_row(rows, write, end_p, busy_p, w.kv_seconds, steps_p, tokens_p,
                             running_p, waiting)
        return rows

    def _window_row(self, rows: list[Row], write: bool, end_s: float, busy_s: float,
                    kv_s: float, num_steps: int, num_tokens: int, num_running: int,
                    num_waiting: int) -> None:
        if write:
            self.recorder.on_step(self.replica_id, end_s, busy_s, kv_s, num_steps, num_tokens,
                                  self.kv.num_used_blocks, num_running, num_waiting)
        else:
            rows.append((end_s, busy_s, kv_s, num_steps, num_tokens, num_running, num_waiting))

    def _write_step_rows(self, step: Step, num_steps: int) -> None:
        """Timeline rows of an exact window's first ``num_steps`` settled steps, one per step
        with the values step by step records (``_commit_step``): its busy time, the blocks in
        use during it times the model's duration, the blocks in use after it."""
        w = step.window
        assert w is not None
        rec, rid = self.recorder, self.replica_id
        ends, step_s, used_by_step = w.ends, w.step_s, w.used_by_step
        num_tokens, num_running, num_waiting = len(step.decodes), step.num_running, step.num_waiting
        prev_s = step.start_s
        for j in range(num_steps):
            end_s, used = ends[j], used_by_step[j]
            if j == num_steps - 1 and w.at_end:
                used = self.kv.num_used_blocks  # after the finishes of its last step
            rec.on_step(rid, end_s, end_s - prev_s, used_by_step[j] * step_s[j], 1, num_tokens,
                        used, num_running, num_waiting)
            prev_s = end_s

    def _write_rows(self, rows: list[Row]) -> None:
        rec, rid, used = self.recorder, self.replica_id, self.kv.num_used_blocks
        for end_s, busy_s, kv_s, num_steps, num_tokens, num_running, num_waiting in rows:
            rec.on_step(rid, end_s, busy_s, kv_s, num_steps, num_tokens, used, num_running,
                        num_waiting)

    def flush_records(self) -> None:
        """Write rows still waiting for a step in progress (a run cut at ``until_s``)."""
        if self._carried:
            self._write_rows(self._carried)
            self._carried = []

    # ---- step phase 4: commit --------------------------------------------------------
    def finish_step(self, step: Step) -> None:
        """Handler of ``STEP_END``: commit the step's tokens at ``now`` and plan the next."""
        now_s = self.sim.now_s
        # (A stale end, of a window cut back or a step turned into a job, never comes here:
        # ``cluster._on_step_end`` drops it by its number, ``Step.end_gen``.)
        assert step is self._step and now_s == step.end_s
        self._step = None
        # (The event holds the step in its payload: a reference cycle, which nothing would
        # free while the run keeps the cyclic collector off.)
        step.end_event = None
        if self.shared is not None:
            self.shared.release()
        if step.window is not None:
            done = self._commit_window(step, now_s)
        else:
            run = step.run
            if run is not None:  # a chunk run's end: its last step commits as one
                self._run_cap.ended(len(run.ends))
                self._cut_run(step, len(run.ends) - 1)
            done = self._commit_step(step, now_s)
        if self.debug:
            self._check()
        if done and self.moves.incoming:  # KV waiting to move in may fit now
            self.moves.start_incoming()
        hold = self.group_hold
        if hold is not None:  # a group changes this member's instances at this boundary
            self.busy = False
            if self.shared is not None:
                self.shared.announce()
            hold(self)
            return
        self._start_step()

    def _commit_window(self, step: Step, now_s: float) -> list[Request]:
        """A window's end: settle it, finish its last step's requests, record it."""
        if self.track_itl:
            self._windows.materialize(step, step.num_steps)
            itl.on_window(step, step.num_steps, self.recorder)
        self._windows.settle(step, step.num_steps, self._finish_fn)
        w = step.window
        assert w is not None
        self._finish_times = []
        for r in w.at_end:
            self._finish(r, now_s)
        k = step.num_steps
        if not w.exact:
            self._window_rows(step, k, now_s, write=True)
        else:
            self._write_step_rows(step, k)
        if w.rule is not None:
            w.rule.ran(k, w.ends[k - 2] if k > 1 else step.start_s)
        return w.at_end

    def _commit_step(self, step: Step, now_s: float) -> list[Request]:
        """Commit one step's chunks and decodes; returns the requests it finished."""
        if self.track_itl:
            itl.on_step(step, now_s, self.recorder)
        kv = self.kv
        done: list[Request] = []
        handoff: list[Request] = []
        hands_off = self.role == "prefill"
        step_s = now_s - step.start_s
        for r, n in step.chunks:
            r.num_computed_tokens += n
            r.num_computed_tokens_total += n
            r.service_s += step_s
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
        if self.speculative is None:
            for r in step.decodes:
                r.num_computed_tokens += 1
                r.num_computed_tokens_total += 1
                r.service_s += step_s
                r.num_output_tokens += 1
                if r.num_output_tokens >= r.max_output_tokens:
                    done.append(r)
                    self._load_tokens -= 1
        else:
            step.num_tokens += self._commit_speculative(step.decodes, step_s, done)
        for r in done:
            self._finish(r, now_s)
        for r in handoff:
            # The request leaves the batch but its KV stays until the transfer is done.
            self._dequeue(self.running, self._running_keys, r)
            self.moves.hand_off(r, None)
        carried = self._carried
        if carried:
            # The rest of a window cut back: the step continues its last stretch.
            self._carried = []
            end_s, busy_s, kv_s, steps, tokens, running, waiting = carried[-1]
            # Merged only while the row stays in one timeline bin: the summary splits a row
            # across a bin edge by time, as one step's, and this step (re-timed, say, at a
            # shared resource's rate) may end past the edge the window's steps stopped by.
            if (running == step.num_running
                    and self._windows.next_edge_s(end_s - busy_s) >= now_s):
                carried[-1] = (now_s, busy_s + (now_s - step.start_s),
                               kv_s + self._pending_kv_seconds, steps + 1,
                               tokens + step.num_tokens, running, waiting)
                self._write_rows(carried)
                return done
            self._write_rows(carried)
        self.recorder.on_step(
            self.replica_id, now_s, now_s - step.start_s, self._pending_kv_seconds, 1,
            step.num_tokens, kv.num_used_blocks, step.num_running, step.num_waiting)
        return done

    def _commit_speculative(self, decodes: list[Request], step_s: float,
                            done: list[Request]) -> int:
        """Commit speculating decodes: each emits its scheduled tokens (at most what it has
        left); returns the tokens emitted beyond one per decode. The load counter is
        unchanged by a decode that goes on (as many computed as emitted)."""
        spec = self.speculative
        assert spec is not None
        extra = 0
        for r in decodes:
            left = r.max_output_tokens - r.num_output_tokens
            e = spec.next_tokens(r.num_output_tokens - 1)
            if e > left:
                e = left
            r.num_computed_tokens += e
            r.num_computed_tokens_total += e
            r.service_s += step_s
            r.num_output_tokens += e
            extra += e - 1
            if e == left:
                done.append(r)
                self._load_tokens -= 1
        return extra

    def _finish(self, r: Request, t: float) -> None:
        self._dequeue(self.running, self._running_keys, r)
        if r.context_hash_ids and self.kept is not None:
            self.kept.on_finish(r, t)
        else:
            self.kv.release(r)
        del self._by_id[r.id]
        r.finish_s = t
        r.state = FINISHED
        self.recorder.on_finish(self.replica_id, r)
        if self.on_finish is not None:
            self.on_finish(r)

    @staticmethod
    def _emit(r: Request, now_s: float, num: int, done: list[Request]) -> None:
        if r.num_output_tokens == 0:
            r.first_token_s = now_s
        r.num_output_tokens += num
        if r.num_output_tokens >= r.max_output_tokens:
            done.append(r)

    def _check(self) -> None:
        """Debug invariants: queue limits, states, the load counter and KV conservation."""
        assert len(self.running) + self.moves.num_reserved <= self.max_running_total
        decoding = sum(self._is_decoding(r) for r in self.running)
        assert self._num_prefilling == len(self.running) - decoding
        assert all(r.state == RUNNING for r in self.running)
        assert all(r.state == WAITING for r in self.waiting)
        self.moves.check_states()
        kept_held = []
        if self.kept is not None:
            self.kept.check_states()
            kept_held = self.kept.holdings()
        queued = self.running + self.waiting
        expected = sum(r.num_tokens - r.num_computed_tokens for r in queued)
        assert self._load_tokens == expected, (self._load_tokens, expected)
        held = [(r.num_private_blocks, r.hash_ids, r.num_cached_entries) for r in self.running]
        self.kv.check(held + self.moves.check_holdings() + kept_held)
        host = self.host
        if host is not None:
            on_host = self.moves.num_host_blocks() + (
                self.kept.num_host_blocks() if self.kept is not None else 0)
            assert host.num_free_blocks + on_host == host.num_blocks, "host blocks not conserved"


_REPLAN = Step(0.0)  # returned by _apply: the plan only preempted or re-keyed; plan again now


def _context_tokens(decodes: list[Request]) -> int:
    """The decodes' context tokens, all told (a step's decode attention is priced by it)."""
    total = 0
    for r in decodes:
        total += r.num_computed_tokens
    return total


def _state_name(state: int) -> str:
    return STATE_NAMES[state]
