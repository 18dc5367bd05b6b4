"""Many replicas on one event loop: a request source, routing, handoffs, controllers.

The components (see docs/engine.md for the picture): a ``RequestSource`` schedules arrivals
and hears of finishes; the router sends each arrival to a replica of a ``mixed`` or
``prefill`` pool; replicas step; the ``TransferService`` moves KV between replicas (P/D
handoff, migration) and to host memory (swap); controllers wake at times they choose and may
change policies. The cluster registers its own event handlers (arrival, step end, wake-up,
controller tick) on the simulator; ``simulate_cluster`` only wires the pieces.

P/D: a request whose prefill finished is handed to a decode replica chosen by the decode
router: it waits in that replica's incoming queue until blocks (and a running slot) can be
reserved for it, then its KV crosses the link, and it joins the decode batch. The prefill
replica keeps the KV until the transfer is done.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np

from fleetsim.core.simulator import Simulator
from fleetsim.errors import FleetsimInputError, PlanError
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.contract import ClusterView as RouterView
from fleetsim.serving.contract import (
    Controller as Controller,  # re-exported (it lived here)
)
from fleetsim.serving.contract import (
    MakeBatchPolicy,
    RequestSource,
    Router,
    SourceContext,
)
from fleetsim.serving.groups import GroupSetup, InstanceGroup
from fleetsim.serving.kv_cache import HostPool, KVCache
from fleetsim.serving.kv_keep import KV_EXPIRE, KVRetention, on_expire
from fleetsim.serving.kv_placement import KVPlacement
from fleetsim.serving.prefix_cache import EvictionKey, PrefixCache
from fleetsim.serving.recorder import OnlineMetrics, Recorder, Records
from fleetsim.serving.replica import STEP_END, WAKE_UP, Replica
from fleetsim.serving.request import Request
from fleetsim.serving.resources import SharedResources
from fleetsim.serving.settings import EngineSettings, PlugIns
from fleetsim.serving.shared_steps import SharedStepModel, shared_port
from fleetsim.serving.sources import WorkloadSource
from fleetsim.serving.speculative import Emission
from fleetsim.serving.transfers import TransferService, gpu_dma_endpoint, host_endpoint
from fleetsim.serving.views import ReplicaView
from fleetsim.serving.window import Step
from fleetsim.workloads.workload import Workload

ARRIVAL: Final = 10
CONTROLLER_TICK: Final = 5  # before anything else at the same time

ProgressFn = Callable[[float], None]  # called with simulated seconds now


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSetup:
    """A pool as the engine needs it (built from a ``PoolConfig`` by ``run``)."""

    name: str
    role: str  # mixed | prefill | decode
    num_replicas: int
    step_model: StepTimeModel
    num_kv_blocks: int
    link_bw_bytes_per_s: float  # one replica's KV link (all its GPUs), one direction
    num_host_kv_blocks: int = 0  # host-memory KV tier per replica (swap space)
    host_bw_bytes_per_s: float = math.inf  # one replica's PCIe link to host, one direction
    host_latency_s: float = 0.0  # setup latency of one GPU-host copy


class OnlyReplica:
    """The router of a one-replica cluster."""

    def route(self, view: RouterView, req: Request, now_s: float) -> int:
        return 0


@dataclass(slots=True)
class ClusterView:
    """What a router reads: the replicas it may choose from, and the routing random stream;
    for the entry router of a P/D cluster, also the decode replicas a call will move to
    (``next_stage``, for routers that plan both stages, as HexAGenT does)."""

    replicas: Sequence[ReplicaView]
    rng: np.random.Generator
    next_stage: Sequence[ReplicaView] = ()


class Cluster:
    """Replicas of all pools, the routers and the transfer service, on one simulator."""

    def __init__(
        self,
        sim: Simulator,
        pools: Sequence[PoolSetup],
        *,
        router: Router,
        decode_router: Router | None,
        rng: np.random.Generator,
        kv_bytes_per_token: float,
        link_latency_s: float,
        make_replica: Callable[..., Replica],
        hash_block_tokens: int | None,
        block_size: int,
        enable_prefix_caching: bool,
        recorder: Recorder,
        eviction_key: EvictionKey | None = None,
        kv_retention: KVRetention | None = None,
        frontend_overhead_s: float = 0.0,
    ) -> None:
        self.sim = sim
        self.frontend_overhead_s = frontend_overhead_s
        self.router = router
        self.decode_router = decode_router
        self.recorder = recorder
        self.transfers = TransferService(sim, latency_s=link_latency_s)
        # Capacities that replicas of several pools share (an expert pool's SMs): made when a
        # pool's step model draws on one (``shared_steps.py``).
        self.resources: SharedResources | None = None
        self.replicas: list[Replica] = []
        self.pool_of: list[str] = []  # replica_id -> pool name
        self.source: RequestSource | None = None
        self.controllers: list[Controller] = []
        # A cluster whose replicas are the instances of one group (``groups.py``) sends
        # every arrival to the group's queue: its planner assigns it.
        self.group: InstanceGroup | None = None
        self._next_request_id = 0
        # Times of the arrivals scheduled and not yet come, a heap: on a shared resource the
        # next one is where a replica holding the resource alone is cut (the prefill it
        # brings starts a job there), so its windows are priced only that far.
        self._arrivals_s: list[float] = []
        self._make_replica = make_replica
        self._block_size = block_size
        self._kv_args = (hash_block_tokens, enable_prefix_caching, eviction_key)
        self._kv_bytes_per_token = kv_bytes_per_token
        self._kv_retention = kv_retention
        entry: list[ReplicaView] = []
        decode: list[ReplicaView] = []
        for pool in pools:
            for _ in range(pool.num_replicas):
                replica = self.new_replica(pool, pool.role)
                (decode if pool.role == "decode" else entry).append(replica.view)
        recorder.pool_of = self.pool_of
        # Prefix KV put into a replica from outside it (a pool's reads, a migrated context)
        # goes through this service, never by hand.
        self.kv_placement = KVPlacement(self.replicas, self.transfers, kv_bytes_per_token)
        self.entry_view = ClusterView(entry, rng, decode)
        self.decode_view = ClusterView(decode, rng)
        self.set_serving(entry, decode)
        # A router that manages more than the choice (a cluster-wide prefix pool) is given
        # the cluster once, before any arrival.
        attach = getattr(router, "attach", None)
        if attach is not None:
            attach(self)
        sim.on(ARRIVAL, self._on_arrival, "arrival")
        sim.on(STEP_END, _on_step_end, "step_end")
        sim.on(WAKE_UP, Replica.wake_up, "wake_up")
        sim.on(CONTROLLER_TICK, self._on_tick, "controller_tick")
        sim.on(KV_EXPIRE, on_expire, "kv_expire")

    def new_replica(self, pool: PoolSetup, role: str) -> Replica:
        """Build one replica of ``pool`` in ``role`` with the next id, its KV cache and its
        transfer endpoints (the constructor's, and an elastic cluster's at run time). It is
        in no routing view until ``set_serving`` puts it there."""
        rid = len(self.replicas)
        hash_block_tokens, enable_prefix_caching, eviction_key = self._kv_args
        kv = KVCache(pool.num_kv_blocks, self._block_size, hash_block_tokens,
                     enable_prefix_caching, PrefixCache(eviction_key))
        host = None
        if pool.num_host_kv_blocks:
            # Swaps cross the replica's PCIe link (the host endpoint's bandwidth),
            # not its KV link.
            host = HostPool(pool.num_host_kv_blocks)
            self.transfers.add_endpoint(host_endpoint(rid), pool.host_bw_bytes_per_s,
                                        pool.host_bw_bytes_per_s)
            self.transfers.add_endpoint(gpu_dma_endpoint(rid), math.inf, math.inf)
        self.transfers.add_endpoint(rid, pool.link_bw_bytes_per_s, pool.link_bw_bytes_per_s)
        shared = None
        if isinstance(pool.step_model, SharedStepModel):
            if self.resources is None:
                self.resources = SharedResources(self.sim)
            shared = shared_port(self.resources, pool.step_model, pool.name, rid)
        replica = self._make_replica(
            step_model=pool.step_model, kv=kv, replica_id=rid, role=role,
            pool=pool.name, on_handoff=self._on_handoff,
            transfers=self.transfers, host=host, kv_bytes_per_token=self._kv_bytes_per_token,
            host_latency_s=pool.host_latency_s,
            # Only a mixed replica takes the follow-up that would reuse kept KV (in
            # P/D a call's KV ends on a decode replica, its follow-up prefills
            # elsewhere).
            retention=self._kv_retention if role == "mixed" else None, shared=shared)
        if self.source is not None and self.source.wants_finishes:
            replica.on_finish = self._on_finish
        if shared is not None and not replica.has_input_hint:
            # Speed only: a window may stop early anywhere (and a lone replica's stops at
            # the next event of any kind already).
            replica.set_input_hint(self.next_arrival_s)
        self.replicas.append(replica)
        self.pool_of.append(pool.name)
        return replica

    def set_serving(self, entry: Sequence[ReplicaView], decode: Sequence[ReplicaView]) -> None:
        """The replicas the routers choose from from now on: ``entry`` (mixed or prefill)
        and ``decode`` (an elastic cluster changes them as replicas join, leave or flip)."""
        if not entry:
            raise ValueError("a cluster needs at least one serving entry replica")
        self.entry_view.replicas = list(entry)
        self.entry_view.next_stage = list(decode)
        self.decode_view.replicas = self.entry_view.next_stage
        self._entry_min_blocks = min(v.num_kv_blocks for v in entry)
        self._decode_min_blocks = min((v.num_kv_blocks for v in decode), default=0)

    # ---- the source ------------------------------------------------------------------
    @property
    def now_s(self) -> float:
        return self.sim.now_s

    def new_request_id(self) -> int:
        rid = self._next_request_id
        self._next_request_id = rid + 1
        return rid

    def submit_at(self, at_s: float, req: Request) -> None:
        """Schedule ``req``'s arrival (the source's verb): sent at ``at_s``, it reaches the
        engine ``frontend_overhead_s`` later (``req.arrival_s`` stays the send time, so
        latencies include the front end; a constant shifts every arrival alike, so TTFT and
        E2E grow by exactly it on an open-loop workload and TPOT is unchanged)."""
        arrives_s = at_s + self.frontend_overhead_s
        heapq.heappush(self._arrivals_s, arrives_s)
        self.sim.schedule(arrives_s, ARRIVAL, req)

    def next_arrival_s(self) -> float:
        """When the next scheduled arrival comes (inf when none is scheduled)."""
        return self._arrivals_s[0] if self._arrivals_s else math.inf

    def attach_source(self, source: RequestSource) -> None:
        self.source = source
        if source.wants_finishes:
            for replica in self.replicas:
                replica.on_finish = self._on_finish
        source.start(self)

    def _on_arrival(self, req: Request) -> None:
        heapq.heappop(self._arrivals_s)  # (arrivals come in time order: this one's is first)
        self.route(req)
        source = self.source
        if source is not None:  # (requests may also be submitted without one)
            source.on_arrival(req, self)

    def _on_finish(self, req: Request) -> None:
        source = self.source
        assert source is not None
        source.on_finish(req, self)

    # ---- routing ---------------------------------------------------------------------
    def route(self, req: Request) -> None:
        """Send an arriving request to the replica the router picks, among those whose KV
        cache can hold it whole (routers never see a replica too small for the request)."""
        if self.group is not None:
            self.group.submit(req)
            return
        view = self._capable(self.entry_view, req, self._entry_min_blocks)
        i = self.router.route(view, req, self.sim.now_s)
        self.replicas[self._chosen(view, i, self.router, "cluster.router")].submit(req)

    @staticmethod
    def _chosen(view: ClusterView, i: Any, router: Router, where: str) -> int:
        n = len(view.replicas)
        if type(i) is not int:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                raise FleetsimInputError(
                    f"{where} ({type(router).__name__})", i,
                    f"route() must return an int index into view.replicas, 0 to {n - 1}")
            i = int(i)
        if not 0 <= i < n:
            raise FleetsimInputError(
                f"{where} ({type(router).__name__})", i,
                f"route() must return an index into view.replicas, 0 to {n - 1}")
        return view.replicas[i].replica_id

    def _capable(self, view: ClusterView, req: Request, min_blocks: int) -> ClusterView:
        """``view`` restricted to replicas that can hold ``req`` alone (usually all: the
        filter only runs when the request is bigger than the smallest replica)."""
        need = -(-(req.num_prompt_tokens + req.max_output_tokens) // self._block_size)
        if need <= min_blocks:
            return view
        capable = [r for r in view.replicas if r.num_kv_blocks >= need]
        if not capable:
            raise FleetsimInputError(
                f"workload request {req.id}", f"{need} KV blocks",
                "no replica it can be routed to holds that many; use bigger replicas or "
                "filter the workload")
        return ClusterView(capable, view.rng, view.next_stage)

    # ---- handoffs: P/D and migration ---------------------------------------------------
    def _on_handoff(self, src: Replica, req: Request, dst: int | None) -> None:
        """``src`` handed ``req`` off (its KV stays there until moved): to ``dst``, or, after
        a prefill, to the decode replica the decode router picks."""
        if req.prefill_replica_id is None:
            req.prefill_replica_id = src.replica_id
        if dst is None:
            view = self._capable(self.decode_view, req, self._decode_min_blocks)
            router = self.decode_router
            assert router is not None  # a cluster with a decode pool is given its router
            i = router.route(view, req, self.sim.now_s)
            dst = self._chosen(view, i, router, "cluster.decode_router")
        elif not 0 <= dst < len(self.replicas) or dst == src.replica_id:
            raise PlanError(f"plan migrates request {req.id} to replica {dst}: not another "
                            f"replica of this cluster (0 to {len(self.replicas) - 1})")
        self.replicas[dst].moves.queue_incoming(src, req)

    # ---- controllers -----------------------------------------------------------------
    def add_controller(self, controller: Controller) -> None:
        """Attach ``controller`` (call before the run): it wakes at the times it returns,
        and online metrics are kept from now on for it to read."""
        self.recorder.keep_online_metrics()
        self.controllers.append(controller)
        first = controller.start(self)
        if first is not None:
            self.sim.schedule(max(first, self.sim.now_s), CONTROLLER_TICK, controller)

    def _on_tick(self, controller: Controller) -> None:
        nxt = controller.on_tick(self, self.sim.now_s)
        if nxt is not None:
            if not nxt > self.sim.now_s:
                raise ValueError(f"{type(controller).__name__}.on_tick must return a later "
                                 f"time than now ({self.sim.now_s} s), got {nxt}")
            self.sim.schedule(nxt, CONTROLLER_TICK, controller)

    def set_policies(self, replica_ids: Sequence[int] | None = None, *,
                     make_batch_policy: MakeBatchPolicy | None = None,
                     order_key: Callable[[Request, float], tuple] | None = None) -> None:
        """Change the batching policy (one fresh instance per replica) and/or the ordering
        of ``replica_ids`` (all when None) now."""
        for i in (range(len(self.replicas)) if replica_ids is None else replica_ids):
            self.replicas[i].set_policies(
                make_batch_policy() if make_batch_policy is not None else None, order_key)

    def abort(self, request_id: int, reason: str) -> bool:
        """End a request now wherever it is queued (``Replica.abort``: out of the batch,
        its KV freed, recorded as aborted with ``reason``). False if no replica holds it
        (not arrived yet, already finished or aborted)."""
        held = False
        for replica in self.replicas:
            if replica.holds(request_id):
                held = replica.abort(request_id, reason) or held
        return held

    def migrate(self, request_ids: Sequence[int], dst: int) -> None:
        """Move these requests (wherever they are queued) to replica ``dst``: a waiting one at
        once, a running one at its replica's next step boundary, its KV over the transfer
        service as a plan's ``migrate`` sends it (RLHFuse moves the generation tail this
        way)."""
        if not 0 <= dst < len(self.replicas):
            raise ValueError(f"migrate: no replica {dst} (0 to {len(self.replicas) - 1})")
        target = self.replicas[dst]
        for replica in self.replicas:
            if replica is target:
                continue
            for rid in request_ids:
                if not replica.holds(rid):
                    continue
                waiting = replica.take_waiting(rid)  # no KV yet: it just queues there
                if waiting is not None:
                    target.submit(waiting)
                else:
                    replica.migrate_at_boundary(rid, dst)

    @property
    def views(self) -> list[ReplicaView]:
        return [r.view for r in self.replicas]

    @property
    def metrics(self) -> OnlineMetrics:
        """What has finished so far, per pool (kept once a controller is attached)."""
        return self.recorder.keep_online_metrics()


def _on_step_end(payload: tuple[Replica, Step, int]) -> None:
    if payload[2] == payload[1].end_gen:  # (else a stale end: the step's end moved since)
        payload[0].finish_step(payload[1])


# The finest default timeline bin (arrivals 2e-311 s apart gave bins of a subnormal width,
# and the count of bins to a time overflowed; a microsecond is far under any step).
MIN_DEFAULT_BIN_S = 1e-6


def default_timeline(workload: Workload, until_s: float) -> tuple[float, float]:
    """Timeline bins for a run: from the first arrival, the arrivals' span / 120 (no fixed
    bins when the requests arrive at once, or within 120 microseconds: the summary then
    splits the makespan)."""
    if not len(workload):
        return 0.0, math.inf
    first = float(workload.arrival_s[0])
    last = min(float(workload.arrival_s[-1]), until_s)
    bin_s = (last - first) / 120
    return first, (bin_s if bin_s >= MIN_DEFAULT_BIN_S else math.inf)


def build_cluster(
    sim: Simulator,
    pools: Sequence[PoolSetup],
    settings: EngineSettings,
    plugins: PlugIns,
    *,
    recorder: Recorder,
    hash_block_tokens: int | None = None,
    next_input_hint_s: Callable[[], float] | None = None,
) -> Cluster:
    """The replicas of ``pools`` on ``sim``, configured by ``settings`` and ``plugins``, and
    the cluster around them (no source attached yet). The one place that builds replicas:
    every front end (``run``, RL generation, the agentic rollout, the live engine) comes here.

    ``hash_block_tokens``: the workload's prefix-hash block (None: no prefix hashes).
    ``next_input_hint_s``: a lone replica's view of its next input (``Simulator.peek_s``),
    which lets its windows stop there instead of being cut back.
    """
    timeline = settings.timeline
    batching = plugins.make_batch_policy

    def make_replica(**kw: Any) -> Replica:
        replica = Replica(
            sim, batch_policy=batching(), order_key=plugins.order_key, recorder=recorder,
            max_batched_tokens=settings.max_batched_tokens, max_running=settings.max_running,
            fast_forward=settings.fast_forward, debug=settings.debug,
            next_input_hint_s=next_input_hint_s, timeline=timeline,
            track_itl=settings.track_itl, speculative=settings.speculative, **kw)
        replica.until_s = settings.until_s
        return replica

    return Cluster(
        sim, pools, router=plugins.router, decode_router=plugins.decode_router,
        rng=plugins.rng, kv_bytes_per_token=settings.kv_bytes_per_token,
        link_latency_s=settings.link_latency_s, make_replica=make_replica,
        hash_block_tokens=hash_block_tokens, block_size=settings.block_size,
        enable_prefix_caching=settings.enable_prefix_caching, recorder=recorder,
        eviction_key=plugins.eviction_key, kv_retention=settings.kv_retention,
        frontend_overhead_s=settings.frontend_overhead_s)


def simulate(
    workload: Workload,
    pools: Sequence[PoolSetup],
    settings: EngineSettings,
    plugins: PlugIns,
    *,
    source: RequestSource | None = None,
    controllers: Sequence[Controller] = (),
    progress: ProgressFn | None = None,
    progress_every: int = 2000,
    group: GroupSetup | None = None,
) -> tuple[Records, Cluster]:
    """Simulate ``workload`` (or ``source``, which then supplies the requests) on a cluster
    of ``pools`` until ``settings.until_s``; returns the records and the cluster.

    ``group``: the replicas of the one pool are the instances of an instance group
    (``groups.py``), planned by its planner.

    ``progress`` is called with the simulated time every ``progress_every`` arrivals.
    """
    until_s = settings.until_s
    sim = Simulator()
    origin_s, bin_s = settings.timeline or default_timeline(workload, until_s)
    if settings.timeline is None:
        settings = replace(settings, timeline=(origin_s, bin_s))
    recorder = Recorder(origin_s, bin_s)
    single = (len(pools) == 1 and pools[0].num_replicas == 1
              and settings.windows_stop_at_arrivals)
    # (a lone replica's windows stop at the next event, ``peek_s``: every event there counts)
    sim.move_in_place = not single
    cluster = build_cluster(
        sim, pools, settings, plugins, recorder=recorder,
        hash_block_tokens=workload.hash_block_tokens if workload.hash_ids is not None else None,
        # A lone replica knows its next input: the next arrival in the heap.
        next_input_hint_s=sim.peek_s if single else None)
    src = source if source is not None else WorkloadSource(workload)
    if progress is not None:
        src = _Progress(src, progress, progress_every, sim)
    cluster.attach_source(src)
    if group is not None:  # (after the source: the group hears of finishes after it)
        if len(pools) != 1:
            raise ValueError(f"an instance group is one pool of instances, got {len(pools)} "
                             f"pools")
        cluster.group = InstanceGroup(sim, cluster.replicas, group)
    for controller in controllers:
        cluster.add_controller(controller)
    # The loop allocates many short-lived objects and no reference cycles (reference
    # counting frees them all), while the cyclic collector would rescan the growing
    # per-request records again and again: about 8% of the run at scale. Off while it runs
    # and while the records become arrays.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.run(until_s)
        if until_s < math.inf:
            # Windows in flight past the end: record their steps done by then, as step by
            # step does.
            for replica in cluster.replicas:
                replica.interrupt()
                replica.flush_records()
        if progress is not None:
            progress(sim.now_s)
        return recorder.records(), cluster
    finally:
        if gc_was_enabled:
            gc.enable()


def simulate_cluster(
    workload: Workload,
    pools: Sequence[PoolSetup],
    *,
    router: Router,
    decode_router: Router | None,
    make_batch_policy: MakeBatchPolicy,
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
    source: RequestSource | None = None,
    controllers: Sequence[Controller] = (),
    timeline: tuple[float, float] | None = None,
    eviction_key: EvictionKey | None = None,
    track_itl: bool = False,
    kv_retention: KVRetention | None = None,
    frontend_overhead_s: float = 0.0,
    speculative: Emission | None = None,
) -> tuple[Records, Cluster]:
    """``simulate`` with the settings and plug-ins as keywords (the field docs of
    ``EngineSettings`` and ``PlugIns`` say what each is): for scripts and tests that set a
    few of them by hand."""
    settings = EngineSettings(
        block_size=block_size, max_batched_tokens=max_batched_tokens, max_running=max_running,
        enable_prefix_caching=enable_prefix_caching, fast_forward=fast_forward, debug=debug,
        track_itl=track_itl, kv_bytes_per_token=kv_bytes_per_token,
        link_latency_s=link_latency_s, frontend_overhead_s=frontend_overhead_s,
        kv_retention=kv_retention, until_s=until_s, timeline=timeline,
        windows_stop_at_arrivals=windows_stop_at_arrivals, speculative=speculative)
    plugins = PlugIns(make_batch_policy=make_batch_policy, order_key=order_key, router=router,
                      decode_router=decode_router, eviction_key=eviction_key, rng=rng)
    return simulate(workload, pools, settings, plugins, source=source,
                    controllers=controllers, progress=progress, progress_every=progress_every)


class _Progress:
    """A source wrapper that reports simulated time every ``every`` arrivals."""

    def __init__(self, inner: RequestSource, progress: ProgressFn, every: int,
                 sim: Simulator) -> None:
        self.inner = inner
        self.progress = progress
        self.every = every
        self.sim = sim
        self.wants_finishes = inner.wants_finishes
        self._count = 0

    @property
    def num_requests(self) -> int | None:
        return self.inner.num_requests

    def start(self, ctx: SourceContext) -> None:
        self.inner.start(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        self.inner.on_arrival(req, ctx)
        if self._count % self.every == 0:
            self.progress(self.sim.now_s)
        self._count += 1

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        self.inner.on_finish(req, ctx)
