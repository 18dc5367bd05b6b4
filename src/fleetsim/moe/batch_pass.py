"""MoE training batches (RL steps of several micro-batches) through the expert-parallel pass
model, one balancing policy at a time: every micro-batch priced by ``ep_pass.EpPassModel``,
plus the exposed part of the policy's expert moves (``reshuffle.py``).

The policies differ in when they re-place experts and what they know: none (Megatron-LM's
static placement), EPLB once per batch on the batch's summed load or on every micro-batch's
exact load, and the two-timescale planner (ReLibra: reorder across nodes per batch from the
replayed routing, replicate inside nodes per micro-batch). Each runner returns one
``BatchResult`` per batch, warm-up batches included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fleetsim.moe.balancers import EplbFresh, NoBalancing
from fleetsim.moe.ep_pass import EpPassModel, PassBreakdown
from fleetsim.moe.overheads import exposed_s
from fleetsim.moe.placement import BalanceView, FloatArray, IntArray, Placement
from fleetsim.moe.reshuffle import (
    BatchTransfers,
    TrainingStateBytes,
    batch_exposed_s,
    batch_transfers,
    new_replicas,
    replica_sync_s,
    static_owners,
)
from fleetsim.moe.two_timescale import TwoTimescalePlanner
from fleetsim.perf.training import BACKWARD_OVER_FORWARD


@dataclass(slots=True)
class BatchResult:
    """One batch of one policy: its micro-batches priced by the pass model plus the exposed
    seconds of its balancing transfers."""

    passes: list[PassBreakdown]
    exposed_by_kind: dict[str, float] = field(default_factory=dict)
    node_imbalance: float = 1.0
    """Mean over micro-batches and layers of max/mean routed tokens per node."""
    intra_bytes: float = 0.0
    inter_bytes: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(p.total_s for p in self.passes) + sum(self.exposed_by_kind.values())


@dataclass(frozen=True, slots=True, eq=False)
class TrainingBatches:
    """A pass model and the per-batch loads every policy runs on."""

    pass_model: EpPassModel
    batches: list[FloatArray]
    """(microbatches, layers, experts) routed tokens per batch, warm-up batches first."""
    max_swaps_per_batch: int = 8
    """The two-timescale planner's cross-node swaps per layer and batch."""
    state: TrainingStateBytes = TrainingStateBytes()

    @property
    def num_layers(self) -> int:
        return int(self.batches[0].shape[1])

    @property
    def params_per_expert(self) -> float:
        spec = self.pass_model.spec
        return spec.expert_bytes / spec.weight_bytes_per_param

    def static_owners(self) -> IntArray:
        return static_owners(self.num_layers, self.pass_model.spec.num_experts,
                             self.pass_model.ep.num_gpus)

    def view(self, load: FloatArray, *, batch_load: FloatArray | None = None, index: int = 0,
             in_batch: int = 0, previous: Placement | None = None) -> BalanceView:
        ep = self.pass_model.ep
        return BalanceView(expert_load=load, num_gpus=ep.num_gpus,
                           gpus_per_node=ep.gpus_per_node,
                           slots_per_gpu=self.pass_model.slots_per_gpu, batch_load=batch_load,
                           microbatch_index=index, microbatch_in_batch=in_batch,
                           previous=previous, expert_bytes=self.pass_model.spec.expert_bytes)

    def transfers(self, phy2log: IntArray, owner: IntArray, slots_per_gpu: int, *,
                  fixed_owners: bool = False, held: IntArray | None = None
                  ) -> tuple[IntArray, BatchTransfers]:
        """New owners and the transfers of a batch start whose placement is ``phy2log``
        (``fixed_owners`` and ``held``: see ``batch_transfers``)."""
        hw = self.pass_model.hw
        return batch_transfers(
            phy2log, owner, slots_per_gpu=slots_per_gpu,
            gpus_per_node=self.pass_model.ep.gpus_per_node,
            params_per_expert=self.params_per_expert, state=self.state,
            intra_bytes_per_s=hw.intra_node_bytes_per_s,
            inter_bytes_per_s=hw.inter_node_bytes_per_s,
            link_latency_s=self.pass_model.overheads.link_latency_s,
            fixed_owners=fixed_owners, held=held)

    def batch_costs(self, moves: BatchTransfers, passes: list[PassBreakdown]
                    ) -> dict[str, float]:
        """Exposed seconds of a batch start's transfers; the hiding windows come from
        ``passes``, the micro-batches they overlap."""
        passes_per_mb = self.pass_model.passes
        compute = [p.dense_s + p.expert_s for p in passes]
        forward = compute[0] / passes_per_mb
        backward = compute[-1] * BACKWARD_OVER_FORWARD / passes_per_mb
        exposed = batch_exposed_s(moves, forward_compute_s=forward,
                                  backward_compute_s=backward, batch_compute_s=sum(compute))
        return {f"batch_{k}": v for k, v in exposed.items()}


Runner = Callable[[TrainingBatches], list[BatchResult]]
"""A policy: every batch of a workload, warm-up first."""


def node_imbalance(placement: Placement, load: FloatArray, gpus_per_node: int) -> float:
    """Mean over layers of max/mean routed tokens per node."""
    gpu_load = placement.gpu_load(load)
    node = gpu_load.reshape(gpu_load.shape[0], -1, gpus_per_node).sum(-1)
    return float((node.max(-1) / node.mean(-1)).mean())


def run_static(w: TrainingBatches) -> list[BatchResult]:
    """Megatron-LM: static placement, no balancing, no transfers."""
    placement = NoBalancing().plan(w.view(w.batches[0][0]))
    gpn = w.pass_model.ep.gpus_per_node
    return [BatchResult([w.pass_model.placed(placement, load, ultraep=False) for load in b],
                        node_imbalance=float(np.mean([node_imbalance(placement, x, gpn)
                                                      for x in b])))
            for b in w.batches]


def run_force_balanced(w: TrainingBatches) -> list[BatchResult]:
    """Every GPU at the mean load, no transfers: the ideal."""
    return [BatchResult([w.pass_model.ideal(load) for load in b]) for b in w.batches]


def run_eplb_per_batch(w: TrainingBatches) -> list[BatchResult]:
    """EPLB re-planned at each batch start from the batch's true summed load (an oracle); the
    placement holds for the batch; its moves and replicas charged like every other policy's."""
    pm, gpn = w.pass_model, w.pass_model.ep.gpus_per_node
    owner = w.static_owners()
    out = []
    for batch in w.batches:
        placement = EplbFresh().plan(w.view(batch.sum(0)))
        owner, moves = w.transfers(placement.phy2log, owner, pm.slots_per_gpu)
        passes = [pm.placed(placement, load, ultraep=False) for load in batch]
        out.append(BatchResult(passes, w.batch_costs(moves, passes),
                               float(np.mean([node_imbalance(placement, x, gpn)
                                              for x in batch])),
                               moves.intra_bytes, moves.inter_bytes))
    return out


def run_eplb_per_microbatch(w: TrainingBatches) -> list[BatchResult]:
    """EPLB re-planned on every micro-batch's exact load (an oracle no deployed EPLB has).
    Optimizer state stays with Megatron's owners (moving it per micro-batch would be absurd),
    so every other holder is a replica: weights copied when it appears (again after each step),
    its gradient reduced to the owner; each micro-batch's copies hide behind its own compute."""
    pm, gpn = w.pass_model, w.pass_model.ep.gpus_per_node
    owner = w.static_owners()
    out = []
    for batch in w.batches:
        passes, intra, inter, held = [], 0.0, 0.0, None
        costs: dict[str, float] = {}
        node_imb = []
        for load in batch:
            placement = EplbFresh().plan(w.view(load))
            _, moves = w.transfers(placement.phy2log, owner, pm.slots_per_gpu,
                                   fixed_owners=True, held=held)
            passes.append(pm.placed(placement, load, ultraep=False))
            for kind, value in w.batch_costs(moves, passes[-1:]).items():
                costs[kind] = costs.get(kind, 0.0) + value
            intra, inter = intra + moves.intra_bytes, inter + moves.inter_bytes
            node_imb.append(node_imbalance(placement, load, gpn))
            held = placement.phy2log
        out.append(BatchResult(passes, costs, float(np.mean(node_imb)), intra, inter))
    return out


def _replica_costs(pm: EpPassModel, placement: Placement, load: FloatArray,
                   resident: IntArray | None) -> tuple[float, float, float, IntArray]:
    """(exposed forward s, exposed backward s, NVLink bytes, slots now holding current
    weights, -1 elsewhere) of one micro-batch's in-node replicas. The copies are known ahead
    (routing replay), so they run during each layer's attention and the gradients go back
    during its attention backward."""
    spg, masters = pm.slots_per_gpu, pm.num_masters
    used = placement.tokens_by_slot(load) > 0
    copies = new_replicas(placement.phy2log, resident, used, spg, masters)
    sync = replica_sync_s(placement.phy2log, copies, num_gpus=pm.ep.num_gpus,
                          num_masters=masters, expert_bytes=pm.spec.expert_bytes,
                          link_bytes_per_s=pm.hw.intra_node_bytes_per_s, overheads=pm.overheads)
    dense = pm.dense_layer_s
    forward = sum(exposed_s(s, dense) for s in sync)
    backward = sum(exposed_s(s, dense * BACKWARD_OVER_FORWARD) for s in sync)
    moved = float(copies.sum()) * pm.spec.expert_bytes * 2  # weights out, bf16 grads back
    is_master = (np.arange(placement.phy2log.shape[1]) % spg) < masters
    keep = is_master[None, :] | used
    if resident is not None:
        keep |= placement.phy2log == resident
    return forward, backward, moved, np.where(keep, placement.phy2log, -1)


def run_two_timescale(w: TrainingBatches, *, reorder: bool = True) -> list[BatchResult]:
    """ReLibra: per batch, reorder masters across nodes on the batch's replayed load; per
    micro-batch, replicate inside the node on its exact load. ``reorder=False`` keeps
    Megatron's masters (the intra-batch timescale alone, an ablation)."""
    pm = w.pass_model
    gpn, spg, masters = pm.ep.gpus_per_node, pm.slots_per_gpu, pm.num_masters
    planner = TwoTimescalePlanner(max_swaps_per_batch=w.max_swaps_per_batch)
    owner = w.static_owners()
    master_cols = np.flatnonzero(np.arange(pm.ep.num_gpus * spg) % spg < masters)
    previous: Placement | None = None
    out = []
    for b, batch in enumerate(w.batches):
        passes, resident, node_imb = [], None, []
        exposed = {"replica_fwd": 0.0, "replica_bwd": 0.0}
        moves, intra, inter = None, 0.0, 0.0
        for m, load in enumerate(batch):
            view = w.view(load, batch_load=batch.sum(0) if reorder else None,
                          index=b * len(batch) + m, in_batch=m if reorder else 1,
                          previous=previous)
            if previous is None and not reorder:
                view = dataclasses.replace(view, previous=NoBalancing().plan(view))
            placement = planner.plan(view)
            if m == 0:
                owner, moves = w.transfers(placement.phy2log[:, master_cols], owner, masters)
                intra, inter = moves.intra_bytes, moves.inter_bytes
            fwd, bwd, moved, resident = _replica_costs(pm, placement, load, resident)
            exposed["replica_fwd"] += fwd
            exposed["replica_bwd"] += bwd
            intra += moved
            passes.append(pm.placed(placement, load, ultraep=False))
            node_imb.append(node_imbalance(placement, load, gpn))
            previous = placement
        assert moves is not None  # set by the batch's first micro-batch
        costs = w.batch_costs(moves, passes) | exposed
        out.append(BatchResult(passes, costs, float(np.mean(node_imb)), intra, inter))
    return out
