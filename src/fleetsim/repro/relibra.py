"""ReLibra (arXiv:2605.08639): MoE load balancing for RL training with routing replay, against
Megatron-LM (no balancing), EPLB given the batch's true loads (an oracle) and force-balanced.

Sources: the paper's abstract (the body was not readable here) and R3 (arXiv:2510.11370:
rollout routing replay records the rollout's expert choices and replays them in training, so
a batch's token-to-expert routing is known before the step). What the abstract states:
- two timescales matched to the network's hierarchy: per batch (inter-batch), *reorder*
  experts across nodes for batch-level cross-node balance (scale-out network, amortised over
  the batch); per micro-batch (intra-batch), *replicate* experts inside a node (NVLink) to
  absorb micro-batch fluctuation; both from the replayed, exact loads;
- baselines: Megatron-LM, EPLB "even when given oracle loads", an idealized balanced run;
- claims: up to 1.6x training throughput over Megatron-LM, up to 1.2x over EPLB with oracle
  loads, within 6-10% of the ideal.

Our choices where the abstract is silent (each a field of ``RelibraSetup``):
- Qwen3-235B-A22B (its config.json, in the catalog; R3 and the MoE-RL frameworks train the
  Qwen3 MoE family), bf16 training forward + backward per micro-batch (Megatron-LM);
- EP32 over 4 nodes of 8 H200 (NVLink 450 GB/s, one 400 Gb/s NIC per GPU: datasheets in
  the GPU catalog): multi-node EP, where a node's NVLink is 9x its network;
- 4,096 tokens per GPU per micro-batch (one packed 4K sequence), 8 micro-batches per batch
  (one RL training step of 1M tokens), 4 scored batches after 1 warm-up batch;
- 2 spare slots per GPU for ReLibra's in-node replicas and the same slots for EPLB's redundant
  experts (UltraEP's setting; ReLibra's is not in the abstract);
- ReLibra's reorder: at most ``max_swaps_per_batch`` = 8 expert pairs swapped between the most
  and the least loaded node per layer and batch (``two_timescale``'s default), masters
  re-packed inside each node, then the quota planner confined to the node
  (``moe/two_timescale.py``);
- EPLB (deepseek-ai/EPLB, global policy, fleetsim's ``rebalance_experts``) re-planned at
  every batch start on the batch's summed true loads, even split over replicas;
- costs (``moe/reshuffle.py``; each policy's batches run by ``moe/batch_pass.py``): a moved
  owner carries bf16 weights (before the layer's first forward) and fp32 optimizer state
  (before the step); batch replicas are refreshed every batch and reduce their gradients at
  its end; ReLibra's per-micro-batch replicas are copied over NVLink with UltraEP's relay
  tree and, being known ahead (routing replay), hidden behind the layer's attention; plan and
  reroute are computed ahead, off the critical path;
- expert load: the ``ou`` generator (``moe/loads.py``: log-normal popularity whose log-weights
  follow a stationary AR(1)) at each of the seven max/mean GPU loads without balancing that
  UltraEP's blog publishes (``moe/load_presets.py``: Megatron-LM training at EP64, 1.30 /
  2.23 / 2.86; SGLang prefill 2.06 / 3.09 / 3.68 / 4.01). ReLibra publishes no load
  statistic; the UltraEP blog says RL training loads, lacking pre-training's balancing
  regulation, show "strong dynamics similar to inference prefill, as observed in ReLibra", so
  the prefill presets are the RL-like ones. Each is calibrated on Qwen3-235B's shape at its
  measured EP size (EP64; GLM-4.7's EP40, 4 experts per GPU, at EP32, the same 4 per GPU), so
  at this EP32 the max/mean is what that routing gives on 4 experts per GPU (lower). The
  load's correlation between consecutive micro-batches (``autocorr`` 0.9) is unpublished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.moe.batch_pass import (
    BatchResult,
    Runner,
    TrainingBatches,
    run_eplb_per_batch,
    run_eplb_per_microbatch,
    run_force_balanced,
    run_static,
    run_two_timescale,
)
from fleetsim.moe.compute import MoeLayerSpec
from fleetsim.moe.ep_pass import EpPassModel
from fleetsim.moe.load_presets import get_preset, preset_spec
from fleetsim.moe.loads import LoadSpec, make_loads
from fleetsim.moe.outer import OuterLayout, outer_s
from fleetsim.repro.frame import (
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    add,
    better_ratio,
    fmt_ratios,
    setup_from,
)

POLICIES = ("relibra", "megatron", "eplb_oracle", "force_balanced")
WORKLOADS = ("ultraep-deepseek-v3-train", "ultraep-glm4.5-106b-train",
             "ultraep-qwen3-235b-train", "ultraep-glm4.7-358b-prefill-mixed",
             "ultraep-glm4.7-358b-prefill-stem", "ultraep-qwen3-235b-prefill-stem",
             "ultraep-qwen3-235b-prefill-mixed")
"""The load presets (``moe/load_presets.py``) the comparison sweeps."""
ABLATION_WORKLOADS = ("ultraep-qwen3-235b-train", "ultraep-qwen3-235b-prefill-stem")
PAPER_VS_MEGATRON, PAPER_VS_EPLB = 1.6, 1.2
PAPER_IDEAL_GAP = (0.06, 0.10)
"""The abstract's "up to 1.6x", "up to 1.2x" and "within 6%-10%" of the ideal."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RelibraSetup:
    """What ``--set key=value`` may change (defaults: the module docstring's choices)."""

    num_batches: int = 4
    """Scored batches (RL training steps) per workload."""
    num_warmup_batches: int = 1
    """Batches before them that only set the planners' starting placement."""
    microbatches_per_batch: int = 8
    num_layers: int = 94
    """MoE layers simulated (times are scaled to the model's 94)."""
    ep: int = 32
    gpus_per_node: int = 8
    gpu: str = "h200"
    num_spare_slots_per_gpu: int = 2
    tokens_per_gpu: int = 4096
    max_swaps_per_batch: int = 8
    autocorr: float = 0.9
    """Correlation of the expert load between consecutive micro-batches (unpublished)."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_batches", "num_warmup_batches", "microbatches_per_batch",
                     "num_layers", "ep", "gpus_per_node", "tokens_per_gpu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FleetsimInputError(name, value, "must be an integer >= 1")
        if 128 % self.ep:
            raise FleetsimInputError("ep", self.ep, "must divide Qwen3-235B's 128 experts "
                                     "(8, 16, 32, 64 or 128)")
        if self.ep % self.gpus_per_node or self.ep // self.gpus_per_node < 2:
            raise FleetsimInputError("gpus_per_node", self.gpus_per_node,
                                     f"must divide ep={self.ep} into 2 or more nodes")
        if not 1 <= self.num_spare_slots_per_gpu <= 16:
            raise FleetsimInputError("num_spare_slots_per_gpu", self.num_spare_slots_per_gpu,
                                     "must be in 1..16 (ReLibra replicates into spare slots)")
        if self.max_swaps_per_batch < 0:
            raise FleetsimInputError("max_swaps_per_batch", self.max_swaps_per_batch,
                                     "must be >= 0")
        if not 0 <= self.autocorr < 1:
            raise FleetsimInputError("autocorr", self.autocorr, "must be in [0, 1)")


QUICK = {"num_batches": 1, "microbatches_per_batch": 4, "num_layers": 16}


RUNNERS: dict[str, Runner] = {
    "relibra": run_two_timescale, "megatron": run_static, "eplb_oracle": run_eplb_per_batch,
    "force_balanced": run_force_balanced}


def pass_model_for(setup: RelibraSetup, num_spare_slots_per_gpu: int | None = None
                   ) -> EpPassModel:
    """Training micro-batches of Qwen3-235B-A22B on the setup's EP group."""
    spare = setup.num_spare_slots_per_gpu if num_spare_slots_per_gpu is None else (
        num_spare_slots_per_gpu)
    return EpPassModel(get_model("qwen3-235b"), get_gpu(setup.gpu), ep=setup.ep,
                       domain=setup.gpus_per_node, seq_lens=[setup.tokens_per_gpu], train=True,
                       num_spare_slots_per_gpu=spare)


def make_workload(setup: RelibraSetup, preset: str) -> TrainingBatches:
    """Batches of Qwen3-235B training micro-batches routed as the load preset measured."""
    pass_model = pass_model_for(setup)
    model = get_model("qwen3-235b")
    num_batches = setup.num_warmup_batches + setup.num_batches
    spec = LoadSpec(num_microbatches=num_batches * setup.microbatches_per_batch,
                    num_layers=setup.num_layers, num_experts=model.num_experts,
                    num_tokens=setup.tokens_per_gpu * setup.ep,
                    top_k=model.num_experts_per_token, autocorr=setup.autocorr)
    loads = make_loads("ou", preset_spec(preset, spec, tokens_per_gpu=setup.tokens_per_gpu),
                       setup.seed)
    batches = list(loads.reshape(num_batches, setup.microbatches_per_batch, *loads.shape[1:]))
    return TrainingBatches(pass_model, batches, max_swaps_per_batch=setup.max_swaps_per_batch)


def run_workload(setup: RelibraSetup, scenario: str,
                 runners: Mapping[str, Runner] | None = None
                 ) -> dict[str, list[BatchResult]]:
    """Every policy on the same batches; warm-up batches dropped."""
    w = make_workload(setup, scenario)
    return {name: run(w)[setup.num_warmup_batches:]
            for name, run in (runners or RUNNERS).items()}


def summarize(rows: list[BatchResult], ideal_s: float, setup: RelibraSetup) -> dict[str, Any]:
    scale = 94 / setup.num_layers  # every part is per layer, so shares are unscaled
    total = sum(r.total_s for r in rows)
    passes = [p for r in rows for p in r.passes]
    kinds = sorted({k for r in rows for k in r.exposed_by_kind})
    return {
        "share_of_ideal": ideal_s / total,
        "batch_s": total / len(rows) * scale,
        "microbatches_per_batch": setup.microbatches_per_batch,
        "gpu": setup.gpu,
        "tokens_per_s_per_gpu": setup.tokens_per_gpu * len(passes) / (total * scale),
        "imbalance": float(np.mean([p.imbalance for p in passes])),
        "node_imbalance": float(np.mean([r.node_imbalance for r in rows])),
        "exposed_ms_per_batch": {k: float(np.mean([r.exposed_by_kind.get(k, 0.0)
                                                   for r in rows])) * scale * 1e3
                                 for k in kinds},
        "moved_gb_per_batch": {
            "nvlink": float(np.mean([r.intra_bytes for r in rows])) * scale / 1e9,
            "network": float(np.mean([r.inter_bytes for r in rows])) * scale / 1e9},
        "breakdown_s_per_batch": {
            k: float(np.mean([sum(getattr(p, k) for p in r.passes) for r in rows])) * scale
            for k in ("dense_s", "expert_s", "all_to_all_s")},
    }


def compare(ctx: ReproContext) -> Comparison:
    setup = setup_from(ctx, RelibraSetup, QUICK, "relibra")
    results: dict[str, dict[str, float | None]] = {p: {} for p in POLICIES}
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    for scenario in WORKLOADS:
        if ctx.progress is not None:
            ctx.progress(scenario)
        runs = run_workload(setup, scenario)
        ideal_s = sum(r.total_s for r in runs["force_balanced"])
        for policy, rows in runs.items():
            s = summarize(rows, ideal_s, setup)
            summaries[(policy, scenario)] = s
            results[policy][scenario] = s["share_of_ideal"]
            ctx.keep(policy, scenario, s, {"workload": scenario, "policy": policy,
                                           "model": "Qwen3-235B-A22B",
                                           **dataclasses.asdict(setup)})
    comparison = _comparison(results, summaries)
    if not ctx.quick:
        comparison.notes.extend(ablations(setup, ctx))
    return comparison


def _ratios(results: dict[str, dict[str, float | None]], baseline: str) -> list[float | None]:
    return [better_ratio(results["relibra"][k], results[baseline][k], "higher")
            for k in WORKLOADS]


def _comparison(results: dict[str, dict[str, float | None]],
                summaries: dict[tuple[str, str], dict[str, Any]]) -> Comparison:
    vs_megatron, vs_eplb = _ratios(results, "megatron"), _ratios(results, "eplb_oracle")
    best = max((r for r in vs_megatron if r is not None), default=None)
    gap = [1 - (results["relibra"][k] or 0.0) for k in WORKLOADS]
    headline: dict[str, float | None] = {
        p: float(np.mean([results[p][k] or 0.0 for k in WORKLOADS])) for p in POLICIES}
    lo, hi = PAPER_IDEAL_GAP
    notes = [
        f"ReLibra over Megatron-LM per workload ({', '.join(WORKLOADS)}): "
        f"{fmt_ratios(vs_megatron)} (paper: up to {PAPER_VS_MEGATRON}x)",
        f"ReLibra over EPLB with oracle batch loads: {fmt_ratios(vs_eplb)} (paper: up to "
        f"{PAPER_VS_EPLB}x)",
        "ReLibra below force-balanced: " + ", ".join(f"{g:.1%}" for g in gap)
        + f" (paper: within {lo:.0%}-{hi:.0%})",
    ]
    for k in WORKLOADS:
        s = {p: summaries[(p, k)] for p in POLICIES}
        notes.append(
            f"{k} (published {get_preset(k).max_over_mean:.2f} at EP{get_preset(k).ep}): "
            f"max/mean GPU load at EP32 megatron {s['megatron']['imbalance']:.2f}, eplb_oracle "
            f"{s['eplb_oracle']['imbalance']:.2f}, relibra {s['relibra']['imbalance']:.3f}; "
            f"max/mean node load megatron {s['megatron']['node_imbalance']:.3f}, eplb_oracle "
            f"{s['eplb_oracle']['node_imbalance']:.3f}, relibra "
            f"{s['relibra']['node_imbalance']:.3f}")
        for p in ("relibra", "eplb_oracle"):
            exp = s[p]["exposed_ms_per_batch"]
            moved = s[p]["moved_gb_per_batch"]
            notes.append(
                f"{k} {p}: per batch of {s[p]['batch_s']:.2f} s, moved "
                f"{moved['network']:.1f} GB over the network and {moved['nvlink']:.1f} GB over "
                f"NVLink; exposed " + ", ".join(f"{n} {v:.1f} ms" for n, v in exp.items()))
    notes.extend(_step_parts_notes(summaries))
    return Comparison(results=results, ratio=best, headline=headline, notes=notes)


def _step_parts_notes(summaries: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """The force-balanced micro-batch's parts at Qwen3's training skew (the expert GEMMs'
    training efficiency, the non-MoE share) and the time outside it on Megatron-Bridge's
    layout for this model (``moe/outer.py``; the bubble's share does not depend on the GPU)."""
    k = "ultraep-qwen3-235b-train"
    ideal = summaries[("force_balanced", k)]
    model, gpu = get_model("qwen3-235b"), get_gpu(ideal["gpu"])
    spec = MoeLayerSpec.from_model(model)
    parts = ideal["breakdown_s_per_batch"]
    per_batch = ideal["microbatches_per_batch"]
    microbatch_s = sum(parts.values()) / per_batch
    tokens = ideal["tokens_per_s_per_gpu"] * ideal["batch_s"]  # one batch, per GPU
    flops = tokens * spec.top_k * spec.flops_per_routed_token * 3 * spec.num_moe_layers
    tflops = flops / parts["expert_s"] / 1e12
    total = sum(parts.values())
    outer = outer_s(model, gpu, OuterLayout(), microbatch_s)
    return [f"{k} force-balanced micro-batch ({microbatch_s:.3f} s): dense part "
            f"{parts['dense_s'] / total:.0%}, expert GEMMs {parts['expert_s'] / total:.0%} (at "
            f"{tflops:.0f} TFLOPS forward + backward, {tflops * 1e12 / gpu.peak_bf16_flops:.0%} "
            f"of the bf16 peak), all-to-alls {parts['all_to_all_s'] / total:.0%}; outside it "
            f"(Megatron-Bridge's Qwen3-235B layout: PP 8, VP 3, GA 256, DP 32): "
            + ", ".join(f"{n} {v * 1e3:.2f} ms" for n, v in outer.items())
            + f", {sum(outer.values()) / microbatch_s:.1%} of the micro-batch"]


def ablations(setup: RelibraSetup, ctx: ReproContext) -> list[str]:
    """Each timescale alone, EPLB with its moves free and EPLB re-planned every micro-batch,
    on every workload."""
    notes = []
    for scenario in ABLATION_WORKLOADS:
        if ctx.progress is not None:
            ctx.progress(f"{scenario} ablations")
        runners: dict[str, Runner] = {
            "replicate_only": lambda w: run_two_timescale(w, reorder=False),
            # the inter-batch reorder alone: no spare slots, so no replicas
            "reorder_only": lambda w: run_two_timescale(
                dataclasses.replace(w, pass_model=pass_model_for(setup, 0))),
            "force_balanced": run_force_balanced,
            "eplb_oracle": run_eplb_per_batch, "eplb_per_microbatch": run_eplb_per_microbatch}
        runs = run_workload(setup, scenario, runners)
        ideal = sum(r.total_s for r in runs["force_balanced"])
        free = sum(sum(p.total_s for p in r.passes) for r in runs["eplb_oracle"])
        share = {p: ideal / sum(r.total_s for r in rows) for p, rows in runs.items()}
        notes.append(
            f"ablation {scenario}: share of force-balanced with only the intra-batch replication "
            f"(Megatron's masters) {share['replicate_only']:.1%}, only the inter-batch reorder "
            f"(no spare slots) {share['reorder_only']:.1%}; EPLB oracle with its moves free "
            f"{ideal / free:.1%} (charged {share['eplb_oracle']:.1%}); EPLB re-planned on every "
            f"micro-batch's exact load {share['eplb_per_microbatch']:.1%} (exposed "
            f"{_exposed_ms(runs['eplb_per_microbatch'], setup):.0f} ms per batch)")
    return notes


def _exposed_ms(rows: list[BatchResult], setup: RelibraSetup) -> float:
    per_batch = np.mean([sum(r.exposed_by_kind.values()) for r in rows])
    return float(per_batch) * 94 / setup.num_layers * 1e3


RELIBRA = add(Reproduction(
    key="relibra",
    paper=Paper(title="ReLibra: Routing-Replay-Guided Load Balancing for MoE Training in "
                      "Reinforcement Learning", id="arXiv:2605.08639"),
    claim="Training throughput up to 1.6x over Megatron-LM and up to 1.2x over EPLB even when "
          "EPLB is given oracle loads; within 6-10% of an idealized balanced baseline.",
    setup="Qwen3-235B-A22B bf16 RL training (forward + backward), EP32 over 4 nodes of 8 "
          "H200, 4,096 tokens per GPU per micro-batch, 8 micro-batches per batch, 2 spare "
          "slots per GPU; expert loads: stationary log-normal loads calibrated to each of the "
          "seven max/mean GPU loads UltraEP's blog publishes without balancing (1.30-4.01 at "
          "EP64/EP40); 4 scored batches x 94 layers after 1 warm-up batch (--quick: 1 batch "
          "of 4 micro-batches x 16 layers)",
    system="relibra",
    baselines=("megatron", "eplb_oracle", "force_balanced"),
    baseline="megatron",
    metric=Metric(name="throughput / force-balanced", unit="fraction", direction="higher"),
    ratio_definition="relibra / megatron training throughput, best workload (the paper's "
                     "'up to')",
    paper_ratio=None,
    paper_ratio_source="not recoverable: only the abstract could be read, which gives the "
                       "best over the paper's settings (up to 1.6x), not this panel's value",
    paper_best=PAPER_VS_MEGATRON,
    loads=Loads(name="expert-load preset (published max/mean without balancing)",
                unit="preset", values=tuple(float(i + 1) for i in range(len(WORKLOADS))),
                quick_values=tuple(float(i + 1) for i in range(len(WORKLOADS))),
                labels=WORKLOADS),
    compare=compare,
    headline_metric=Metric(name="share of force-balanced throughput, mean over workloads",
                           unit="fraction", direction="higher"),
))
