"""An elastic cluster: replicas join, leave and flip between prefill and decode while it serves.

The verbs (``add``, ``remove``, ``flip``) are a controller's; each has a modelled cost.

* **Joining** (``add``): the new replica loads the model's weights before it serves, either
  from host memory over its PCIe links (``load_from="host"``: each GPU reads its shard, at the
  catalog's ``pcie_bw_bytes_per_s`` per GPU; the weights are assumed staged in host memory,
  as vLLM's and SGLang's loaders read safetensors through the page cache) or from a serving
  replica of the same pool over its KV link (``"peer"``: the transfer service, so the copy
  shares the peer's link with the KV handoffs it carries; NVLink or the NIC bandwidth of the
  catalog, ``cluster.link``). Then ``startup_s`` more (engine start, CUDA graphs: vLLM logs
  both; a user setting, 0 by default because no one figure fits every engine). Routers see
  the replica once it is ready.
* **Leaving** (``remove``) by one of two rules. ``drain``: the replica leaves the routing
  views at once, finishes everything it holds (queued, running, KV moving in) and retires
  when it is empty: no work is lost, the GPUs stay busy until then. ``requeue``: its waiting
  and running requests are taken out at once and routed again; a running one's KV is dropped
  and recomputed where it lands (``Replica.evict_all``: counted as a preemption by recompute,
  ``num_recomputed_tokens``); only KV already moving (a swap, a P/D handoff) is waited for.
  Requeue frees the GPUs sooner and pays in recomputed prefill; drain pays in GPU time.
* **Reshaping** (``reshape``): a replica changes TP. Engines fix TP at start-up, so it
  leaves by the rule and, once its GPUs are free, a replica of the target pool (another
  ``tp``, performance model and KV size) joins in its role, loading as a join does.
* **Flipping** (``flip``): a replica changes role (prefill, decode, mixed). Today's engines
  run the roles as separate worker processes (Dynamo's planner stops one and starts the
  other; vLLM's and SGLang's P/D workers take their role at start-up), so a flip leaves as
  ``remove`` does (by the same rule), then reloads its weights from host and starts again in
  the new role on the same GPUs.

Invariants (``tests/property/test_elastic_invariants.py``): every request finishes exactly
once under any schedule of these verbs, with decode fast-forward on or off alike; the last
serving entry replica (and, while prefill replicas serve, the last decode one) never leaves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fleetsim.serving.cluster import Cluster, PoolSetup
from fleetsim.serving.replica import Replica
from fleetsim.serving.transfers import gpu_dma_endpoint, host_endpoint

REPLICA_READY: Final = 7  # a loaded replica starts serving (after ticks, before arrivals)

LEAVE_RULES: Final = ("drain", "requeue")
LOAD_SOURCES: Final = ("host", "peer")
ROLES: Final = ("mixed", "prefill", "decode")

# Replica states in an elastic cluster.
LOADING, SERVING, LEAVING, RETIRED = "loading", "serving", "leaving", "retired"


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticPool:
    """What joining costs in one pool: the bytes a replica loads and its GPUs."""

    setup: PoolSetup
    weight_bytes: float
    """The model's weights over all GPUs of one replica (``weight_bytes_per_gpu(tp) * tp``)."""
    num_gpus_per_replica: int

    def __post_init__(self) -> None:
        if not self.weight_bytes >= 0:
            raise ValueError(f"weight_bytes must be >= 0, got {self.weight_bytes}")
        if self.num_gpus_per_replica < 1:
            raise ValueError(f"num_gpus_per_replica must be >= 1, got "
                             f"{self.num_gpus_per_replica}")


class ElasticCluster:
    """The run-time verbs on ``cluster`` and what they did (``timeline``, GPU-seconds).

    Replica ids are never reused: a retired replica stays in ``cluster.replicas``, idle."""

    def __init__(self, cluster: Cluster, pools: Mapping[str, ElasticPool], *,
                 startup_s: float = 0.0) -> None:
        if not startup_s >= 0:
            raise ValueError(f"startup_s must be >= 0, got {startup_s}")
        self.cluster = cluster
        self.pools = dict(pools)
        self.startup_s = startup_s
        self.state: dict[int, str] = {}  # replica_id -> loading | serving | leaving | retired
        self._after_leave: dict[int, str | None] = {}  # replica_id -> role to flip to
        self._rejoin: dict[int, tuple[str, str]] = {}  # replica_id -> (pool, load_from)
        self._since_s: dict[int, float] = {}  # replica_id -> when its GPUs were taken
        self._done_by_pool: dict[str, float] = {}  # pool -> GPU-seconds of retired replicas
        self.timeline: list[dict[str, Any]] = []
        self.num_requeued = 0
        for r in cluster.replicas:
            self.state[r.replica_id] = SERVING
            self._since_s[r.replica_id] = cluster.now_s
            r.on_idle = self._on_idle
        cluster.sim.on(REPLICA_READY, self._on_ready, "replica_ready")

    # ---- reads -----------------------------------------------------------------------
    def replicas_in(self, state: str, pool: str | None = None,
                    role: str | None = None) -> list[Replica]:
        """Replicas in ``state`` (of ``pool``, in ``role``), by id."""
        return [r for r in self.cluster.replicas if self.state[r.replica_id] == state
                and (pool is None or r.pool == pool) and (role is None or r.role == role)]

    def num_gpus_held(self) -> int:
        """GPUs held now: by every replica not retired (loading and leaving ones too)."""
        return sum(self.pools[r.pool].num_gpus_per_replica for r in self.cluster.replicas
                   if self.state[r.replica_id] != RETIRED)

    def gpu_seconds(self, now_s: float) -> float:
        """GPU-seconds held from the start until ``now_s`` (a replica that joined later
        counts nothing)."""
        return sum(self.gpu_seconds_by_pool(now_s).values())

    def gpu_seconds_by_pool(self, now_s: float) -> dict[str, float]:
        """pool -> GPU-seconds its replicas held until ``now_s``."""
        out = dict.fromkeys(self.pools, 0.0)
        for pool, seconds in self._done_by_pool.items():
            out[pool] += seconds
        for r in self.cluster.replicas:
            if self.state[r.replica_id] != RETIRED:
                out[r.pool] += (self.pools[r.pool].num_gpus_per_replica
                                * max(0.0, now_s - self._since_s[r.replica_id]))
        return out

    def can_leave(self, replica_id: int) -> bool:
        """Would routing still work without this replica? At least one serving entry
        replica must stay, and a decode one while prefill replicas serve or load."""
        others = [r for r in self.cluster.replicas
                  if r.replica_id != replica_id and self.state[r.replica_id] == SERVING]
        if not any(r.role != "decode" for r in others):
            return False
        needs_decode = any(r.role == "prefill" and self.state[r.replica_id] in (SERVING, LOADING)
                           and r.replica_id != replica_id for r in self.cluster.replicas)
        return not needs_decode or any(r.role == "decode" for r in others)

    # ---- verbs -----------------------------------------------------------------------
    def add(self, pool: str, role: str | None = None, load_from: str = "host") -> int:
        """A replica of ``pool`` (in ``role``, the pool's by default) joins: it loads the
        weights from host or from a serving peer, starts, then serves. Returns its id."""
        if pool not in self.pools:
            raise ValueError(f"add: no pool {pool!r} (pools: {sorted(self.pools)})")
        if load_from not in LOAD_SOURCES:
            raise ValueError(f"add: load_from must be one of {LOAD_SOURCES}, got {load_from!r}")
        ep = self.pools[pool]
        role = role or ep.setup.role
        _check_role(role)
        cluster = self.cluster
        replica = cluster.new_replica(ep.setup, role)
        rid = replica.replica_id
        replica.on_idle = self._on_idle
        self.state[rid] = LOADING
        self._since_s[rid] = cluster.now_s
        self._load(replica, load_from, "add")
        return rid

    def remove(self, replica_id: int, rule: str = "drain") -> None:
        """Replica ``replica_id`` leaves by ``rule`` (``drain`` or ``requeue``) and, once
        empty, retires (its GPUs are released)."""
        self._leave(replica_id, rule, None, "remove")

    def flip(self, replica_id: int, role: str, rule: str = "drain") -> None:
        """Replica ``replica_id`` leaves by ``rule``, reloads from host, serves as ``role``."""
        _check_role(role)
        if self.cluster.replicas[replica_id].role == role:
            raise ValueError(f"flip: replica {replica_id} is already {role}")
        self._leave(replica_id, rule, role, "flip")

    def reshape(self, replica_id: int, pool: str, rule: str = "drain",
                load_from: str = "host") -> None:
        """Change a replica's parallelism: it leaves by ``rule``, and once its GPUs are free a
        replica of ``pool`` (another TP degree, its own performance model and KV size) joins
        in its role. Engines fix TP at start-up, so this is a leave and a join in sequence."""
        if pool not in self.pools:
            raise ValueError(f"reshape: no pool {pool!r} (pools: {sorted(self.pools)})")
        if load_from not in LOAD_SOURCES:
            raise ValueError(f"reshape: load_from must be one of {LOAD_SOURCES}, got "
                             f"{load_from!r}")
        self._leave(replica_id, rule, None, "reshape")
        self._rejoin[replica_id] = (pool, load_from)
        if self.state[replica_id] == RETIRED:  # it was empty: left at once
            self._join_after(self.cluster.replicas[replica_id])

    # ---- mechanics -------------------------------------------------------------------
    def _leave(self, rid: int, rule: str, then_role: str | None, action: str) -> None:
        if rule not in LEAVE_RULES:
            raise ValueError(f"{action}: rule must be one of {LEAVE_RULES}, got {rule!r}")
        if self.state.get(rid) != SERVING:
            raise ValueError(f"{action}: replica {rid} is {self.state.get(rid, 'unknown')}, "
                             f"not serving")
        if not self.can_leave(rid):
            raise ValueError(f"{action}: replica {rid} is the last serving replica of its "
                             f"stage; add one first")
        replica = self.cluster.replicas[rid]
        self.state[rid] = LEAVING
        self._after_leave[rid] = then_role
        self._publish()
        num_requeued = 0
        if rule == "requeue":
            evicted = replica.evict_all()
            num_requeued = len(evicted)
            self.num_requeued += num_requeued
            for req in evicted:
                self.cluster.route(req)
            moves = replica.moves
            if replica.role == "decode" and moves.incoming:
                # Handoffs queued here whose KV has not started to move: the decode router
                # picks again (their KV waits at the source, nothing is lost).
                queued = list(moves.incoming)
                moves.incoming.clear()
                for src, req in queued:
                    src.pass_on(req, None)
        # KV queued to move in may fit now that the batch left (drain: it is served here).
        replica.moves.start_incoming()
        self._note(action, replica, rule=rule, to_role=then_role, num_requeued=num_requeued)
        if not replica.busy:
            self._on_idle(replica)

    def _on_idle(self, replica: Replica) -> None:
        """A replica ran out of steps: a leaving one that holds nothing more is done."""
        rid = replica.replica_id
        if self.state[rid] != LEAVING:
            return
        moves = replica.moves
        if (replica.running or replica.waiting or replica.swapped or moves.incoming
                or moves.holds_blocks_for_others()):
            return  # KV still moving: the move's end wakes it again
        role = self._after_leave.pop(rid)
        if role is None:
            self.state[rid] = RETIRED
            now_s = self.cluster.now_s
            self._done_by_pool[replica.pool] = self._done_by_pool.get(replica.pool, 0.0) + (
                self.pools[replica.pool].num_gpus_per_replica * (now_s - self._since_s.pop(rid)))
            self._note("retired", replica)
            if replica.replica_id in self._rejoin:
                self._join_after(replica)
        else:
            replica.role = role
            self.state[rid] = LOADING
            self._load(replica, "host", "restart")

    def _join_after(self, replica: Replica) -> None:
        pool, load_from = self._rejoin.pop(replica.replica_id)
        self.add(pool, replica.role, load_from)

    def _load(self, replica: Replica, load_from: str, action: str) -> None:
        cluster = self.cluster
        rid = replica.replica_id
        ep = self.pools[replica.pool]
        peers = self.replicas_in(SERVING, replica.pool) if load_from == "peer" else []
        transfers = cluster.transfers
        if peers:
            src, dst = peers[0].replica_id, rid
        else:  # from host: the PCIe endpoints (shared with swaps when the replica swaps)
            src, dst = host_endpoint(rid), gpu_dma_endpoint(rid)
            bw = ep.setup.host_bw_bytes_per_s
            if src not in transfers.egress_bw:
                transfers.add_endpoint(src, bw, bw)
                transfers.add_endpoint(dst, float("inf"), float("inf"))
        start_s = cluster.now_s
        source = f"peer {src}" if peers else "host"

        def loaded() -> None:
            self._note("loaded", replica, load_from=source, load_s=cluster.now_s - start_s)
            cluster.sim.schedule(cluster.now_s + self.startup_s, REPLICA_READY, replica)

        self._note(action, replica, load_from=source, num_bytes=ep.weight_bytes)
        transfers.start(src, dst, ep.weight_bytes, loaded, client="weights", latency_s=0.0)

    def _on_ready(self, replica: Replica) -> None:
        self.state[replica.replica_id] = SERVING
        self._publish()
        self._note("ready", replica)

    def _publish(self) -> None:
        """Routers choose among the serving replicas, by id."""
        serving = self.replicas_in(SERVING)
        decode = [r.view for r in serving if r.role == "decode"]
        # A prefill replica takes arrivals only while a decode replica can take its handoffs.
        self.cluster.set_serving(
            [r.view for r in serving if r.role == "mixed" or (r.role == "prefill" and decode)],
            decode)

    def _note(self, action: str, replica: Replica, **detail: Any) -> None:
        self.timeline.append({"time_s": self.cluster.now_s, "action": action,
                              "replica_id": replica.replica_id, "pool": replica.pool,
                              "role": replica.role, "num_gpus_held": self.num_gpus_held(),
                              **{k: v for k, v in detail.items() if v is not None}})

    def report(self, now_s: float) -> dict[str, Any]:
        """The summary's ``elastic`` section: GPU-seconds, requeues, the change timeline."""
        return {"gpu_seconds": self.gpu_seconds(now_s),
                "gpu_seconds_by_pool": self.gpu_seconds_by_pool(now_s),
                "num_requeued": self.num_requeued,
                "num_changes": sum(e["action"] in ("add", "remove", "flip")
                                   for e in self.timeline),
                "timeline": self.timeline}


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
