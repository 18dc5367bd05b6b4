"""TokenLake's pool over random clusters, loads and pool settings: everyone finishes, every
borrowed block is given back, all KV comes back, and fast-forward equals stepping (pool
members must hear of each other's changes at once)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_cluster import pools, random_workload, sim

from fleetsim.policies.tokenlake import TokenLake


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 80),
       rate=st.sampled_from([5.0, 50.0, 500.0]), shape=st.sampled_from(["mixed", "pd"]),
       replicas=st.integers(1, 4), blocks=st.sampled_from([60, 200, 2000]),
       bw=st.sampled_from([1e6, 1e9, 1e30]), min_uses=st.integers(1, 5),
       max_replicas=st.integers(1, 3), query=st.sampled_from([None, 500.0, 5000.0]))
def test_pool_runs_are_complete_conserving_and_exact(seed, n, rate, shape, replicas, blocks,
                                                     bw, min_uses, max_replicas, query):
    w = random_workload(n, seed=seed, rate=rate, hash_ids=True)
    setup = (pools(mixed=replicas, blocks=blocks, bw=bw) if shape == "mixed"
             else pools(prefill=replicas, decode=replicas, blocks=blocks, bw=bw))

    def pool() -> TokenLake:
        return TokenLake(heavy_hitter_min_uses=min_uses, max_replicas=max_replicas,
                         query_bytes_per_token=query)

    fast, cluster = sim(w, setup, pool(), max_running=8)
    slow, _ = sim(w, setup, pool(), max_running=8, fast_forward=False)
    assert len(fast.requests["request_id"]) == n
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
        assert replica.load_tokens == 0
        assert not replica.kv.prefix.borrowed and not replica.kv.prefix.lent
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
