"""The prefix cache as a component: eviction order by policy, and a run under each
registered policy keeps the KV invariants."""

from __future__ import annotations

import pytest

from fleetsim.config import config_from_dict
from fleetsim.policies import EVICTION_POLICIES, make_eviction
from fleetsim.run import run
from fleetsim.serving.prefix_cache import PrefixCache


def _cache(policy):
    cache = PrefixCache(make_eviction(policy))
    for h, depth in ((1, 0), (2, 1), (3, 0)):
        assert cache.add(h, depth)
    cache.pin((1,))  # a later request reuses block 1: its hit count is 1
    cache.unref((1, 2), 2)  # the first request lets go, tail first: 2 then 1
    cache.unref((1,), 1)  # the second one too
    cache.unref((3,), 1)
    return cache


def _eviction_order(cache):
    order = []
    while cache.num_evictable:
        before = set(cache.entries)
        cache.evict_one()
        order.extend(before - set(cache.entries))
    return order


@pytest.mark.parametrize(("policy", "order"), [
    ("lru", [2, 1, 3]),            # release order
    ("lfu", [2, 3, 1]),            # never-reused first (by release order), then block 1
    ("deepest_first", [2, 1, 3]),  # depth 1 first, then the heads by release order
])
def test_eviction_order_follows_the_policy(policy, order):
    assert _eviction_order(_cache(policy)) == order


@pytest.mark.parametrize("policy", sorted(EVICTION_POLICIES))
def test_every_eviction_policy_keeps_the_kv_invariants(policy):
    """A prefix-heavy trace on a small cache, debug checks after every step."""
    cfg = {"policy": {"eviction": policy}, "engine": {"num_kv_blocks": 6000, "debug": True},
           "workload": {"trace": "embedded:mooncake_conversation_10min",
                        "max_requests": 80}}
    s = run(config_from_dict(cfg)).summary
    assert s["num_finished"] == 80
    assert 0 < s["kv_cache"]["prefix_hit_rate"] < 1
    assert s["kv_cache"]["num_prefix_evictions"] > 0


def test_an_unknown_eviction_policy_is_one_line_and_exit_2(capsys, tmp_path):
    from fleetsim.cli import main

    assert main(["run", "--out", str(tmp_path / "o"), "--set", "policy.eviction=mru"]) == 2
    err = capsys.readouterr().err.strip()
    assert "policy.eviction" in err and "lfu" in err and len(err.splitlines()) == 1
