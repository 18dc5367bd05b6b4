"""A shared expert pool on the engine: the P and D attention pools of an MoE model run their
expert layers on one pool of GPUs whose SMs they share (ExpertPlex, arXiv 2607.18002), as jobs
on a shared resource (``serving/shared_steps.py``); and the three systems ExpertPlex compares
(colocated, instance-level P/D, shared pool) built and run for its reproduction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from fleetsim.config import SimConfig
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import ModelSpec
from fleetsim.moe.expertplex import (
    CostModel,
    InstanceSteps,
    PlexSplit,
    PoolAllocator,
    SmPolicy,
    SystemLayout,
)
from fleetsim.moe.tile_model import ceil_to
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.shared_steps import SharedStepModel
from fleetsim.workloads.workload import Workload

BLOCK_SIZE = 16
"""vLLM's default KV block (tokens)."""
GPU_MEMORY_UTILIZATION = 0.9
"""Share of HBM for weights and KV (vLLM's default ``gpu_memory_utilization``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    token_budget_per_gpu: int
    max_decode_per_gpu: int


@dataclass(slots=True)
class Outcome:
    ttft: np.ndarray
    tpot: np.ndarray
    busy_share_by_pool: dict[str, float] = field(default_factory=dict)
    """pool name -> share of the run (first arrival to last finish) its replicas were busy
    stepping, averaged over its replicas."""


def kv_blocks(cost: CostModel, gpus: int, weight_bytes_per_gpu: float) -> int:
    """KV blocks of a data-parallel attention group: each GPU keeps its own requests' KV in
    what its weights leave of the usable HBM."""
    free = cost.gpu.hbm_bytes * GPU_MEMORY_UTILIZATION - weight_bytes_per_gpu
    if free <= 0:
        raise ValueError(f"{weight_bytes_per_gpu / 1e9:.0f} GB of weights leave no KV room")
    per_token = float(cost.model.kv_bytes_per_token())
    return int(gpus * free / per_token) // BLOCK_SIZE


def weight_bytes(cost: CostModel) -> tuple[float, float]:
    """(non-expert bytes: every attention GPU holds them, expert bytes of all layers)."""
    total = float(cost.model.num_params * cost.model.weight_dtype_bytes)
    experts = float(cost.spec.expert_bytes * cost.spec.num_experts * cost.layers)
    return total - experts, experts


def pools(layout: SystemLayout, cost: CostModel, policy: SmPolicy, *,
          overlap: bool = False) -> list[PoolSetup]:
    """The layout's replicas: colocated instances, P and D instances, or ExpertPlex's two
    attention groups on one shared expert pool (capacity: the pool GPUs' SMs)."""
    dense, experts = weight_bytes(cost)
    nic = cost.hw.inter_node_bytes_per_s

    def instance(name: str, role: str, sizes: tuple[int, ...]) -> PoolSetup:
        g = sizes[0]
        return PoolSetup(name=name, role=role, num_replicas=len(sizes),
                         step_model=InstanceSteps(cost, g),
                         num_kv_blocks=kv_blocks(cost, g, dense + experts / g),
                         link_bw_bytes_per_s=g * nic)

    if layout.kind == "colocated":
        return [instance("instance", "mixed", layout.prefill_gpus)]
    if layout.kind == "pd":
        return [instance("prefill", "prefill", layout.prefill_gpus),
                instance("decode", "decode", layout.decode_gpus)]
    span = layout.total_gpus
    alloc = PoolAllocator(cost, policy, layout.pool)
    out = []
    for role, g in (("prefill", layout.prefill_gpus[0]), ("decode", layout.decode_gpus[0])):
        model = SharedStepModel(PlexSplit(cost, g, span, role, alloc), "expert_pool",
                                float(cost.num_sms), overlap=overlap)
        out.append(PoolSetup(name=role, role=role, num_replicas=1, step_model=model,
                             num_kv_blocks=kv_blocks(cost, g, dense),
                             link_bw_bytes_per_s=g * nic))
    return out


def simulate(layout: SystemLayout, cost: CostModel, limits: Limits, sm: SmPolicy,
             arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, *,
             overlap: bool = False) -> Outcome:
    """Run every request to completion on the engine; TTFT and TPOT (NaN for one-token
    outputs) per request, in request order."""
    groups = layout.prefill_gpus + layout.decode_gpus
    g = max(groups)
    w = Workload(arrival_s=np.asarray(arrivals, dtype=np.float64),
                 num_prompt_tokens=np.asarray(prompts, dtype=np.int64),
                 num_output_tokens=np.asarray(outputs, dtype=np.int64))
    setups = pools(layout, cost, sm, overlap=overlap)
    rec, _ = simulate_cluster(
        w, setups, router=LeastLoaded(),
        decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(0), kv_bytes_per_token=float(cost.model.kv_bytes_per_token()),
        link_latency_s=0.0, block_size=BLOCK_SIZE,
        # A group's prompt budget plus a token for each decode it may run.
        max_batched_tokens=(limits.token_budget_per_gpu + limits.max_decode_per_gpu) * g,
        max_running=limits.max_decode_per_gpu * g, enable_prefix_caching=False)
    r = rec.requests
    order = np.argsort(r["request_id"])
    first = r["first_token_s"][order]
    finish = r["finish_s"][order]
    arrival = r["arrival_s"][order]
    out = r["num_output_tokens"][order]
    n = len(arrivals)
    if len(order) != n:
        raise RuntimeError(f"{len(order)} of {n} requests finished")
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), math.nan)
    return Outcome(first - arrival, tpot, _busy_shares(setups, rec.busy_s_by_replica,
                                                       float(finish.max() - arrival.min())))


def _busy_shares(setups: list[PoolSetup], busy_s_by_replica: dict[int, float],
                 span_s: float) -> dict[str, float]:
    """Each pool's mean busy share; the cluster numbers replicas in pool order."""
    out: dict[str, float] = {}
    first = 0
    for setup in setups:
        ids = range(first, first + setup.num_replicas)
        out[setup.name] = sum(busy_s_by_replica.get(i, 0.0) for i in ids) / (
            setup.num_replicas * span_s) if span_s > 0 else 0.0
        first += setup.num_replicas
    return out


def shared_expert_pools(config: SimConfig, model: ModelSpec, setups: list[PoolSetup],
                        infos: list[dict]) -> list[PoolSetup]:
    """``config.cluster.expert_pool``: the prefill and decode pools' steps become jobs on one
    shared expert pool (``PlexSplit`` on a ``SharedStepModel``), their KV the HBM their
    non-expert weights leave. ``infos`` (the pools' descriptions) are updated in place."""
    ep = config.cluster.expert_pool
    assert ep is not None
    where = "cluster.expert_pool"
    if not model.is_moe:
        raise FleetsimInputError("model", model.name,
                                 f"{where} needs an MoE model (fleetsim models)")
    by_role = {p.role: p for p in config.pools}
    if sorted(p.role for p in config.pools) != ["decode", "prefill"]:
        raise FleetsimInputError("cluster.pools", [p.role for p in config.pools],
                                 f"{where} needs one prefill pool and one decode pool")
    for p in config.pools:
        if p.num_replicas != 1:
            raise FleetsimInputError(f"cluster.pools ({p.name}).num_replicas", p.num_replicas,
                                     f"{where} takes one attention group per phase: set 1 "
                                     f"and give the group its GPUs with tp")
    try:
        gpu = get_gpu(ep.gpu or by_role["prefill"].gpu, config.hardware.catalog)
    except FleetsimInputError as err:
        raise FleetsimInputError(f"{where}.gpu", ep.gpu, err.fix) from None
    cost = CostModel(model, gpu, ep.tile_m, nvlink_domain=ep.nvlink_domain)
    if cost.spec.num_experts % ep.num_gpus:
        raise FleetsimInputError(f"{where}.num_gpus", ep.num_gpus,
                                 f"must divide the model's {cost.spec.num_experts} experts")
    dense, experts = weight_bytes(cost)
    if experts / ep.num_gpus > gpu.hbm_bytes * GPU_MEMORY_UTILIZATION:
        raise FleetsimInputError(f"{where}.num_gpus", ep.num_gpus,
                                 f"{experts / 1e9:.0f} GB of experts do not fit; use more GPUs")
    if ep.decode_sms is not None and ep.decode_sms > cost.num_sms:
        raise FleetsimInputError(f"{where}.decode_sms", ep.decode_sms,
                                 f"must be at most the GPU's {cost.num_sms} SMs")
    q_max = min(ceil_to(cost.num_sms * 7 / 8, ep.sm_cluster), cost.num_sms)
    policy = SmPolicy(q_ref=ep.decode_sms or q_max,
                      x_ref=cost.tiles_per_gpu(config.engine.max_running, ep.num_gpus),
                      q_max=max(q_max, ep.decode_sms or 0), cluster=ep.sm_cluster)
    alloc = PoolAllocator(cost, policy, ep.num_gpus)
    span = sum(p.tp for p in config.pools) + ep.num_gpus
    out = []
    for setup, pool, info in zip(setups, config.pools, infos, strict=True):
        model_ = SharedStepModel(PlexSplit(cost, pool.tp, span, pool.role, alloc),
                                 "expert_pool", float(cost.num_sms), overlap=ep.overlap)
        blocks = config.engine.num_kv_blocks or kv_blocks(cost, pool.tp, dense)
        out.append(replace(setup, step_model=model_, num_kv_blocks=blocks))
        info.update(num_kv_blocks=blocks, expert_pool_gpus=ep.num_gpus)
    return out
