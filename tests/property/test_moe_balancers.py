"""Invariants every expert balancer must keep, on random small layouts and loads:
every logical expert has a replica, slot capacity per GPU is exactly respected, each
expert's token shares sum to one (so tokens are conserved), and the quota planners' integer
quotas sum exactly to each expert's load."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.moe import BALANCERS, BalanceView, make_balancer, plan_quotas
from fleetsim.moe.placement import static_phy2log


@st.composite
def layouts(draw):
    gpus_per_node = draw(st.integers(1, 4))
    num_nodes = draw(st.integers(1, 3))
    num_gpus = gpus_per_node * num_nodes
    masters_per_gpu = draw(st.integers(1, 3))
    num_spare = draw(st.integers(0, 2))
    num_experts = num_gpus * masters_per_gpu
    num_layers = draw(st.integers(1, 3))
    num_steps = draw(st.integers(1, 3))
    skew = draw(st.sampled_from([1, 10, 1000]))
    loads = draw(
        st.lists(
            st.lists(
                st.lists(st.integers(0, skew), min_size=num_experts, max_size=num_experts),
                min_size=num_layers,
                max_size=num_layers,
            ),
            min_size=num_steps,
            max_size=num_steps,
        )
    )
    return np.array(loads, dtype=np.float64), num_gpus, gpus_per_node, masters_per_gpu + num_spare


# Every built-in with its defaults, plus the quota planner's stale and re-mastering modes.
VARIANTS = [(name, {}) for name in sorted(BALANCERS)] + [
    ("quota", {"stale_steps": 1}),
    ("quota", {"remaster_every": 1, "max_master_swaps": 2}),
]


@settings(max_examples=120, deadline=None)
@given(case=layouts(), variant=st.sampled_from(VARIANTS))
def test_placements_cover_experts_respect_capacity_and_conserve_tokens(case, variant):
    loads, num_gpus, gpus_per_node, slots_per_gpu = case
    num_layers, num_experts = loads.shape[1:]
    balancer = make_balancer(*variant)
    previous = None
    for t, load in enumerate(loads):
        view = BalanceView(
            expert_load=load,
            num_gpus=num_gpus,
            gpus_per_node=gpus_per_node,
            slots_per_gpu=slots_per_gpu,
            history=tuple(loads[:t]),
            previous=previous,
            batch_load=loads.sum(0),
            microbatch_index=t,
            microbatch_in_batch=t,
        )
        placement = balancer.plan(view)
        assert placement.phy2log.shape == (num_layers, num_gpus * slots_per_gpu)
        assert placement.slots_per_gpu == slots_per_gpu
        counts = placement.replica_counts(num_experts)
        assert (counts >= 1).all()
        share = np.zeros((num_layers, num_experts))
        np.add.at(
            share, (np.arange(num_layers)[:, None], placement.phy2log), placement.share_by_slot
        )
        assert np.allclose(share, 1.0)
        assert (placement.share_by_slot >= 0).all()
        assert np.allclose(placement.gpu_load(load).sum(1), load.sum(1))
        previous = placement


@settings(max_examples=150, deadline=None)
@given(case=layouts(), within_node=st.booleans(), budget=st.sampled_from([None, 0, 1]))
def test_quotas_are_integers_summing_to_each_expert_load(case, within_node, budget):
    loads, num_gpus, gpus_per_node, slots_per_gpu = case
    load = loads[0]
    num_layers, num_experts = load.shape
    initial = static_phy2log(num_layers, num_experts, num_gpus, slots_per_gpu)
    phy2log, quota = plan_quotas(
        load,
        initial,
        num_gpus,
        gpus_per_node=gpus_per_node if within_node else None,
        max_new_per_gpu=budget,
    )
    assert (quota >= 0).all()
    assert (quota == np.floor(quota)).all()
    per_expert = np.zeros_like(load)
    np.add.at(per_expert, (np.arange(num_layers)[:, None], phy2log), quota)
    assert (per_expert == load).all()
    masters = (np.arange(phy2log.shape[1]) % slots_per_gpu) < num_experts // num_gpus
    assert (phy2log[:, masters] == initial[:, masters]).all()
    if budget is not None:
        new = (phy2log != initial).reshape(num_layers, num_gpus, slots_per_gpu).sum(-1)
        assert new.max() <= budget
    if within_node:
        # No token leaves its master's node.
        spg, nodes = slots_per_gpu, np.arange(phy2log.shape[1]) // slots_per_gpu // gpus_per_node
        for layer in range(num_layers):
            master_node = {int(phy2log[layer, s]): nodes[s] for s in np.flatnonzero(masters)}
            for s in np.flatnonzero(quota[layer] > 0):
                assert nodes[s] == master_node[int(phy2log[layer, s])], spg


@settings(max_examples=60, deadline=None)
@given(case=layouts())
def test_quota_never_worse_than_no_balancing(case):
    loads, num_gpus, gpus_per_node, slots_per_gpu = case
    load = loads[0]
    num_layers, num_experts = load.shape
    initial = static_phy2log(num_layers, num_experts, num_gpus, slots_per_gpu)
    _, quota = plan_quotas(load, initial, num_gpus)
    before = load.reshape(num_layers, num_gpus, -1).sum(-1).max(1)
    after = quota.reshape(num_layers, num_gpus, slots_per_gpu).sum(-1).max(1)
    assert (after <= before + 1).all()  # +1: integer rounding of quotas
