"""Many replicas on one event loop: routing, and prefill/decode disaggregation.

Arrivals stream in one at a time; the router sends each to a replica of a ``mixed`` or
``prefill`` pool. In P/D, a request whose prefill finished is handed to a decode replica
chosen by the decode router: it waits in that replica's FIFO until the replica can reserve
KV blocks (and a running slot) for it, then its KV crosses the link (``KVLinkNetwork``), and
it joins the decode batch. The prefill replica keeps the KV until the transfer is done.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.core.simulator import Simulator
from fleetsim.metrics.recorder import Recorder, Records
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.kv_link import KVLinkNetwork
from fleetsim.serving.replica import EventKind, Replica
from fleetsim.serving.request import Request
from fleetsim.workloads.workload import Workload

ProgressFn = Callable[[float], None]  # called with simulated seconds now


class WorkloadRows:
    """A workload's columns as Python lists: one fresh ``Request`` per row (id = row index)
    without numpy's per-element cost."""

    def __init__(self, workload: Workload) -> None:
        self.arrival_s: list[float] = workload.arrival_s.tolist()
        self.prompt: list[int] = workload.num_prompt_tokens.tolist()
        self.output: list[int] = workload.num_output_tokens.tolist()
        self.hash_ids = workload.hash_ids
        self.priority: list[int] | None = (
            workload.priority.tolist() if workload.priority is not None else None)

    def request(self, i: int) -> Request:
        return Request(
            id=i, arrival_s=self.arrival_s[i], num_prompt_tokens=self.prompt[i],
            max_output_tokens=self.output[i],
            hash_ids=self.hash_ids[i] if self.hash_ids is not None else (),
            priority=self.priority[i] if self.priority is not None else 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSetup:
    """A pool as the engine needs it (built from a ``PoolConfig`` by ``run``)."""

    name: str
    role: str  # mixed | prefill | decode
    num_replicas: int
    step_model: StepTimeModel
    num_kv_blocks: int
    link_bw_bytes_per_s: float  # one replica's KV link (all its GPUs), one direction


class OnlyReplica:
    """The router of a one-replica cluster."""

    def route(self, view: Any, req: Request, now_s: float) -> int:
        return 0


@dataclass(slots=True)
class _View:
    replicas: Sequence[Any]
    rng: np.random.Generator


class _DecodeSlot:
    """A decode replica as the decode router sees it: its load includes the KV still
    queued for it or on its way in."""

    __slots__ = ("pending", "replica")

    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self.pending: deque[tuple[Replica, Request, Request]] = deque()

    @property
    def replica_id(self) -> int:
        return self.replica.replica_id

    @property
    def load_tokens(self) -> int:
        return self.replica.load_tokens + len(self.pending) + self.replica.num_reserved

    @property
    def running(self) -> Sequence[Request]:
        return self.replica.running

    @property
    def waiting(self) -> Sequence[Request]:
        return self.replica.waiting

    @property
    def kv(self) -> KVCache:
        return self.replica.kv


class Cluster:
    """Replicas of all pools, the routers and the KV link, bound to one simulator."""

    def __init__(
        self,
        sim: Simulator,
        pools: Sequence[PoolSetup],
        *,
        router: Any,
        decode_router: Any,
        rng: np.random.Generator,
        kv_bytes_per_token: float,
        link_latency_s: float,
        make_replica: Callable[..., Replica],
        hash_block_tokens: int | None,
        block_size: int,
        enable_prefix_caching: bool,
    ) -> None:
        self.sim = sim
        self.router = router
        self.decode_router = decode_router
        self.kv_bytes_per_token = kv_bytes_per_token
        self.replicas: list[Replica] = []
        self.pool_of: list[str] = []  # replica_id -> pool name
        entry: list[Replica] = []
        decode_slots: list[_DecodeSlot] = []
        bw: dict[int, float] = {}
        for pool in pools:
            for _ in range(pool.num_replicas):
                rid = len(self.replicas)
                kv = KVCache(pool.num_kv_blocks, block_size, hash_block_tokens,
                             enable_prefix_caching)
                replica = make_replica(
                    step_model=pool.step_model, kv=kv, replica_id=rid, role=pool.role,
                    on_prefill_done=self._on_prefill_done,
                    on_blocks_freed=self._on_blocks_freed if pool.role == "decode" else None)
                self.replicas.append(replica)
                self.pool_of.append(pool.name)
                bw[rid] = pool.link_bw_bytes_per_s
                if pool.role == "decode":
                    decode_slots.append(_DecodeSlot(replica))
                else:
                    entry.append(replica)
        self.entry_view = _View(entry, rng)
        self.decode_view = _View(decode_slots, rng)
        self._block_size = block_size
        self._entry_min_blocks = min(r.kv.num_blocks for r in entry)
        self._decode_min_blocks = min((s.kv.num_blocks for s in decode_slots), default=0)
        self._slot_of = {s.replica.replica_id: s for s in decode_slots}
        self.link = KVLinkNetwork(
            sim, egress_bw_bytes_per_s=bw, ingress_bw_bytes_per_s=bw, latency_s=link_latency_s,
            start_kind=EventKind.TRANSFER_START, check_kind=EventKind.TRANSFER_CHECK)

    def route(self, req: Request) -> None:
        """Send an arriving request to the replica the router picks, among those whose KV
        cache can hold it whole (routers never see a replica too small for the request)."""
        view = self._capable(self.entry_view, req, self._entry_min_blocks)
        i = self.router.route(view, req, self.sim.now_s)
        replica: Replica = view.replicas[i]
        replica.submit(req)

    def _capable(self, view: _View, req: Request, min_blocks: int) -> _View:
        """``view`` restricted to replicas that can hold ``req`` alone (usually all: the
        filter only runs when the request is bigger than the smallest replica)."""
        need = -(-(req.num_prompt_tokens + req.max_output_tokens) // self._block_size)
        if need <= min_blocks:
            return view
        return _View([r for r in view.replicas if r.kv.num_blocks >= need], view.rng)

    # ---- prefill/decode handoff ----------------------------------------------------------
    def _on_prefill_done(self, src: Replica, req: Request) -> None:
        req.handoff_s = self.sim.now_s
        moved = Request(
            id=req.id, arrival_s=req.arrival_s, num_prompt_tokens=req.num_prompt_tokens,
            max_output_tokens=req.max_output_tokens, hash_ids=req.hash_ids,
            priority=req.priority, num_computed_tokens=req.num_computed_tokens,
            num_output_tokens=req.num_output_tokens,
            num_prefix_hit_tokens=req.num_prefix_hit_tokens,
            num_computed_tokens_total=req.num_computed_tokens_total,
            num_recomputed_tokens=req.num_recomputed_tokens,
            num_preemptions=req.num_preemptions, handoff_s=req.handoff_s,
            prefill_replica_id=src.replica_id, first_scheduled_s=req.first_scheduled_s,
            first_token_s=req.first_token_s)
        view = self._capable(self.decode_view, moved, self._decode_min_blocks)
        i = self.decode_router.route(view, moved, self.sim.now_s)
        slot = view.replicas[i]
        slot.pending.append((src, req, moved))
        self._start_transfers(slot)

    def _on_blocks_freed(self, replica: Replica) -> None:
        self._start_transfers(self._slot_of[replica.replica_id])

    def _start_transfers(self, slot: _DecodeSlot) -> None:
        dst = slot.replica
        while slot.pending and dst.can_reserve_decode(slot.pending[0][2].num_computed_tokens):
            src, req, moved = slot.pending.popleft()
            dst.reserve_decode(moved)
            num_bytes = self.kv_bytes_per_token * moved.num_computed_tokens

            def done(src: Replica = src, req: Request = req, moved: Request = moved) -> None:
                src.release_handoff(req)
                moved.kv_transfer_s = self.sim.now_s - moved.handoff_s
                dst.accept_decode(moved)

            self.link.start(src.replica_id, dst.replica_id, num_bytes, done)


def simulate_cluster(
    workload: Workload,
    pools: Sequence[PoolSetup],
    *,
    router: Any,
    decode_router: Any,
    make_batch_policy: Callable[[], Any],
    order_key: Callable[[Request, float], tuple],
    rng: np.random.Generator,
    kv_bytes_per_token: float,
    link_latency_s: float,
    block_size: int,
    max_batched_tokens: int,
    max_running: int,
    enable_prefix_caching: bool = True,
    fast_forward: bool = True,
    debug: bool = False,
    until_s: float = math.inf,
    progress: ProgressFn | None = None,
    progress_every: int = 2000,
    windows_stop_at_arrivals: bool = True,
) -> tuple[Records, Cluster]:
    """Simulate ``workload`` on a cluster of ``pools``; returns records and the cluster.

    ``windows_stop_at_arrivals`` (one replica only) stops fast-forward windows at the next
    arrival instead of cutting them back when it comes: same results, less work.
    """
    sim = Simulator()
    recorder = Recorder()
    single = len(pools) == 1 and pools[0].num_replicas == 1 and windows_stop_at_arrivals

    def make_replica(**kw: Any) -> Replica:
        replica = Replica(
            sim, batch_policy=make_batch_policy(), order_key=order_key, recorder=recorder,
            max_batched_tokens=max_batched_tokens, max_running=max_running,
            fast_forward=fast_forward, debug=debug,
            # A lone replica knows its next input: the next arrival in the heap.
            next_input_hint_s=sim.peek_s if single else None, **kw)
        replica.until_s = until_s
        return replica

    cluster = Cluster(
        sim, pools, router=router, decode_router=decode_router, rng=rng,
        kv_bytes_per_token=kv_bytes_per_token, link_latency_s=link_latency_s,
        make_replica=make_replica,
        hash_block_tokens=workload.hash_block_tokens if workload.hash_ids is not None else None,
        block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    num_requests = len(workload)
    rows = WorkloadRows(workload)
    arrival_s = rows.arrival_s

    def on_arrival(i: int) -> None:
        cluster.route(rows.request(i))
        if i + 1 < num_requests:
            sim.schedule(arrival_s[i + 1], EventKind.ARRIVAL, i + 1)
        if progress is not None and i % progress_every == 0:
            progress(sim.now_s)

    sim.on(EventKind.ARRIVAL, on_arrival)
    sim.on(EventKind.STEP_END, lambda payload: payload[0].finish_step(payload[1]))
    sim.on(EventKind.WAKE_UP, Replica.wake_up)
    if num_requests:
        sim.schedule(arrival_s[0], EventKind.ARRIVAL, 0)
    # The loop allocates many short-lived objects and no reference cycles (reference
    # counting frees them all), while the cyclic collector would rescan the growing
    # per-request records again and again: about 8% of the run at scale. Off while it runs
    # and while the records become arrays.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.run(until_s)
        if progress is not None:
            progress(sim.now_s)
        return recorder.records(), cluster
    finally:
        if gc_was_enabled:
            gc.enable()
