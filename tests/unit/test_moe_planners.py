"""Hand-sized cases for the balancer registry, the quota planner and the two-timescale planner."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import (
    BALANCERS,
    BalanceView,
    QuotaPlanner,
    TwoTimescalePlanner,
    imbalance,
    make_balancer,
    moved_experts,
    plan_quotas,
)
from fleetsim.moe.placement import even_split, packed_phy2log, static_phy2log
from fleetsim.moe.quota import swap_masters, ultraep_planner
from fleetsim.moe.two_timescale import reorder_across_nodes


def view(load, num_gpus=4, gpus_per_node=2, slots_per_gpu=3, **kw):
    return BalanceView(
        expert_load=np.asarray(load, dtype=np.float64),
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        slots_per_gpu=slots_per_gpu,
        **kw,
    )


def test_registry_has_the_built_ins():
    assert {"none", "eplb", "eplb_stale", "quota", "two_timescale"} <= set(BALANCERS)


def test_make_balancer_by_dotted_name_and_bad_names():
    assert isinstance(make_balancer("fleetsim.moe.quota:QuotaPlanner"), QuotaPlanner)
    with pytest.raises(FleetsimInputError) as err:
        make_balancer("nope")
    assert err.value.where == "balancer"
    with pytest.raises(FleetsimInputError) as err:
        make_balancer("quota", {"bogus": 1})
    assert "quota" in err.value.where


def test_quota_hand_checked():
    """4 GPUs x (2 masters + 1 spare). Expert 0 carries 10 of 16 tokens; mean GPU load is 4.

    GPU 0 starts at 11 (10 + 1). It copies expert 0 into three spare slots and ends at the
    mean; every GPU then computes exactly 4 tokens.
    """
    load = np.array([[10, 1, 1, 1, 1, 1, 1, 0]], dtype=np.float64)
    phy2log, quota = plan_quotas(load, static_phy2log(1, 8, 4, 3), 4, tolerance=0.0)
    assert quota.reshape(4, 3).sum(1).tolist() == [4, 4, 4, 4]
    assert ((phy2log[0] == 0) & (quota[0] > 0)).sum() == 4  # master + 3 replicas
    for expert in range(8):
        assert quota[0][phy2log[0] == expert].sum() == load[0, expert]


def test_quota_keeps_masters_and_respects_the_move_budget():
    rng = np.random.default_rng(3)
    load = rng.integers(0, 100, size=(3, 16)).astype(float)
    load[:, 5] = 900
    initial = static_phy2log(3, 16, 8, 4)
    phy2log, quota = plan_quotas(load, initial, 8, max_new_per_gpu=1)
    masters = (np.arange(32) % 4) < 2
    assert (phy2log[:, masters] == initial[:, masters]).all()
    changed = (phy2log != initial).reshape(3, 8, 4).sum(-1)
    assert changed.max() <= 1
    assert (quota >= 0).all()


def test_quota_budget_zero_only_reuses_existing_replicas():
    load = np.array([[50, 1, 1, 1, 1, 1, 1, 1]], dtype=float)
    initial = static_phy2log(1, 8, 4, 3)
    phy2log, _ = plan_quotas(load, initial, 4, max_new_per_gpu=0)
    assert (phy2log == initial).all()


def test_quota_planner_reuses_previous_replicas_for_free():
    load = np.array([[40, 1, 1, 1, 1, 1, 1, 1]], dtype=float)
    planner = QuotaPlanner()
    first = planner.plan(view(load))
    second = planner.plan(view(load, previous=first))
    intra, inter = moved_experts(first, second, gpus_per_node=2)
    assert intra.sum() + inter.sum() == 0
    assert imbalance(second.gpu_load(load))[0] <= 1.05


def test_ultraep_keeps_megatrons_masters_where_quota_packs_them():
    """UltraEP's deployment (``ultraep_planner``): masters stay at Megatron's static layout
    (expert e on GPU e // 2 here) while ``QuotaPlanner`` packs them to the first load; both
    then cut the hot expert's load into replicas down to the mean."""
    load = np.array([[40, 30, 1, 1, 1, 1, 1, 1]], dtype=float)
    masters = (np.arange(12) % 3) < 2
    static = static_phy2log(1, 8, 4, 3)
    ultra = ultraep_planner(within_node=False)(view(load))
    assert (ultra.phy2log[:, masters] == static[:, masters]).all()
    packed = QuotaPlanner().plan(view(load))
    assert not (packed.phy2log[:, masters] == static[:, masters]).all()
    assert imbalance(ultra.gpu_load(load))[0] <= 1.01
    again = ultraep_planner(within_node=False)(view(load, previous=ultra))
    assert (again.phy2log[:, masters] == static[:, masters]).all()  # masters never move


def test_ultraep_within_a_node_copies_no_expert_across_nodes():
    """An NVLink domain smaller than the EP group: a hot expert's replicas stay on its node,
    so each node computes exactly the load of the masters it holds."""
    load = np.array([[40, 30, 1, 1, 1, 1, 1, 1]], dtype=float)
    placement = ultraep_planner(within_node=True)(view(load))
    per_gpu = placement.gpu_load(load)[0]
    assert per_gpu[:2].sum() == pytest.approx(load[0, :4].sum())
    assert per_gpu[2:].sum() == pytest.approx(load[0, 4:].sum())
    free = ultraep_planner(within_node=False)(view(load))
    assert free.gpu_load(load)[0][:2].sum() < load[0, :4].sum()


def test_two_timescale_never_replicates_across_nodes():
    """Within a batch, each node's total load equals the load of the masters it holds."""
    rng = np.random.default_rng(0)
    load = rng.integers(0, 50, size=(2, 16)).astype(float)
    load[:, 3] = 400
    planner = TwoTimescalePlanner()
    first = planner.plan(view(load, num_gpus=8, gpus_per_node=4, slots_per_gpu=3))
    v = view(
        load * 1.5,
        num_gpus=8,
        gpus_per_node=4,
        slots_per_gpu=3,
        previous=first,
        microbatch_in_batch=1,
    )
    placement = planner.plan(v)
    masters = (np.arange(24) % 3) < 2
    node_of_slot = np.arange(24) // 3 // 4
    gpu_load = placement.gpu_load(v.expert_load).reshape(2, 2, 4).sum(-1)
    for layer in range(2):
        ids = placement.phy2log[layer]
        node_master_load = [
            v.expert_load[layer, ids[masters & (node_of_slot == n)]].sum() for n in range(2)
        ]
        assert np.allclose(gpu_load[layer], node_master_load)
        # masters did not move inside a batch
        assert (placement.phy2log[layer][masters] == first.phy2log[layer][masters]).all()


def test_reorder_across_nodes_swaps_toward_balance():
    load = np.array([[9.0, 8.0, 1.0, 0.0]])
    node = np.array([[0, 0, 1, 1]])
    new = reorder_across_nodes(load, node, 2, max_swaps=1)
    totals = [load[0][new[0] == n].sum() for n in range(2)]
    assert sorted(totals) == [9.0, 9.0]
    assert np.bincount(new[0]).tolist() == [2, 2]
    assert (reorder_across_nodes(load, node, 2, max_swaps=0) == node).all()


def test_eplb_stale_uses_history_not_the_current_load():
    hot_then = np.array([[100, 1, 1, 1, 1, 1, 1, 1]], dtype=float)
    hot_now = np.array([[1, 1, 1, 1, 1, 1, 1, 100]], dtype=float)
    stale = make_balancer("eplb_stale").plan(view(hot_now, history=(hot_then,)))
    fresh = make_balancer("eplb").plan(view(hot_now, history=(hot_then,)))
    assert imbalance(fresh.gpu_load(hot_now))[0] < imbalance(stale.gpu_load(hot_now))[0]
    assert np.bincount(stale.phy2log[0], minlength=8)[0] > 1


def test_eplb_stale_every_keeps_the_placement_between_replans():
    load = np.array([[5, 1, 1, 1, 1, 1, 1, 9]], dtype=float)
    balancer = make_balancer("eplb_stale", {"every": 4})
    first = balancer.plan(view(load, history=(load,), microbatch_index=4))
    again = balancer.plan(view(load * 2, history=(load * 2,), previous=first, microbatch_index=5))
    assert again is first


def test_even_split_and_packed_masters():
    phy2log = np.array([[0, 1, 0, 2]])
    placement = even_split(phy2log, 3, 2)
    assert placement.share_by_slot.tolist() == [[0.5, 1.0, 0.5, 1.0]]
    packed = packed_phy2log(np.array([[8.0, 7.0, 1.0, 1.0]]), 2, 3)
    gpu_sets = [set(packed[0, g * 3 : g * 3 + 2].tolist()) for g in range(2)]
    # LPT: 8 -> GPU 0, 7 -> GPU 1, then each 1 to the lighter GPU with room.
    assert {frozenset(s) for s in gpu_sets} == {frozenset({0, 3}), frozenset({1, 2})}


def test_moved_experts_counts_per_gpu_and_link():
    old = even_split(np.array([[0, 1, 2, 3]]), 4, 1)
    new = even_split(np.array([[1, 0, 3, 2]]), 4, 1)
    intra, inter = moved_experts(old, new, gpus_per_node=2)
    assert intra.tolist() == [[1, 1, 1, 1]]
    assert inter.tolist() == [[0, 0, 0, 0]]
    intra, inter = moved_experts(old, new, gpus_per_node=1)
    assert inter.tolist() == [[1, 1, 1, 1]]


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"num_gpus": 3, "gpus_per_node": 1}, "num_experts"),  # 8 experts on 3 GPUs
        ({"gpus_per_node": 3}, "gpus_per_node"),
        ({"slots_per_gpu": 1}, "slots_per_gpu"),
    ],
)
def test_quota_rejects_bad_layouts(kwargs, where):
    with pytest.raises(FleetsimInputError) as err:
        QuotaPlanner().plan(view(np.ones((1, 8)), **kwargs))
    assert err.value.where == where


def test_planner_args_are_validated():
    with pytest.raises(FleetsimInputError):
        QuotaPlanner(tolerance=2.0)
    with pytest.raises(FleetsimInputError):
        make_balancer("eplb_stale", {"window": 0})


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"load": np.ones(8)}, "expert_load"),
        ({"load": -np.ones((1, 8))}, "expert_load"),
        ({"load": np.full((1, 8), np.nan)}, "expert_load"),
        ({"history": (np.ones((2, 8)),)}, "history"),
        ({"batch_load": np.ones((1, 4))}, "batch_load"),
    ],
)
def test_view_rejects_bad_loads_and_shape_mismatches(kwargs, where):
    load = kwargs.pop("load", np.ones((1, 8)))
    with pytest.raises(FleetsimInputError) as err:
        BalanceView(expert_load=load, num_gpus=4, gpus_per_node=2, slots_per_gpu=3, **kwargs)
    assert err.value.where == where


def test_view_rejects_a_previous_placement_of_another_layout():
    first = make_balancer("none").plan(view(np.ones((1, 8))))
    with pytest.raises(FleetsimInputError) as err:
        view(np.ones((1, 8)), slots_per_gpu=4, previous=first)
    assert err.value.where == "previous"


def test_byte_budget_needs_the_expert_size():
    planner = QuotaPlanner(max_moved_bytes_per_gpu=1e9)
    with pytest.raises(FleetsimInputError) as err:
        planner.plan(view(np.ones((1, 8))))
    assert err.value.where == "expert_bytes"
    placement = planner.plan(view(np.ones((1, 8)), expert_bytes=2e9))  # budget: 0 copies
    assert placement.phy2log.shape == (1, 12)


def test_quota_stale_plans_from_the_previous_load_not_the_current_one():
    """Same placement as the exact planner given last step's load; worse on a shifted load."""
    then = np.array([[40, 1, 1, 1, 1, 1, 1, 2]], dtype=float)
    now = np.array([[1, 1, 1, 1, 1, 1, 1, 40]], dtype=float)
    stale = QuotaPlanner(stale_steps=1, tolerance=0.0).plan(view(now, history=(then,)))
    exact_on_then = QuotaPlanner(tolerance=0.0).plan(view(then, history=(then,)))
    assert (stale.phy2log == exact_on_then.phy2log).all()
    assert np.allclose(stale.share_by_slot, exact_on_then.share_by_slot)
    exact = QuotaPlanner(tolerance=0.0).plan(view(now, history=(then,)))
    assert imbalance(exact.gpu_load(now))[0] < imbalance(stale.gpu_load(now))[0]
    assert QuotaPlanner(stale_steps=1).history_window == 1
    assert QuotaPlanner(stale_steps=1).prefetchable == "yes"
    assert QuotaPlanner().prefetchable == "no"


def test_swap_masters_moves_master_load_from_the_hottest_to_the_coldest_gpu():
    # 4 GPUs x (2 masters + 1 spare); GPU 0 holds the two hot experts 0 and 1.
    initial = static_phy2log(1, 8, 4, 3)
    load = np.array([[10, 9, 1, 1, 1, 1, 1, 0]], dtype=float)
    swapped = swap_masters(initial, load, 4, max_swaps=1)
    masters = (np.arange(12) % 3) < 2
    assert sorted(swapped[0, masters].tolist()) == list(range(8))  # still one master each
    assert (swapped[0, ~masters] == initial[0, ~masters]).all()  # spare slots untouched
    master_load = load[0][np.where(masters, swapped[0], 0)] * masters
    before = load[0][initial[0]] * masters
    assert master_load.reshape(4, 3).sum(1).max() < before.reshape(4, 3).sum(1).max()
    assert (swap_masters(initial, load, 4, max_swaps=0) == initial).all()


def test_quota_remaster_only_on_its_timescale_and_then_within_the_swap_limit():
    initial = static_phy2log(1, 8, 4, 3)
    first = even_split(initial, 8, 3)
    load = np.array([[10, 9, 1, 1, 1, 1, 1, 0]], dtype=float)
    planner = QuotaPlanner(remaster_every=4, max_master_swaps=1)
    masters = (np.arange(12) % 3) < 2
    off = planner.plan(view(load, history=(load,), previous=first, microbatch_index=3))
    assert (off.phy2log[0, masters] == initial[0, masters]).all()
    on = planner.plan(view(load, history=(load,), previous=first, microbatch_index=4))
    moved = (on.phy2log[0, masters] != initial[0, masters]).sum()
    assert moved == 2  # one swap: two masters change GPU
    assert planner.prefetchable == "no (master swaps: yes)"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stale_steps": -1},
        {"remaster_every": 0},
        {"remaster_window": 0},
        {"max_master_swaps": -1},
    ],
)
def test_quota_rejects_bad_timescales(kwargs):
    with pytest.raises(FleetsimInputError):
        QuotaPlanner(**kwargs)
