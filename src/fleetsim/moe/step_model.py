"""Expert-parallel MoE layer time: slowest GPU's expert compute + dispatch/combine all-to-all
+ the exposed part of expert-weight copies, and the force-balanced ideal it is judged by.

Tokens are assumed to start spread evenly over the EP group (data-parallel attention, as
DeepSeek-V3 and SGLang/vLLM wide-EP deploy it), so a GPU receives a share
``(gpus_per_node - 1) / num_gpus`` of its routed tokens over NVLink and
``(num_gpus - gpus_per_node) / num_gpus`` over the network; the two links run in parallel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import ExpertBalancer, make_balancer
from fleetsim.moe.compute import EpHardware, ExpertCompute, MoeLayerSpec, default_compute
from fleetsim.moe.load_presets import LOAD_PRESETS, preset_spec
from fleetsim.moe.loads import LoadSpec, make_popularity, sample_loads
from fleetsim.moe.placement import BalanceView, Placement, moved_experts

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertParallelConfig:
    """Expert parallelism of one pool: the EP group, its slots and its balancer."""

    num_gpus: int
    """GPUs in the EP group (one expert-parallel rank each)."""
    gpus_per_node: int = 8
    """GPUs sharing NVLink; the rest of the group is reached over the network."""
    num_spare_slots_per_gpu: int = 1
    """Expert slots per GPU beyond its masters (EPLB's redundant experts / num_gpus)."""
    balancer: str = "quota"
    """Balancer name (none, eplb, eplb_stale, quota, two_timescale) or 'pkg.mod:Cls'."""
    balancer_args: Mapping[str, object] = field(default_factory=dict)
    """Keyword arguments of the balancer."""
    weight_move_overlap: float = 1.0
    """Seconds of weight copy hidden per second of ideal layer time (copies overlap the
    attention of the same layer; 1.0 assumes attention takes as long as the ideal MoE)."""

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise FleetsimInputError("num_gpus", self.num_gpus, "must be > 0")
        if self.gpus_per_node <= 0 or self.num_gpus % self.gpus_per_node:
            raise FleetsimInputError(
                "gpus_per_node",
                self.gpus_per_node,
                f"must be > 0 and divide num_gpus={self.num_gpus}",
            )
        if self.num_spare_slots_per_gpu < 0:
            raise FleetsimInputError(
                "num_spare_slots_per_gpu", self.num_spare_slots_per_gpu, "must be >= 0"
            )
        if self.weight_move_overlap < 0:
            raise FleetsimInputError(
                "weight_move_overlap", self.weight_move_overlap, "must be >= 0"
            )
        make_balancer(self.balancer, self.balancer_args)  # unknown names or args fail here

    def slots_per_gpu(self, num_experts: int) -> int:
        """Masters plus spare slots per GPU; ``num_experts`` must be a multiple of num_gpus."""
        if num_experts % self.num_gpus:
            raise FleetsimInputError(
                "num_experts", num_experts, f"must be a multiple of num_gpus={self.num_gpus}"
            )
        return num_experts // self.num_gpus + self.num_spare_slots_per_gpu


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """Per-layer seconds, each (num_layers,)."""

    compute_s: FloatArray
    dispatch_s: FloatArray
    combine_s: FloatArray
    move_s: FloatArray

    @property
    def total_s(self) -> FloatArray:
        return self.compute_s + self.dispatch_s + self.combine_s + self.move_s


def all_to_all_s(
    routed_tokens: FloatArray, ep: ExpertParallelConfig, spec: MoeLayerSpec, hw: EpHardware
) -> tuple[FloatArray, FloatArray]:
    """(dispatch_s, combine_s) of the busiest receiver; routed_tokens: (..., num_gpus)."""
    intra = routed_tokens * (ep.gpus_per_node - 1) / ep.num_gpus
    inter = routed_tokens * (ep.num_gpus - ep.gpus_per_node) / ep.num_gpus
    times = []
    for bytes_per_value in (spec.dispatch_bytes_per_value, spec.combine_bytes_per_value):
        per_token = spec.hidden_size * bytes_per_value
        t = np.maximum(
            intra * per_token / hw.intra_node_bytes_per_s,
            inter * per_token / hw.inter_node_bytes_per_s,
        )
        times.append(t.max(-1))
    return times[0], times[1]


def layer_times(
    placement: Placement,
    expert_load: FloatArray,
    ep: ExpertParallelConfig,
    spec: MoeLayerSpec,
    hw: EpHardware,
    compute: ExpertCompute,
    previous: Placement | None = None,
) -> LayerTimes:
    """Times of every layer when ``placement`` serves ``expert_load`` (num_layers, num_experts),
    including copying the experts that ``previous`` did not have where they are now."""
    tokens = placement.tokens_by_slot(expert_load)
    tokens = tokens.reshape(placement.num_layers, placement.num_gpus, placement.slots_per_gpu)
    compute_s = compute.gpu_time_s(tokens).max(-1)
    dispatch_s, combine_s = all_to_all_s(tokens.sum(-1), ep, spec, hw)
    intra, inter = moved_experts(previous, placement, ep.gpus_per_node)
    copy_s = np.maximum(
        intra * spec.expert_bytes / hw.intra_node_bytes_per_s,
        inter * spec.expert_bytes / hw.inter_node_bytes_per_s,
    ).max(-1)
    hidden_s = ep.weight_move_overlap * ideal_times(expert_load, ep, spec, hw, compute).total_s
    return LayerTimes(compute_s, dispatch_s, combine_s, np.maximum(copy_s - hidden_s, 0.0))


def ideal_times(
    expert_load: FloatArray,
    ep: ExpertParallelConfig,
    spec: MoeLayerSpec,
    hw: EpHardware,
    compute: ExpertCompute,
) -> LayerTimes:
    """Force-balanced: every GPU computes the mean routed tokens over all its slots, no copies."""
    num_layers = expert_load.shape[0]
    spg = ep.slots_per_gpu(expert_load.shape[1])
    mean = expert_load.sum(1) / ep.num_gpus
    tokens = np.repeat((mean / spg)[:, None, None], spg, axis=2)
    compute_s = compute.gpu_time_s(tokens)[:, 0]
    dispatch_s, combine_s = all_to_all_s(mean[:, None], ep, spec, hw)
    return LayerTimes(compute_s, dispatch_s, combine_s, np.zeros(num_layers))


def moe_layer_time_s(
    ep: ExpertParallelConfig,
    num_tokens: int,
    *,
    spec: MoeLayerSpec | None = None,
    hardware: EpHardware | None = None,
    imbalance: float = 1.0,
    compute: ExpertCompute | None = None,
) -> float:
    """Seconds of one MoE layer for ``num_tokens`` tokens over the whole EP group.

    The closed form a step-time model calls per step: the busiest GPU computes and receives
    ``imbalance`` times the mean routed tokens (``num_tokens * top_k / num_gpus``). Take
    ``imbalance`` from a balancer run (``ExpertParallelStepModel`` or ``fleetsim moe
    compare``); 1.0 is the force-balanced ideal.
    """
    if num_tokens < 0:
        raise FleetsimInputError("num_tokens", num_tokens, "must be >= 0")
    if imbalance < 1.0:
        raise FleetsimInputError("imbalance", imbalance, "max/mean is >= 1")
    spec = spec or MoeLayerSpec()
    hardware = hardware or EpHardware()
    compute = compute or default_compute(spec, hardware, ep.num_gpus)
    spg = ep.slots_per_gpu(spec.num_experts)
    peak = num_tokens * spec.top_k / ep.num_gpus * imbalance
    tokens = np.full((1, 1, spg), peak / spg)
    dispatch_s, combine_s = all_to_all_s(np.array([[peak]]), ep, spec, hardware)
    return float(compute.gpu_time_s(tokens)[0, 0] + dispatch_s[0] + combine_s[0])


class ExpertParallelStepModel:
    """Stateful MoE time source for an engine: each call draws the routed load of one step
    from a synthetic scenario, lets the balancer plan it, and returns the time of all MoE
    layers. Mutates its previous placement and load history (reset by building a new one)."""

    def __init__(
        self,
        ep: ExpertParallelConfig,
        *,
        spec: MoeLayerSpec | None = None,
        hardware: EpHardware | None = None,
        compute: ExpertCompute | None = None,
        scenario: str = "zipf",
        num_layers: int | None = None,
        num_patterns: int = 64,
        history_window: int = 16,
        seed: int = 0,
    ) -> None:
        self.ep = ep
        self.spec = spec or MoeLayerSpec()
        self.hardware = hardware or EpHardware()
        self.compute = compute or default_compute(self.spec, self.hardware, ep.num_gpus)
        self.balancer: ExpertBalancer = make_balancer(ep.balancer, ep.balancer_args)
        self.scenario = scenario
        self.num_layers = num_layers or self.spec.num_moe_layers
        self.history_window = history_window
        self.rng = np.random.default_rng(seed)
        # A fixed cycle of routing popularities; each step samples its tokens from the next.
        pattern_spec = LoadSpec(
            num_microbatches=num_patterns,
            num_layers=self.num_layers,
            num_experts=self.spec.num_experts,
            top_k=self.spec.top_k,
        )
        if scenario in LOAD_PRESETS:
            # a measured max/mean (moe/load_presets.py) on this layer shape at the preset's EP
            pattern_spec = preset_spec(scenario, pattern_spec, tokens_per_gpu=4096)
            scenario = "ou"
        self.popularity = make_popularity(scenario, pattern_spec, self.rng)
        self.previous: Placement | None = None
        self.history: list[FloatArray] = []
        self.num_steps = 0

    def moe_time_s(self, num_tokens: int) -> float:
        """Seconds of all MoE layers of one forward step over ``num_tokens`` tokens, scaled
        from ``num_layers`` simulated layers to the model's ``num_moe_layers``."""
        if num_tokens <= 0:
            return 0.0
        pattern = self.popularity[self.num_steps % len(self.popularity)]
        load = sample_loads(pattern, int(num_tokens), self.spec.top_k, self.rng)
        view = BalanceView(
            expert_load=load,
            num_gpus=self.ep.num_gpus,
            gpus_per_node=self.ep.gpus_per_node,
            slots_per_gpu=self.ep.slots_per_gpu(self.spec.num_experts),
            history=tuple(self.history),
            previous=self.previous,
            microbatch_index=self.num_steps,
            expert_bytes=self.spec.expert_bytes,
        )
        placement = self.balancer.plan(view)
        times = layer_times(
            placement, load, self.ep, self.spec, self.hardware, self.compute, self.previous
        )
        self.previous = placement
        self.history = [*self.history, load][-self.history_window :]
        self.num_steps += 1
        return float(times.total_s.sum()) * self.spec.num_moe_layers / self.num_layers

