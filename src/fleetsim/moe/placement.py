"""Expert placements (which logical expert sits in each GPU slot, and its token share) and
the view a balancer plans from.

Layout follows EPLB: ``num_slots = num_gpus * slots_per_gpu`` physical slots per layer, slot
``j`` on GPU ``j // slots_per_gpu``. The first ``num_experts // num_gpus`` slots of each GPU
hold that GPU's *master* copies; the rest are *spare* slots for replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.eplb import balanced_packing

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True, eq=False)
class Placement:
    """One microbatch's expert placement for every MoE layer.

    phy2log: (num_layers, num_slots) logical expert held by each slot.
    share_by_slot: (num_layers, num_slots) fraction of its expert's tokens that each slot
        serves; the shares of one expert's slots sum to 1. EPLB-style placements split
        evenly (``1 / logcnt``); quota planners set explicit shares.
    slots_per_gpu: slots per GPU.
    """

    phy2log: IntArray
    share_by_slot: FloatArray
    slots_per_gpu: int

    @property
    def num_layers(self) -> int:
        return int(self.phy2log.shape[0])

    @property
    def num_gpus(self) -> int:
        return int(self.phy2log.shape[1]) // self.slots_per_gpu

    def tokens_by_slot(self, expert_load: FloatArray) -> FloatArray:
        """(num_layers, num_slots) tokens each slot computes when experts see ``expert_load``."""
        return self.share_by_slot * np.take_along_axis(expert_load, self.phy2log, axis=1)

    def gpu_load(self, expert_load: FloatArray) -> FloatArray:
        """(num_layers, num_gpus) routed tokens (token-expert pairs) computed by each GPU."""
        tokens = self.tokens_by_slot(expert_load)
        return tokens.reshape(self.num_layers, self.num_gpus, self.slots_per_gpu).sum(-1)

    def replica_counts(self, num_experts: int) -> IntArray:
        """(num_layers, num_experts) slots holding each expert."""
        offsets = (np.arange(self.num_layers) * num_experts)[:, None]
        flat = np.bincount(
            (self.phy2log + offsets).ravel(), minlength=self.num_layers * num_experts
        )
        return flat.reshape(self.num_layers, num_experts)


def even_split(phy2log: IntArray, num_experts: int, slots_per_gpu: int) -> Placement:
    """A placement whose replicas split their expert's tokens evenly (EPLB, vLLM, SGLang)."""
    num_layers = phy2log.shape[0]
    offsets = (np.arange(num_layers) * num_experts)[:, None]
    counts = np.bincount((phy2log + offsets).ravel(), minlength=num_layers * num_experts)
    share = 1.0 / counts[(phy2log + offsets)]
    return Placement(
        phy2log=phy2log.astype(np.int64), share_by_slot=share, slots_per_gpu=slots_per_gpu
    )


def static_phy2log(
    num_layers: int, num_experts: int, num_gpus: int, slots_per_gpu: int
) -> IntArray:
    """Masters in expert order (expert ``e`` on GPU ``e // masters_per_gpu``); each GPU's spare
    slots hold extra copies of its own first master, so they change nothing until reused."""
    masters_per_gpu = num_experts // num_gpus
    gpu = np.arange(num_gpus)[:, None]
    cols = np.arange(slots_per_gpu)[None, :]
    row = np.where(cols < masters_per_gpu, gpu * masters_per_gpu + cols, gpu * masters_per_gpu)
    return np.broadcast_to(row.ravel(), (num_layers, num_gpus * slots_per_gpu)).copy()


def packed_phy2log(expert_load: FloatArray, num_gpus: int, slots_per_gpu: int) -> IntArray:
    """Masters packed by EPLB's greedy onto GPUs to balance ``expert_load`` (e.g. a long-run
    average); spare slots hold copies of each GPU's first master, as in ``static_phy2log``."""
    num_layers, num_experts = expert_load.shape
    masters_per_gpu = num_experts // num_gpus
    pack, rank = balanced_packing(expert_load.astype(np.float32), num_gpus)
    phy2log = np.empty((num_layers, num_gpus * slots_per_gpu), dtype=np.int64)
    np.put_along_axis(
        phy2log,
        pack * slots_per_gpu + rank,
        np.broadcast_to(np.arange(num_experts), pack.shape),
        axis=1,
    )
    first = phy2log[:, ::slots_per_gpu]
    for lane in range(masters_per_gpu, slots_per_gpu):
        phy2log[:, lane::slots_per_gpu] = first
    return phy2log


def reorder_across_nodes(
    batch_load: FloatArray, node_of_expert: IntArray, num_nodes: int, max_swaps: int
) -> IntArray:
    """Swap expert pairs between the most and least loaded nodes, at most ``max_swaps`` per
    layer, each swap the one bringing the pair closest to their mean (vectorized over layers).
    A "node" is any bin of equal size: the two-timescale planner passes nodes, the quota
    planner's master re-placement passes single GPUs.

    batch_load: (num_layers, num_experts); node_of_expert: (num_layers, num_experts).
    Returns the new node of every expert; each node keeps its number of experts.
    """
    node_of_expert = node_of_expert.copy()
    num_layers, num_experts = batch_load.shape
    per_node = num_experts // num_nodes
    rows = np.arange(num_layers)
    for _ in range(max_swaps):
        node_load = np.zeros((num_layers, num_nodes))
        np.add.at(node_load, (rows[:, None], node_of_expert), batch_load)
        hot, cold = node_load.argmax(1), node_load.argmin(1)
        gap = node_load[rows, hot] - node_load[rows, cold]
        ids = np.argsort(node_of_expert, axis=1, kind="stable").reshape(
            num_layers, num_nodes, per_node
        )
        hot_ids, cold_ids = ids[rows, hot], ids[rows, cold]
        diff = (
            np.take_along_axis(batch_load, hot_ids, 1)[:, :, None]
            - np.take_along_axis(batch_load, cold_ids, 1)[:, None, :]
        )
        useful = (diff > 0) & (diff < gap[:, None, None])
        score = np.where(useful, np.abs(diff - gap[:, None, None] / 2), np.inf).reshape(
            num_layers, -1
        )
        best = score.argmin(1)
        ok = np.isfinite(score[rows, best])
        if not ok.any():
            break
        i, j = np.divmod(best, per_node)
        r = rows[ok]
        node_of_expert[r, hot_ids[rows, i][ok]] = cold[ok]
        node_of_expert[r, cold_ids[rows, j][ok]] = hot[ok]
    return node_of_expert


@dataclass(frozen=True, slots=True, eq=False)
class BalanceView:
    """What a balancer may look at when planning one microbatch (all loads are
    (num_layers, num_experts) routed tokens per logical expert).

    expert_load: this microbatch's exact load, known after gating. Real-time planners
        (UltraEP) use it; history-based ones (EPLB as deployed) must not.
    history: loads of earlier microbatches, oldest first.
    batch_load: the current batch's total load when routing is replayed (RL training,
        ReLibra), else None.
    microbatch_index: index of this microbatch since the start of the run.
    microbatch_in_batch: index of this microbatch within its batch (0 starts a batch).
    previous: the placement used for the previous microbatch, or None at the start.
    expert_bytes: bytes of one expert's weights (for move budgets).
    """

    expert_load: FloatArray
    num_gpus: int
    gpus_per_node: int
    slots_per_gpu: int
    history: tuple[FloatArray, ...] = ()
    batch_load: FloatArray | None = None
    microbatch_index: int = 0
    microbatch_in_batch: int = 0
    previous: Placement | None = None
    expert_bytes: float = 0.0

    def __post_init__(self) -> None:
        load = self.expert_load
        if not isinstance(load, np.ndarray) or load.ndim != 2 or not np.isfinite(load).all():
            raise FleetsimInputError(
                "expert_load",
                getattr(load, "shape", load),
                "expected a finite (layers, experts) array",
            )
        if (load < 0).any():
            raise FleetsimInputError("expert_load", float(load.min()), "loads must be >= 0")
        for name in ("batch_load", *(("history",) if self.history else ())):
            arrays = self.history if name == "history" else (self.batch_load,)
            for arr in arrays:
                if arr is not None and np.shape(arr) != load.shape:
                    raise FleetsimInputError(
                        name, f"shape {np.shape(arr)}", f"must match expert_load {load.shape}"
                    )
        prev = self.previous
        want = (load.shape[0], self.num_gpus * self.slots_per_gpu)
        if prev is not None and prev.phy2log.shape != want:
            raise FleetsimInputError(
                "previous", f"shape {prev.phy2log.shape}", f"must be (layers, slots) = {want}"
            )

    @property
    def num_layers(self) -> int:
        return int(self.expert_load.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.expert_load.shape[1])

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.gpus_per_node


def check_layout(num_experts: int, num_gpus: int, gpus_per_node: int, slots_per_gpu: int) -> None:
    """Raise ``FleetsimInputError`` unless masters tile the GPUs and slots cover all experts."""
    if num_gpus <= 0:
        raise FleetsimInputError("num_gpus", num_gpus, "must be > 0")
    if gpus_per_node <= 0 or num_gpus % gpus_per_node:
        raise FleetsimInputError(
            "gpus_per_node", gpus_per_node, f"must be > 0 and divide num_gpus={num_gpus}"
        )
    if num_experts % num_gpus:
        raise FleetsimInputError(
            "num_experts",
            num_experts,
            f"must be a multiple of num_gpus={num_gpus} (one master each)",
        )
    if slots_per_gpu < num_experts // num_gpus:
        raise FleetsimInputError(
            "slots_per_gpu",
            slots_per_gpu,
            f"must be >= num_experts / num_gpus = {num_experts // num_gpus}",
        )


def imbalance(gpu_load: FloatArray) -> FloatArray:
    """Per-layer max/mean GPU load; 1.0 for a layer with no tokens."""
    mean = gpu_load.mean(axis=-1)
    peak = gpu_load.max(axis=-1)
    return np.divide(peak, mean, out=np.ones_like(mean), where=mean > 0)


def moved_experts(
    previous: Placement | None, current: Placement, gpus_per_node: int
) -> tuple[IntArray, IntArray]:
    """Expert copies each GPU must receive to go from ``previous`` to ``current``.

    Returns ``(intra, inter)`` counts, each (num_layers, num_gpus): an expert a GPU did not
    hold before is fetched over NVLink if some GPU of its node held it, else over the network.
    Slot order inside a GPU is free (no copy to permute).
    """
    num_layers, num_gpus, spg = current.num_layers, current.num_gpus, current.slots_per_gpu
    if previous is None:
        zeros = np.zeros((num_layers, num_gpus), dtype=np.int64)
        return zeros, zeros.copy()
    new = current.phy2log.reshape(num_layers, num_gpus, spg)
    old = previous.phy2log.reshape(num_layers, num_gpus, previous.slots_per_gpu)
    is_new = ~(new[..., :, None] == old[..., None, :]).any(-1)
    # Count each expert once per GPU even when it fills two slots there.
    first = np.ones_like(is_new)
    for k in range(1, spg):
        first[..., k] = ~(new[..., k, None] == new[..., :k]).any(-1)
    is_new &= first
    num_nodes = num_gpus // gpus_per_node
    node_old = old.reshape(num_layers, num_nodes, -1)
    node_new = new.reshape(num_layers, num_nodes, -1)
    in_node = (node_new[..., :, None] == node_old[..., None, :]).any(-1)
    in_node = in_node.reshape(num_layers, num_gpus, spg)
    intra = (is_new & in_node).sum(-1)
    inter = (is_new & ~in_node).sum(-1)
    return intra, inter
