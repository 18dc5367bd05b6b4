"""Cluster invariants over random pools, routers and loads: everyone finishes, all KV comes
back, fast-forward equals stepping one at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_cluster import pools, random_workload, sim

from fleetsim.policies import PolicySpec
from fleetsim.policies.routing import ROUTERS, make_router


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 60),
       rate=st.sampled_from([5.0, 50.0, 500.0]), router=st.sampled_from(sorted(ROUTERS)),
       shape=st.sampled_from(["mixed", "pd"]), replicas=st.integers(1, 3),
       blocks=st.sampled_from([60, 200, 2000]), bw=st.sampled_from([1e6, 1e9, 1e30]))
def test_cluster_runs_are_complete_conserving_and_exact(seed, n, rate, router, shape,
                                                        replicas, blocks, bw):
    w = random_workload(n, seed=seed, rate=rate, hash_ids=True)
    setup = (pools(mixed=replicas, blocks=blocks) if shape == "mixed"
             else pools(prefill=replicas, decode=replicas, blocks=blocks, bw=bw))
    # Every registered router, with its default args.
    fast, cluster = sim(w, setup, make_router(PolicySpec(name=router)), max_running=8)
    slow, _ = sim(w, setup, make_router(PolicySpec(name=router)), max_running=8,
                  fast_forward=False)
    assert len(fast.requests["request_id"]) == n
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
        assert replica.load_tokens == 0
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
