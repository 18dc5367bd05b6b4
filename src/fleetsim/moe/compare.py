"""Side-by-side runs of expert balancers on one synthetic load trace (``fleetsim moe compare``).

Every balancer gets the same microbatch loads. Per microbatch it plans a placement, which is
scored on that microbatch's actual load: max/mean GPU load per layer, layer time against the
force-balanced ideal (``step_model``), and expert bytes copied since the previous microbatch,
split into intra-node (NVLink) and inter-node (network) copies. Each row also says what the
planner plans from (``sees``) and whether its copies could be prefetched: a planner that sees
the exact current load is an oracle for one that plans from history, so the default set pairs
each algorithm with each kind of information (EPLB on the exact load and on stale loads, the
quota planner on the exact and on the previous load). The first microbatch is a warm-up (no
history yet) and is left out of the figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import make_balancer
from fleetsim.moe.compute import EpHardware, ExpertCompute, MoeLayerSpec, default_compute
from fleetsim.moe.load_presets import LOAD_PRESETS, preset_spec
from fleetsim.moe.loads import SCENARIOS, LoadSpec, make_loads
from fleetsim.moe.placement import BalanceView, Placement, check_layout, imbalance, moved_experts
from fleetsim.moe.step_model import ExpertParallelConfig, ideal_times, layer_times

# DeepSeek-V3's expert groups: the hierarchical EPLB baselines use them. On 8 nodes that is one
# group per node, which pins each node to a group (no cross-node balancing; rows say so).
DEEPSEEK_V3_GROUPS = 8

# (label, registry name, args): every algorithm with the exact load and with history.
DEFAULT_BALANCERS: tuple[tuple[str, str, Mapping[str, object]], ...] = (
    ("none", "none", {}),
    ("eplb", "eplb", {}),
    ("eplb_hier", "eplb", {"num_groups": DEEPSEEK_V3_GROUPS}),
    ("eplb_stale k=1", "eplb_stale", {"window": 1}),
    ("eplb_stale k=4", "eplb_stale", {"window": 4}),
    ("eplb_stale k=16", "eplb_stale", {"window": 16}),
    ("eplb_hier_stale k=1", "eplb_stale", {"window": 1, "num_groups": DEEPSEEK_V3_GROUPS}),
    ("quota", "quota", {}),
    ("quota_stale k=1", "quota", {"stale_steps": 1}),
    ("two_timescale", "two_timescale", {}),
)

# Tokens per GPU per microbatch when not given: a prefill/training chunk, or a decode step.
DEFAULT_TOKENS_PER_GPU = {"zipf": 4096, "drift": 4096, "rl": 4096, "rl_switch": 4096, "decode": 128,
                          "ou": 4096}
# What ``moe compare`` runs: the synthetic stress scenarios (``all``) and the measured presets
# (the ``ou`` generator calibrated to a published max/mean, ``moe/load_presets.py``).
STRESS_SCENARIOS = tuple(s for s in SCENARIOS if s != "ou")
COMPARE_LOADS = (*STRESS_SCENARIOS, *LOAD_PRESETS)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareSetup:
    """One scenario of the comparison."""

    scenario: str = "rl"
    """Load: a synthetic scenario (zipf, drift, rl, rl_switch, decode) or a measured preset
    (``moe/load_presets.py``, e.g. ultraep-qwen3-235b-train)."""
    num_gpus: int = 64
    """GPUs in the EP group."""
    gpus_per_node: int = 8
    """GPUs per NVLink node."""
    num_experts: int = 256
    """Logical experts per layer."""
    num_spare_slots_per_gpu: int = 1
    """Replica slots per GPU beyond its masters."""
    num_microbatches: int = 24
    """Microbatches simulated (the first is warm-up)."""
    microbatches_per_batch: int = 8
    """Microbatches per batch (the two-timescale planner reorders per batch)."""
    num_layers: int = 8
    """MoE layers simulated (figures are per layer)."""
    num_tokens_per_gpu: int | None = None
    """Tokens per GPU per microbatch; None picks the scenario's default."""
    seed: int = 0
    """Seed of the load trace."""

    def __post_init__(self) -> None:
        if self.scenario not in COMPARE_LOADS:
            raise FleetsimInputError(
                "scenario", self.scenario, f"use one of {', '.join(COMPARE_LOADS)}"
            )
        if self.num_microbatches < 2:
            raise FleetsimInputError("num_microbatches", self.num_microbatches, "must be >= 2")
        if self.microbatches_per_batch < 1:
            raise FleetsimInputError(
                "microbatches_per_batch", self.microbatches_per_batch, "must be >= 1"
            )
        if self.num_spare_slots_per_gpu < 0:
            raise FleetsimInputError(
                "num_spare_slots_per_gpu", self.num_spare_slots_per_gpu, "must be >= 0"
            )
        slots = self.num_experts // max(self.num_gpus, 1) + self.num_spare_slots_per_gpu
        check_layout(self.num_experts, self.num_gpus, self.gpus_per_node, slots)

    @property
    def tokens_per_gpu(self) -> int:
        return self.num_tokens_per_gpu or DEFAULT_TOKENS_PER_GPU.get(self.scenario, 4096)


@dataclass(frozen=True, slots=True)
class CompareRow:
    """One balancer on one scenario (means over microbatches after the first, and layers)."""

    scenario: str
    balancer: str
    imbalance: float
    """Mean over layers and microbatches of max/mean GPU routed tokens."""
    worst_imbalance: float
    """Largest per-layer max/mean seen."""
    relative_throughput: float
    """Ideal (force-balanced) MoE time / simulated MoE time."""
    moved_bytes_per_layer: float
    """Expert weight bytes copied per layer per microbatch (intra + inter)."""
    intra_bytes_per_layer: float
    """Of which copied inside a node (NVLink), per layer per microbatch."""
    inter_bytes_per_layer: float
    """Of which copied across nodes (network), per layer per microbatch."""
    plan_ms_per_layer: float | None
    """Planning wall time per layer, when a clock was given."""
    sees: str
    """What the planner plans from (exact current load, previous step, K-step mean, ...)."""
    prefetchable: str
    """Whether its copies are known before the step (plans from history) or only after
    gating (plans from the exact load)."""
    note: str
    """A caveat of this baseline on this layout, or empty."""
    imbalance_by_microbatch: tuple[float, ...] = field(repr=False)
    """Mean over layers of max/mean, per microbatch (warm-up included)."""


def _note(balancer: object, setup: CompareSetup) -> str:
    num_groups = getattr(balancer, "num_groups", None)
    num_nodes = setup.num_gpus // setup.gpus_per_node
    if num_groups is not None and num_nodes > 1 and num_groups == num_nodes:
        return "1 group per node: cannot balance across nodes"
    return ""


def run_compare(
    setup: CompareSetup,
    *,
    spec: MoeLayerSpec | None = None,
    hardware: EpHardware | None = None,
    compute: ExpertCompute | None = None,
    balancers: Sequence[tuple[str, str, Mapping[str, object]]] = DEFAULT_BALANCERS,
    clock: Callable[[], float] | None = None,
) -> list[CompareRow]:
    """Run every balancer on the scenario's loads; ``clock`` (e.g. ``time.perf_counter``)
    times planning, which the simulator itself never does."""
    spec = spec or MoeLayerSpec(num_experts=setup.num_experts)
    if spec.num_experts != setup.num_experts:
        raise FleetsimInputError(
            "spec.num_experts", spec.num_experts, f"must equal {setup.num_experts}"
        )
    hardware = hardware or EpHardware()
    compute = compute or default_compute(spec, hardware, setup.num_gpus)
    load_spec = LoadSpec(
        num_microbatches=setup.num_microbatches,
        num_layers=setup.num_layers,
        num_experts=setup.num_experts,
        num_tokens=setup.tokens_per_gpu * setup.num_gpus,
        top_k=spec.top_k,
    )
    if setup.scenario in LOAD_PRESETS:
        # the preset's measured max/mean on this expert count at the preset's EP size
        calibrated = preset_spec(setup.scenario, load_spec, tokens_per_gpu=setup.tokens_per_gpu)
        loads = make_loads("ou", calibrated, setup.seed)
    else:
        loads = make_loads(setup.scenario, load_spec, setup.seed)
    eps = [
        ExpertParallelConfig(
            num_gpus=setup.num_gpus,
            gpus_per_node=setup.gpus_per_node,
            num_spare_slots_per_gpu=setup.num_spare_slots_per_gpu,
            balancer=name,
            balancer_args=dict(args),
        )
        for _, name, args in balancers
    ]
    # One history length for all, so every planner is offered the same past.
    built = [make_balancer(ep.balancer, ep.balancer_args) for ep in eps]
    window = max([int(getattr(b, "history_window", 1)) for b in built] + [1])
    return [
        _run_one(setup, label, ep, loads, spec, hardware, compute, window, clock)
        for (label, _, _), ep in zip(balancers, eps, strict=True)
    ]


def _run_one(
    setup: CompareSetup,
    label: str,
    ep: ExpertParallelConfig,
    loads: np.ndarray,
    spec: MoeLayerSpec,
    hardware: EpHardware,
    compute: ExpertCompute,
    window: int,
    clock: Callable[[], float] | None,
) -> CompareRow:
    balancer = make_balancer(ep.balancer, ep.balancer_args)
    per_batch = setup.microbatches_per_batch
    previous: Placement | None = None
    imbalance_by_mb, plan_s, intra_bytes, inter_bytes, actual_s, ideal_s = [], [], [], [], [], []
    worst = 1.0
    for t, load in enumerate(loads):
        first = t - t % per_batch
        view = BalanceView(
            expert_load=load,
            num_gpus=ep.num_gpus,
            gpus_per_node=ep.gpus_per_node,
            slots_per_gpu=ep.slots_per_gpu(setup.num_experts),
            history=tuple(loads[max(0, t - window) : t]),
            batch_load=loads[first : first + per_batch].sum(0),
            microbatch_index=t,
            microbatch_in_batch=t % per_batch,
            previous=previous,
            expert_bytes=spec.expert_bytes,
        )
        start = clock() if clock else 0.0
        placement = balancer.plan(view)
        if clock:
            plan_s.append(clock() - start)
        ratio = imbalance(placement.gpu_load(load))
        imbalance_by_mb.append(float(ratio.mean()))
        if t > 0:
            worst = max(worst, float(ratio.max()))
            intra, inter = moved_experts(previous, placement, ep.gpus_per_node)
            intra_bytes.append(float(intra.sum()) * spec.expert_bytes / setup.num_layers)
            inter_bytes.append(float(inter.sum()) * spec.expert_bytes / setup.num_layers)
            actual_s.append(
                layer_times(placement, load, ep, spec, hardware, compute, previous).total_s.sum()
            )
            ideal_s.append(ideal_times(load, ep, spec, hardware, compute).total_s.sum())
        previous = placement
    return CompareRow(
        scenario=setup.scenario,
        balancer=label,
        imbalance=float(np.mean(imbalance_by_mb[1:])),
        worst_imbalance=worst,
        relative_throughput=float(np.sum(ideal_s) / np.sum(actual_s)),
        moved_bytes_per_layer=float(np.mean(intra_bytes) + np.mean(inter_bytes)),
        intra_bytes_per_layer=float(np.mean(intra_bytes)),
        inter_bytes_per_layer=float(np.mean(inter_bytes)),
        plan_ms_per_layer=float(np.mean(plan_s[1:])) * 1e3 / setup.num_layers if clock else None,
        sees=str(getattr(balancer, "sees", "not declared")),
        prefetchable=str(getattr(balancer, "prefetchable", "not declared")),
        note=_note(balancer, setup),
        imbalance_by_microbatch=tuple(imbalance_by_mb),
    )

