"""Time of one micro-batch through an expert-parallel MoE model, layer by layer: the dense part
(attention, projections, norms) from the measured tables of ``perf/training.py``, the expert
GEMMs of the slowest GPU at its routed load from the measured MoE tables, the dispatch and
combine all-to-alls of ``step_model.all_to_all_s``, and the exposed part of UltraEP's balancing
operations (``overheads.py``). Training runs forward and backward (2x the forward's compute,
all-to-alls again); prefill runs the forward only.

Attention is data parallel (each GPU owns ``tokens_per_gpu`` tokens), so the dense part is the
same on every GPU and only the MoE part depends on the placement: every layer waits for its
slowest GPU (dispatch and combine are barriers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.moe.compute import EpHardware, MoeLayerSpec, default_compute
from fleetsim.moe.overheads import OverheadModel, layer_overheads, sync_s
from fleetsim.moe.placement import BalanceView, FloatArray, Placement, imbalance
from fleetsim.moe.step_model import ExpertParallelConfig, all_to_all_s
from fleetsim.perf.training import BACKWARD_OVER_FORWARD, ForwardModel

Planner = Callable[[BalanceView], Placement]
"""A balancer's ``plan``; None in ``run_pass`` means force-balanced (the ideal)."""


@dataclass(slots=True)
class PassBreakdown:
    """Seconds of one micro-batch (forward, plus backward when training), split so that
    ``dense_s + expert_s + all_to_all_s + exposed_s == total_s``."""

    dense_s: float
    expert_s: float
    all_to_all_s: float
    exposed_s: float
    imbalance: float
    """Mean over layers of max/mean GPU routed tokens."""
    ops_s: dict[str, float] = field(default_factory=dict)
    """Per-layer means of UltraEP's operations (plan, reroute, weight_sync, grad_reduce,
    forward_exposed, backward_exposed); empty for the other policies."""

    @property
    def total_s(self) -> float:
        return self.dense_s + self.expert_s + self.all_to_all_s + self.exposed_s


class EpPassModel:
    """One EP group of ``ep`` GPUs, NVLink domains of ``domain`` GPUs, running ``model``."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, *, ep: int, domain: int,
                 seq_lens: Sequence[int], train: bool, num_spare_slots_per_gpu: int = 2,
                 overheads: OverheadModel | None = None) -> None:
        if domain > ep or ep % domain:
            raise FleetsimInputError("domain", domain, f"must divide the EP size {ep}")
        # Training and prefill in bf16 (Megatron-LM, Qwen3's released bf16 weights): the
        # all-to-alls move bf16 activations both ways.
        self.spec = dataclasses.replace(
            MoeLayerSpec.from_model(model), weight_bytes_per_param=2.0,
            dispatch_bytes_per_value=2.0, combine_bytes_per_value=2.0)
        self.hw = EpHardware.from_gpu(gpu, fp8=False)
        self.ep = ExpertParallelConfig(num_gpus=ep, gpus_per_node=domain,
                                       num_spare_slots_per_gpu=num_spare_slots_per_gpu,
                                       balancer="none")
        self.slots_per_gpu = self.ep.slots_per_gpu(self.spec.num_experts)
        self.num_masters = self.spec.num_experts // ep
        # The table should reach the mean routed tokens per GPU (beyond it: linear).
        routed_per_gpu = sum(seq_lens) * self.spec.top_k
        self.compute = default_compute(self.spec, self.hw, ep, routed_per_gpu)
        self.compute_source = getattr(self.compute, "source", "roofline")
        self.train = train
        self.overheads = overheads or OverheadModel()
        fwd = ForwardModel(model, gpu, 1).forward(list(seq_lens))
        # Everything but the routed experts, per layer; the LM head once per micro-batch.
        self.dense_layer_s = (fwd.layers_s - fwd.moe_s) / model.num_layers
        self.head_s = fwd.head_s
        self.num_tokens = ep * sum(seq_lens)

    @property
    def passes(self) -> float:
        """Forward-equivalents of compute per micro-batch: 1 + backward when training."""
        return 1.0 + (BACKWARD_OVER_FORWARD if self.train else 0.0)

    def _moe_s(self, tokens_by_slot: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(expert GEMM s, dispatch + combine s) per layer; tokens_by_slot (layers, gpus,
        slots)."""
        expert = self.compute.gpu_time_s(tokens_by_slot).max(-1)
        dispatch, combine = all_to_all_s(tokens_by_slot.sum(-1), self.ep, self.spec, self.hw)
        a2a_passes = 2.0 if self.train else 1.0  # backward sends the gradients back alike
        return expert * self.passes, (dispatch + combine) * a2a_passes

    def _dense_s(self, num_layers: int) -> float:
        return (self.dense_layer_s * num_layers + self.head_s) * self.passes

    def ideal(self, load: FloatArray) -> PassBreakdown:
        """Force-balanced: every GPU computes and receives the mean routed tokens."""
        num_layers = load.shape[0]
        mean = load.sum(1) / self.ep.num_gpus
        tokens = np.repeat((mean / self.slots_per_gpu)[:, None, None], self.ep.num_gpus, 1)
        tokens = np.repeat(tokens, self.slots_per_gpu, 2)
        expert, a2a = self._moe_s(tokens)
        return PassBreakdown(self._dense_s(num_layers), float(expert.sum()), float(a2a.sum()),
                             0.0, 1.0)

    def placed(self, placement: Placement, load: FloatArray, *, ultraep: bool) -> PassBreakdown:
        """``placement`` serving ``load`` (layers, experts); ``ultraep`` charges UltraEP's
        per-layer plan, reroute, replica weight sync and (training) gradient reduce."""
        num_layers = load.shape[0]
        tokens = placement.tokens_by_slot(load)
        by_slot = tokens.reshape(num_layers, self.ep.num_gpus, self.slots_per_gpu)
        expert, a2a = self._moe_s(by_slot)
        ops: dict[str, float] = {}
        exposed = 0.0
        if ultraep:
            ops, exposed = self._ultraep_ops(placement.phy2log, tokens > 0)
        return PassBreakdown(self._dense_s(num_layers), float(expert.sum()), float(a2a.sum()),
                             exposed, float(imbalance(by_slot.sum(-1)).mean()), ops)

    def _ultraep_ops(self, phy2log: np.ndarray, used: np.ndarray) -> tuple[dict[str, float],
                                                                          float]:
        """Per-layer mean seconds of each operation, and the total exposed over all layers."""
        bw = self.hw.intra_node_bytes_per_s  # replicas never leave the NVLink domain
        weights = self.spec.expert_bytes
        names = ("plan", "reroute", "weight_sync", "grad_reduce", "forward_exposed",
                 "backward_exposed")
        sums = dict.fromkeys(names, 0.0)
        # The gradient reduce overlaps the router and attention backward of the same layer.
        hidden_by = self.dense_layer_s * BACKWARD_OVER_FORWARD
        for layer in range(phy2log.shape[0]):
            sync = sync_s(phy2log[layer], used[layer], self.ep.num_gpus, self.num_masters,
                          weights, bw, self.overheads)
            # Replica gradients (bf16, as the weights) travel the same tree in reverse.
            ops = layer_overheads(sync, sync, hidden_by, self.overheads, train=self.train)
            for name, value in zip(names, (ops.plan_s, ops.reroute_s, ops.weight_sync_s,
                                           ops.grad_reduce_s, ops.forward_exposed_s,
                                           ops.backward_exposed_s), strict=True):
                sums[name] += value
        num_layers = phy2log.shape[0]
        exposed = sums["forward_exposed"] + sums["backward_exposed"]
        return {k: v / num_layers for k, v in sums.items()}, exposed


def run_pass(model: EpPassModel, loads: FloatArray, plan: Planner | None, *, warmup: int,
             ultraep: bool = False) -> list[PassBreakdown]:
    """Micro-batches ``loads`` (num_microbatches, layers, experts) in order; the first
    ``warmup`` only build history and are not returned. ``plan`` sees each micro-batch's
    view (history, previous placement, exact load: what it reads is up to it)."""
    if not 0 <= warmup < loads.shape[0]:
        raise FleetsimInputError("warmup", warmup, f"must be in [0, {loads.shape[0]})")
    history: list[FloatArray] = []
    previous: Placement | None = None
    out = []
    for t, load in enumerate(loads):
        if plan is None:
            result = model.ideal(load)
        else:
            view = BalanceView(
                expert_load=load, num_gpus=model.ep.num_gpus,
                gpus_per_node=model.ep.gpus_per_node, slots_per_gpu=model.slots_per_gpu,
                history=tuple(history), previous=previous, microbatch_index=t,
                expert_bytes=model.spec.expert_bytes)
            previous = plan(view)
            result = model.placed(previous, load, ultraep=ultraep)
        history = [*history, load][-64:]
        if t >= warmup:
            out.append(result)
    return out
