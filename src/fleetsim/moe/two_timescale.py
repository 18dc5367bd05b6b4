"""Two-timescale expert balancing, after ReLibra (RL training with routing replay).

In RL training the routing of a whole batch is known before it runs (the rollout saw the same
tokens and weights). ReLibra exploits that on two timescales:

1. per batch: reorder master experts across nodes from the batch's replayed load, with a
   limit on how many experts cross nodes (inter-node copies are the expensive ones), then
   re-pack each node's masters over its GPUs (NVLink copies);
2. per microbatch: replicate inside each node only, with the quota planner restricted to the
   node, so no replica ever crosses the network.

Cross-node imbalance inside a batch is therefore only corrected at batch boundaries.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import register_balancer
from fleetsim.moe.eplb import balanced_packing
from fleetsim.moe.placement import (
    BalanceView,
    FloatArray,
    IntArray,
    Placement,
    packed_phy2log,
    reorder_across_nodes,
)
from fleetsim.moe.quota import plan_view


def place_masters(
    batch_load: FloatArray,
    node_of_expert: IntArray,
    num_nodes: int,
    gpus_per_node: int,
    slots_per_gpu: int,
) -> IntArray:
    """phy2log with each node's masters packed over its GPUs by EPLB's greedy on
    ``batch_load``; spare slots hold copies of their GPU's first master."""
    num_layers, num_experts = batch_load.shape
    per_node = num_experts // num_nodes
    ids = np.argsort(node_of_expert, axis=1, kind="stable").reshape(
        num_layers * num_nodes, per_node
    )
    node_load = np.take_along_axis(batch_load.repeat(num_nodes, axis=0), ids, axis=1)
    # (layer, node) rows: per-node local placement with the same layout as packed_phy2log.
    local = packed_phy2log(node_load, gpus_per_node, slots_per_gpu)
    phy2log = np.take_along_axis(ids, local, axis=1)
    return phy2log.reshape(num_layers, -1)


@register_balancer("two_timescale")
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TwoTimescalePlanner:
    """ReLibra-style: per-batch cross-node reordering from replayed routing, per-microbatch
    replication inside the node.

    max_swaps_per_batch: expert pairs swapped between nodes per layer and batch (each swap
        copies two experts over the network).
    max_moved_bytes_per_gpu: per-microbatch copy budget of the intra-node planner.
    tolerance: stop once a node's max/mean GPU load is within ``1 + tolerance``.
    """

    max_swaps_per_batch: int = 8
    max_moved_bytes_per_gpu: float | None = None
    tolerance: float = 0.02

    sees = "replayed batch load + exact current load"
    prefetchable = "batch-start moves only"

    def __post_init__(self) -> None:
        if self.max_swaps_per_batch < 0:
            raise FleetsimInputError(
                "two_timescale.max_swaps_per_batch", self.max_swaps_per_batch, "must be >= 0"
            )

    def plan(self, view: BalanceView) -> Placement:
        initial = None
        if view.previous is None or view.microbatch_in_batch == 0:
            initial = self._reorder(view)
        return plan_view(
            view,
            self.max_moved_bytes_per_gpu,
            self.tolerance,
            within_node=True,
            initial_phy2log=initial,
        )

    def _reorder(self, view: BalanceView) -> IntArray:
        # Without replayed routing, the microbatch's own load is the best available estimate.
        batch_load = view.batch_load if view.batch_load is not None else view.expert_load
        spg, gpn = view.slots_per_gpu, view.gpus_per_node
        if view.previous is None:
            # Nodes first (as EPLB's hierarchical policy): a hot expert must land on a node
            # that has room for it, since its replicas never leave the node.
            node_of_expert, _ = balanced_packing(batch_load.astype(np.float32), view.num_nodes)
            return place_masters(batch_load, node_of_expert, view.num_nodes, gpn, spg)
        num_masters = view.num_experts // view.num_gpus
        prev = view.previous.phy2log
        master_cols = np.flatnonzero(np.arange(prev.shape[1]) % spg < num_masters)
        node_of_expert = np.empty_like(view.expert_load, dtype=np.int64)
        node_of_slot = np.broadcast_to(master_cols // spg // gpn, (prev.shape[0], master_cols.size))
        np.put_along_axis(node_of_expert, prev[:, master_cols], node_of_slot, axis=1)
        node_of_expert = reorder_across_nodes(
            batch_load, node_of_expert, view.num_nodes, self.max_swaps_per_batch
        )
        phy2log = place_masters(batch_load, node_of_expert, view.num_nodes, gpn, spg)
        # Keep last microbatch's replicas in the spare slots: reusing them is free.
        spare_cols = np.flatnonzero(np.arange(prev.shape[1]) % spg >= num_masters)
        phy2log[:, spare_cols] = prev[:, spare_cols]
        return phy2log
