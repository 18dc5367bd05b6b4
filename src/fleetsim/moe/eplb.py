"""DeepSeek's EPLB (github.com/deepseek-ai/EPLB, MIT) in numpy, vectorized over layers.

Same inputs, outputs and greedy as the reference ``rebalance_experts``: loads are cast to
float32 as EPLB does, ties go to the lowest pack / expert index, and physical slot ``j`` lives
on GPU ``j // (num_replicas // num_gpus)``. Equivalent to EPLB (same replica counts and the
same replica loads on every GPU) and exact where the order of ties is defined: EPLB sorts
with torch's default ``sort(descending=True)``, which is not stable for rows longer than 16
items, so which of several equal items goes where is torch's choice there; here the sort is
stable (``tests/unit/test_moe_eplb_reference.py`` checks both against EPLB's own outputs).
The reference packs one row at a time in a Python loop; here the greedy steps run once per
item over all rows at once (rows are layers, or layers x nodes), which is what makes it fast.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError

IntArray = NDArray[np.int64]


def check_expert_load(weight: object, where: str = "weight") -> NDArray[np.float64]:
    """``weight`` as a float64 (num_layers, num_experts) array; reject NaN, inf and negatives."""
    arr = np.asarray(weight, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise FleetsimInputError(
            where, f"shape {arr.shape}", "expected a (num_layers, num_experts) array of loads"
        )
    if not np.isfinite(arr).all():
        raise FleetsimInputError(where, "NaN or inf entries", "loads must be finite token counts")
    if (arr < 0).any():
        raise FleetsimInputError(where, float(arr.min()), "loads must be >= 0")
    return arr


# Below this many rows a heap per row in plain Python beats one numpy step per item over all
# rows (about 13 us per item at any row count against about 1.5 us per item and row).
MAX_ROWS_FOR_HEAP = 4


def balanced_packing(weight: NDArray[np.float32], num_packs: int) -> tuple[IntArray, IntArray]:
    """Greedy packing of ``n`` items per row into ``num_packs`` packs of ``n / num_packs`` items.

    Heaviest item first, into the lightest pack that still has room (lowest index on ties).
    Returns ``(pack_index, rank_in_pack)``, both shaped like ``weight``.
    """
    num_rows, num_items = weight.shape
    items_per_pack = num_items // num_packs
    if items_per_pack == 1:
        pack_index = np.broadcast_to(np.arange(num_items), weight.shape).copy()
        return pack_index, np.zeros(weight.shape, dtype=np.int64)
    # EPLB sorts float32 weights descending with torch's sort, whose order of equal items is
    # unspecified beyond 16 items; a stable sort of the negation fixes it to index order.
    order = np.argsort(-weight, axis=1, kind="stable")
    if num_rows <= MAX_ROWS_FOR_HEAP:
        return _heap_packing(weight, order, num_packs, items_per_pack)
    rows = np.arange(num_rows)
    pack_weight = np.zeros((num_rows, num_packs), dtype=np.float32)
    pack_items = np.zeros((num_rows, num_packs), dtype=np.int64)
    pack_index = np.empty(weight.shape, dtype=np.int64)
    rank_in_pack = np.empty(weight.shape, dtype=np.int64)
    full = np.float32(np.inf)
    for k in range(num_items):
        item = order[:, k]
        pack = np.where(pack_items < items_per_pack, pack_weight, full).argmin(axis=1)
        pack_index[rows, item] = pack
        rank_in_pack[rows, item] = pack_items[rows, pack]
        pack_weight[rows, pack] += weight[rows, item]  # float32 sums, as in EPLB
        pack_items[rows, pack] += 1
    return pack_index, rank_in_pack


def _heap_packing(
    weight: NDArray[np.float32], order: IntArray, num_packs: int, items_per_pack: int
) -> tuple[IntArray, IntArray]:
    """``balanced_packing`` one row at a time: a heap of (pack weight, pack) of the packs with
    room pops the lightest, lowest index on ties, as the masked argmin does."""
    pack_index = np.empty(weight.shape, dtype=np.int64)
    rank_in_pack = np.empty(weight.shape, dtype=np.int64)
    for row in range(weight.shape[0]):
        values = weight[row].tolist()
        heap = [(0.0, pack) for pack in range(num_packs)]
        count = [0] * num_packs
        index, rank = pack_index[row], rank_in_pack[row]
        for item in order[row].tolist():
            total, pack = heapq.heappop(heap)
            index[item] = pack
            rank[item] = count[pack]
            count[pack] += 1
            if count[pack] < items_per_pack:
                # The float64 sum of two float32 values rounded once to float32 is their
                # float32 sum, so pack weights match EPLB's float32 accumulation exactly.
                heapq.heappush(heap, (float(np.float32(total + values[item])), pack))
    return pack_index, rank_in_pack


def replicate_experts(
    weight: NDArray[np.float32], num_phy: int
) -> tuple[IntArray, IntArray, IntArray]:
    """Add ``num_phy - num_log`` replicas, each to the expert with the largest load per replica.

    Returns ``(phy2log, rank, logcnt)``: the logical expert of each physical slot, the replica
    index of that slot among its expert's replicas, and the replica count per expert.
    """
    num_rows, num_log = weight.shape
    rows = np.arange(num_rows)
    phy2log = np.broadcast_to(np.arange(num_phy), (num_rows, num_phy)).copy()
    rank = np.zeros((num_rows, num_phy), dtype=np.int64)
    logcnt = np.ones((num_rows, num_log), dtype=np.int64)
    # Only the chosen expert's load per replica changes each step, so update it in place
    # (same float32 quotient as EPLB's full recomputation of weight / logcnt).
    per_replica = weight.copy()
    for i in range(num_log, num_phy):
        hot = per_replica.argmax(axis=1)
        phy2log[:, i] = hot
        rank[:, i] = logcnt[rows, hot]
        logcnt[rows, hot] += 1
        per_replica[rows, hot] = weight[rows, hot] / logcnt[rows, hot].astype(np.float32)
    return phy2log, rank, logcnt


def _inverse(perm: IntArray) -> IntArray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _rebalance_hierarchical(
    weight: NDArray[np.float32], num_phy: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[IntArray, IntArray, IntArray]:
    num_layers, num_log = weight.shape
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_phy // num_gpus
    log_per_node = num_log // num_nodes

    # 1. Pack expert groups onto nodes (balances inter-node traffic).
    tokens_per_group = weight.reshape(num_layers, num_groups, group_size).sum(-1, dtype=np.float32)
    group_pack, group_rank = balanced_packing(tokens_per_group, num_nodes)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size)[:, :, None]
        + np.arange(group_size)
    ).reshape(num_layers, num_log)
    mlog2log = _inverse(log2mlog)

    # 2. Replicate inside each node: rows are (layer, node).
    tokens_per_mlog = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, log_per_node)
    phy2mlog, phyrank, mlogcnt = replicate_experts(tokens_per_mlog, num_phy // num_nodes)

    # 3. Pack each node's physical experts onto its GPUs.
    tokens_per_phy = np.take_along_axis(
        tokens_per_mlog / mlogcnt.astype(np.float32), phy2mlog, axis=1
    )
    # (numpy's stubs type this float32 quotient as complex: mypyc's type check fails on it)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy,  # type: ignore[arg-type]
                                                num_gpus // num_nodes)
    pphy2phy = _inverse(pack_index * phy_per_gpu + rank_in_pack)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1)
    node_offset = np.arange(0, num_log, log_per_node)[None, :, None]
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1) + node_offset).reshape(num_layers, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, axis=1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, axis=1)
    return pphy2log, pphyrank, logcnt


def check_eplb_shape(
    num_experts: int, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> None:
    """Raise ``FleetsimInputError`` unless the counts form a valid EPLB layout."""
    for name, value in (
        ("num_replicas", num_replicas),
        ("num_groups", num_groups),
        ("num_nodes", num_nodes),
        ("num_gpus", num_gpus),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
            raise FleetsimInputError(name, value, "must be a positive integer")
    if num_replicas % num_gpus:
        raise FleetsimInputError(
            "num_replicas",
            num_replicas,
            f"must be a multiple of num_gpus={num_gpus} "
            f"(e.g. {math.ceil(num_replicas / num_gpus) * num_gpus})",
        )
    if num_replicas < num_experts:
        raise FleetsimInputError(
            "num_replicas", num_replicas, f"must be >= the number of experts ({num_experts})"
        )
    if num_groups % num_nodes == 0 and num_experts % num_groups:
        raise FleetsimInputError(
            "num_groups", num_groups, f"must divide the number of experts ({num_experts})"
        )
    if num_groups % num_nodes == 0 and num_gpus % num_nodes:
        # Only the hierarchical policy uses nodes; the global one ignores num_nodes (as EPLB does).
        raise FleetsimInputError(
            "num_gpus", num_gpus, f"must be a multiple of num_nodes={num_nodes}"
        )


def rebalance_experts(
    weight: object, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[IntArray, IntArray, IntArray]:
    """EPLB's entry point: replicate and place experts to balance ``weight``.

    weight: (num_layers, num_experts) load per logical expert (tokens; any non-negative scale).
    num_replicas: physical expert slots in total, a multiple of ``num_gpus``.
    num_groups: expert groups (DeepSeek-V3's group-limited routing); the hierarchical policy
        (groups packed onto nodes, replicas inside a node) runs when ``num_nodes`` divides it,
        otherwise the global policy (one group, one node).

    Returns ``(phy2log, log2phy, logcnt)``: (layers, num_replicas) logical expert per slot;
    (layers, num_experts, max replicas) slot ids per expert padded with -1 (EPLB's format);
    (layers, num_experts) replica counts. Slot ``j`` is on GPU ``j // (num_replicas // num_gpus)``.
    """
    arr = check_expert_load(weight)
    num_layers, num_experts = arr.shape
    check_eplb_shape(num_experts, num_replicas, num_groups, num_nodes, num_gpus)
    w32 = arr.astype(np.float32)
    if num_groups % num_nodes == 0:
        phy2log, phyrank, logcnt = _rebalance_hierarchical(
            w32, num_replicas, num_groups, num_nodes, num_gpus
        )
    else:
        phy2log, phyrank, logcnt = _rebalance_hierarchical(w32, num_replicas, 1, 1, num_gpus)
    max_count = int(logcnt.max())
    log2phy = np.full((num_layers, num_experts * max_count), -1, dtype=np.int64)
    np.put_along_axis(
        log2phy,
        phy2log * max_count + phyrank,
        np.broadcast_to(np.arange(num_replicas), (num_layers, num_replicas)),
        axis=1,
    )
    return phy2log, log2phy.reshape(num_layers, num_experts, max_count), logcnt
