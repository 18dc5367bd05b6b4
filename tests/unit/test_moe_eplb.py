"""``fleetsim.moe.rebalance_experts`` against a line-by-line transcription of DeepSeek's EPLB.

The reference below follows github.com/deepseek-ai/EPLB ``eplb.py`` (MIT) loop for loop, with
torch replaced by Python lists and numpy float32 scalars (EPLB casts loads to float32 and its
pack weights are float32 0-d tensors), except that its sort is stable: torch's default sort is
not stable beyond 16 items, so this reference fixes the order of ties to index order, as
fleetsim does (``test_moe_eplb_reference.py`` compares against EPLB's own outputs). The
benchmark imports ``ref_rebalance_experts``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import rebalance_experts

f32 = np.float32


def ref_balanced_packing(weight, num_packs):
    num_layers, num_groups = len(weight), len(weight[0])
    groups_per_pack = num_groups // num_packs
    if groups_per_pack == 1:
        return [list(range(num_groups)) for _ in weight], [[0] * num_groups for _ in weight]
    pack_index = [[-1] * num_groups for _ in range(num_layers)]
    rank_in_pack = [[-1] * num_groups for _ in range(num_layers)]
    for i in range(num_layers):
        indices = sorted(range(num_groups), key=lambda g, row=weight[i]: -row[g])
        pack_weights = [0] * num_packs
        pack_items = [0] * num_packs
        for group in indices:
            pack = min(
                (p for p in range(num_packs) if pack_items[p] < groups_per_pack),
                key=pack_weights.__getitem__,
            )
            pack_index[i][group] = pack
            rank_in_pack[i][group] = pack_items[pack]
            pack_weights[pack] += weight[i][group]
            pack_items[pack] += 1
    return pack_index, rank_in_pack


def ref_replicate_experts(weight, num_phy):
    num_rows, num_log = len(weight), len(weight[0])
    phy2log = [list(range(num_phy)) for _ in range(num_rows)]
    rank = [[0] * num_phy for _ in range(num_rows)]
    logcnt = [[1] * num_log for _ in range(num_rows)]
    for r in range(num_rows):
        for i in range(num_log, num_phy):
            ratios = [weight[r][e] / f32(logcnt[r][e]) for e in range(num_log)]
            best = max(ratios)
            hot = ratios.index(best)  # torch.max(dim) returns the first maximal index
            phy2log[r][i] = hot
            rank[r][i] = logcnt[r][hot]
            logcnt[r][hot] += 1
    return phy2log, rank, logcnt


def _inverse(perm_rows):
    inv_rows = []
    for perm in perm_rows:
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        inv_rows.append(inv)
    return inv_rows


def ref_hierarchical(weight, num_phy, num_groups, num_nodes, num_gpus):
    num_layers, num_log = len(weight), len(weight[0])
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_phy // num_gpus
    log_per_node = num_log // num_nodes

    # numpy's float32 sum (same as fleetsim's; exact for integer loads below 2**24)
    tokens_per_group = [
        [
            np.asarray(row[g * group_size : (g + 1) * group_size], dtype=f32).sum(dtype=f32)
            for g in range(num_groups)
        ]
        for row in weight
    ]
    gpack, grank = ref_balanced_packing(tokens_per_group, num_nodes)
    log2mlog = [
        [
            (gpack[li][e // group_size] * groups_per_node + grank[li][e // group_size]) * group_size
            + e % group_size
            for e in range(num_log)
        ]
        for li in range(num_layers)
    ]
    mlog2log = _inverse(log2mlog)

    tokens_per_mlog = []
    for li in range(num_layers):
        gathered = [weight[li][mlog2log[li][m]] for m in range(num_log)]
        tokens_per_mlog.extend(
            gathered[n * log_per_node : (n + 1) * log_per_node] for n in range(num_nodes)
        )
    phy2mlog, phyrank, mlogcnt = ref_replicate_experts(tokens_per_mlog, num_phy // num_nodes)

    tokens_per_phy = [
        [tokens_per_mlog[r][m] / f32(mlogcnt[r][m]) for m in phy2mlog[r]]
        for r in range(len(phy2mlog))
    ]
    pack, rank = ref_balanced_packing(tokens_per_phy, num_gpus // num_nodes)
    phy2pphy = [
        [pack[r][i] * phy_per_gpu + rank[r][i] for i in range(len(pack[r]))]
        for r in range(len(pack))
    ]
    pphy2phy = _inverse(phy2pphy)
    phy2log, phy_rank, logcnt = [], [], []
    for li in range(num_layers):
        row_log, row_rank = [], []
        for n in range(num_nodes):
            r = li * num_nodes + n
            for p in pphy2phy[r]:
                row_log.append(mlog2log[li][phy2mlog[r][p] + n * log_per_node])
                row_rank.append(phyrank[r][p])
        phy2log.append(row_log)
        phy_rank.append(row_rank)
        flat_cnt = [c for n in range(num_nodes) for c in mlogcnt[li * num_nodes + n]]
        logcnt.append([flat_cnt[log2mlog[li][e]] for e in range(num_log)])
    return phy2log, phy_rank, logcnt


def ref_rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus):
    w = [[f32(x) for x in row] for row in np.asarray(weight, dtype=np.float64).tolist()]
    if num_groups % num_nodes == 0:
        phy2log, rank, logcnt = ref_hierarchical(w, num_replicas, num_groups, num_nodes, num_gpus)
    else:
        phy2log, rank, logcnt = ref_hierarchical(w, num_replicas, 1, 1, num_gpus)
    max_count = max(max(row) for row in logcnt)
    log2phy = [[[-1] * max_count for _ in row] for row in logcnt]
    for li, row in enumerate(phy2log):
        for slot, expert in enumerate(row):
            log2phy[li][expert][rank[li][slot]] = slot
    return np.array(phy2log), np.array(log2phy), np.array(logcnt)


README_WEIGHT = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]


def test_readme_example_hierarchical():
    """The output printed in EPLB's README (2 nodes x 4 GPUs, 12 experts, 16 slots)."""
    phy2log, log2phy, logcnt = rebalance_experts(README_WEIGHT, 16, 4, 2, 8)
    assert phy2log.tolist() == [
        [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
        [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
    ]
    assert logcnt[0].tolist() == [1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1]
    # Expert 1 of layer 0 has replicas in slots 13 and 15; single-replica experts pad with -1.
    assert log2phy[0, 1].tolist() == [15, 13]  # replica rank 0 is slot 15
    assert log2phy[0, 0].tolist() == [12, -1]


def test_hand_checked_global_policy():
    """4 experts, 6 slots on 2 GPUs, groups do not divide nodes -> global policy.

    Replicas: expert 0 (load 8) gets 2 (4 each), then expert 1 (6 > 4) gets 2 (3 each).
    Packing 3 per GPU, heaviest first: 4,4 -> GPU0, GPU1; 3 -> GPU0 (tie -> lower index)...
    """
    phy2log, _, logcnt = rebalance_experts([[8, 6, 2, 1]], 6, 3, 2, 2)
    assert logcnt.tolist() == [[2, 2, 1, 1]]
    loads = np.array([8, 6, 2, 1]) / logcnt[0]
    gpu_loads = loads[phy2log[0]].reshape(2, 3).sum(1)
    assert sorted(gpu_loads.tolist()) == [8.0, 9.0]
    ref = ref_rebalance_experts([[8, 6, 2, 1]], 6, 3, 2, 2)
    assert phy2log.tolist() == ref[0].tolist()


@st.composite
def eplb_cases(draw):
    num_nodes = draw(st.integers(1, 3))
    gpus_per_node = draw(st.integers(1, 3))
    num_gpus = num_nodes * gpus_per_node
    hierarchical = draw(st.booleans())
    num_groups = num_nodes * draw(st.integers(1, 3)) if hierarchical else draw(st.integers(1, 4))
    group_size = draw(st.integers(1, 3))
    num_experts = num_groups * group_size
    min_per_gpu = -(-num_experts // num_gpus)
    slots_per_gpu = draw(st.integers(min_per_gpu, min_per_gpu + 2))
    num_layers = draw(st.integers(1, 3))
    # Small integers make many ties, which is where tie-breaking differences would show.
    max_load = draw(st.sampled_from([3, 20, 1000]))
    row = st.lists(st.integers(0, max_load), min_size=num_experts, max_size=num_experts)
    loads = draw(st.lists(row, min_size=num_layers, max_size=num_layers))
    return loads, num_gpus * slots_per_gpu, num_groups, num_nodes, num_gpus


@settings(max_examples=300, deadline=None)
@given(case=eplb_cases())
def test_matches_reference_exactly(case):
    weight, num_replicas, num_groups, num_nodes, num_gpus = case
    got = rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)
    want = ref_rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    num_gpus=st.sampled_from([2, 4]),
    num_spare=st.integers(0, 2),
)
def test_matches_reference_on_float_loads(seed, num_gpus, num_spare):
    """Non-integer float32 loads: sums round, so pack-weight accumulation order must match."""
    weight = np.random.default_rng(seed).gamma(0.5, 100.0, size=(2, 16))
    slots_per_gpu = 16 // num_gpus + num_spare
    got = rebalance_experts(weight, num_gpus * slots_per_gpu, 4, 2, num_gpus)
    want = ref_rebalance_experts(weight, num_gpus * slots_per_gpu, 4, 2, num_gpus)
    for g, w in zip(got, want, strict=True):
        assert g.tolist() == w.tolist()


def test_every_expert_has_a_replica_and_slots_are_consistent():
    weight = np.random.default_rng(0).zipf(1.5, size=(3, 32)).clip(max=10_000)
    phy2log, log2phy, logcnt = rebalance_experts(weight, 48, 8, 2, 8)
    for layer in range(3):
        assert np.bincount(phy2log[layer], minlength=32).tolist() == logcnt[layer].tolist()
        for e in range(32):
            slots = [s for s in log2phy[layer, e] if s >= 0]
            assert len(slots) == logcnt[layer, e] >= 1
            assert all(phy2log[layer, s] == e for s in slots)


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"num_replicas": 18}, "num_replicas"),  # 18 slots on 4 GPUs
        ({"num_replicas": 4}, "num_replicas"),  # fewer slots than experts
        ({"num_groups": 6}, "num_groups"),  # 8 experts in 6 groups (hierarchical: 6 % 2 == 0)
        ({"num_gpus": 3, "num_replicas": 12}, "num_gpus"),  # 3 GPUs on 2 nodes
        ({"num_gpus": 0}, "num_gpus"),
    ],
)
def test_bad_counts_name_the_argument(kwargs, where):
    args = {"num_replicas": 16, "num_groups": 4, "num_nodes": 2, "num_gpus": 4} | kwargs
    with pytest.raises(FleetsimInputError) as err:
        rebalance_experts(np.ones((1, 8)), **args)
    assert err.value.where == where


@pytest.mark.parametrize(
    "weight", [[[1.0, float("nan"), 1.0, 1.0]], [[1.0, -2.0, 1.0, 1.0]], np.ones((2, 2, 4))]
)
def test_bad_loads_name_weight(weight):
    with pytest.raises(FleetsimInputError) as err:
        rebalance_experts(weight, 4, 2, 1, 2)
    assert err.value.where == "weight"


@pytest.mark.parametrize("num_packs", [2, 4])
def test_heap_and_vectorized_packing_agree(num_packs):
    """Few rows go through a per-row heap, many through one numpy step per item: same output."""
    from fleetsim.moe.eplb import MAX_ROWS_FOR_HEAP, balanced_packing

    rng = np.random.default_rng(num_packs)
    weight = np.concatenate(
        [rng.integers(0, 4, size=(4, 32)), rng.gamma(0.5, 10.0, size=(4, 32))]
    ).astype(np.float32)
    assert weight.shape[0] > MAX_ROWS_FOR_HEAP
    together = balanced_packing(weight, num_packs)
    for row in range(weight.shape[0]):
        alone = balanced_packing(weight[row : row + 1], num_packs)
        assert alone[0].tolist() == together[0][row : row + 1].tolist()
        assert alone[1].tolist() == together[1][row : row + 1].tolist()
