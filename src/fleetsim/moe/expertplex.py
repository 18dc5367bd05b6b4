"""Step times of the three MoE serving systems ExpertPlex compares (``repro/expertplex.py``),
and the step models that run them on the engine (the shared pool: ``serving/shared_steps.py``).

Every GPU runs attention data-parallel (its own requests) and the routed experts run
expert-parallel on a pool; each step is the dense part of the step (fleetsim's measured tables
for one GPU, ``perf/step_model.py``, minus their MoE term) plus, per MoE layer, the dispatch and
combine all-to-alls (``moe/step_model.all_to_all_s``) and the pool's expert GEMMs priced in
tiles (``moe/tile_model.py``). The three systems differ only in which GPUs hold what:

- colocated: an instance's GPUs hold attention and an EP shard of the experts and run both
  phases in one step (prefill tokens lengthen the decode step);
- instance-level PD: the same instance, prefill-only or decode-only;
- ExpertPlex: attention GPUs per phase, one shared expert pool whose SMs the two phases share
  at tile granularity, with the published APK overheads on expert GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.moe.expertplex_steps import (
    APK_DECODE_SLOWDOWN,
    APK_PREFILL_SLOWDOWN,
    H200_SMS,
    CostModel,
    InstanceSplit,
    InstanceSteps,
    PlexSplit,
    PoolAllocator,
    SmPolicy,
)
from fleetsim.moe.tile_model import ceil_to

__all__ = ["APK_DECODE_SLOWDOWN", "APK_PREFILL_SLOWDOWN", "H200_SMS", "CostModel",
           "ExpertPoolConfig", "InstanceSplit", "InstanceSteps", "PlexSplit", "PoolAllocator",
           "SmPolicy", "SystemLayout", "sm_policy"]


# ---- the three systems as step models for the engine -----------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SystemLayout:
    """One system on its GPU budget."""

    kind: str
    """``colocated``, ``pd`` or ``expertplex``."""
    prefill_gpus: tuple[int, ...]
    """GPUs of each prefill-capable instance (colocated: each instance; ExpertPlex: one
    data-parallel attention group)."""
    decode_gpus: tuple[int, ...] = ()
    pool: int = 0
    """ExpertPlex's shared expert pool (GPUs); the others' pool is the instance itself."""

    @property
    def total_gpus(self) -> int:
        return sum(self.prefill_gpus) + sum(self.decode_gpus) + self.pool

    @property
    def label(self) -> str:
        if self.kind == "colocated":
            return f"{len(self.prefill_gpus)}x{self.prefill_gpus[0]} colocated"
        if self.kind == "pd":
            return f"{len(self.prefill_gpus)}P+{len(self.decode_gpus)}D x{self.prefill_gpus[0]}"
        return (f"attn P{self.prefill_gpus[0]} D{self.decode_gpus[0]} + pool "
                f"{self.pool}")




TPOT_HEADROOM = 0.9
"""Decode's SMs are sized for a step of 90% of the TPOT SLO (our choice: room for the steps a
prefill-heavy moment slows)."""


def sm_policy(cost: CostModel, layout: SystemLayout, mean_context: float, *,
              max_decode_per_gpu: int, tpot_slo_s: float, sm_cluster: int,
              adaptive: bool = True) -> SmPolicy:
    """Decode's reference allocation x*_moe -> q: the fewest SMs (whole clusters, at most
    Q_max) with which a step of decode's largest batch, at the workload's mean context, meets
    90% of the TPOT SLO; x*_moe is that batch's tile count. Online, q' scales with the tiles
    of the batch decode actually runs (``reallocate_sms``); ``adaptive=False`` keeps q."""
    q_max = min(ceil_to(cost.num_sms * 7 / 8, sm_cluster), cost.num_sms)
    if layout.kind != "expertplex":
        return SmPolicy(q_ref=q_max, x_ref=1.0, q_max=q_max, cluster=sm_cluster)
    gpus = sum(layout.decode_gpus)
    largest = max_decode_per_gpu * gpus
    kv = int(largest * mean_context)
    span = layout.total_gpus
    q_ref = q_max
    for q in range(sm_cluster, q_max + 1, sm_cluster):
        step, _ = cost.plex_decode_s(largest, kv, gpus, layout.pool, span, q)
        if step <= TPOT_HEADROOM * tpot_slo_s:
            q_ref = q
            break
    return SmPolicy(q_ref=q_ref, x_ref=cost.tiles_per_gpu(largest, layout.pool), q_max=q_max,
                    cluster=sm_cluster, adaptive=adaptive)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPoolConfig:
    """A shared expert pool (ExpertPlex): the cluster's prefill and decode pools keep
    attention on their own GPUs (data-parallel over each replica's ``tp`` GPUs) and run every
    MoE layer's routed experts on one pool of GPUs whose SMs the two phases share."""

    num_gpus: int
    """GPUs of the shared pool; it holds one copy of the routed experts, split evenly (must
    divide the model's experts)."""
    gpu: str | None = None
    """GPU of the pool from ``fleetsim gpus`` (None: the prefill pool's)."""
    decode_sms: int | None = None
    """SMs decode keeps while prefill has expert work, at a batch of ``engine.max_running``;
    smaller batches keep proportionally fewer (the paper's q' = ceil_c(q x_moe / x*_moe)).
    None: 7/8 of the SMs (our choice: room for prefill at decode's largest batch)."""
    sm_cluster: int = 2
    """SMs handed out together (a thread-block cluster of 2 on Hopper)."""
    tile_m: int = 64
    """Rows of a GEMM tile (Hopper's wgmma computes 64-row tiles)."""
    overlap: bool = False
    """Each replica overlaps its attention with its expert work (two micro-batches in
    flight): a step takes max(attention, experts) instead of their sum."""
    nvlink_domain: int = 8
    """GPUs that reach each other over NVLink (HGX: 8); the all-to-alls cross the network
    beyond."""

    def __post_init__(self) -> None:
        for name in ("num_gpus", "sm_cluster", "tile_m", "nvlink_domain"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"cluster.expert_pool.{name} must be an integer >= 1, got "
                                 f"{value!r}")
        if self.decode_sms is not None and (
                isinstance(self.decode_sms, bool) or not isinstance(self.decode_sms, int)
                or self.decode_sms < self.sm_cluster):
            raise ValueError(f"cluster.expert_pool.decode_sms must be an integer >= "
                             f"sm_cluster ({self.sm_cluster}) or unset, got "
                             f"{self.decode_sms!r}")
