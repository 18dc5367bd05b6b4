"""TokenLake's segment pool (``policies/tokenlake.py``) and the cache-aware router it is
compared with (``policies/cache_aware.py``), on hand-sized clusters with exact expectations."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from tests.conftest import by_id, make_workload
from tests.unit.test_cluster import pools, sim

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.policies.cache_aware import CacheAware
from fleetsim.policies.routing import LeastLoaded
from fleetsim.policies.tokenlake import TokenLake
from fleetsim.repro.tokenlake import config
from fleetsim.run import run
from fleetsim.serving.request import Request

SEG = 64  # tokens per segment (the workload's hash block)
KV_BYTES_PER_TOKEN = 1000.0
LINK_BW, LATENCY_S = 1e6, 0.01  # bytes/s per replica link, seconds per transfer


def shared_prefix_workload(with_followup: bool = False):
    """A computes segments 1-4 on replica 0; C then keeps replica 0 busy, so B, which shares
    segments 1-3 with A, goes to idle replica 1 (and D, if asked for, after it)."""
    arrivals = [0.0, 5.0, 5.001] + ([8.0] if with_followup else [])
    prompts = [256, 500, 250] + ([250] if with_followup else [])
    outputs = [2, 400, 2] + ([2] if with_followup else [])
    hashes = [[1, 2, 3, 4], list(range(100, 108)), [1, 2, 3, 9]] + (
        [[1, 2, 3, 10]] if with_followup else [])
    return make_workload(np.array(arrivals), np.array(prompts), np.array(outputs),
                         hash_ids=hashes, hash_block_tokens=SEG)


def simulate(router, workload):
    return sim(workload, pools(mixed=2, bw=LINK_BW), router,
               kv_bytes_per_token=KV_BYTES_PER_TOKEN, latency_s=LATENCY_S)


def test_a_request_hits_segments_another_replica_holds_and_pays_the_transfer():
    pool = TokenLake()
    rec, cluster = simulate(pool, shared_prefix_workload())
    replica, hits = by_id(rec, "replica_id"), by_id(rec, "num_prefix_hit_tokens")
    assert (replica[0], replica[1], replica[2]) == (0, 0, 1)
    assert hits[2] == 3 * SEG  # segments 1-3 from replica 0's cache; 9 is new
    num_bytes = 3 * SEG * KV_BYTES_PER_TOKEN
    assert pool.counts["num_fetched_segments"] == 3
    assert pool.counts["fetched_bytes"] == num_bytes
    assert cluster.transfers.num_bytes_by_client["pool_fetch"] == num_bytes
    wait_s = by_id(rec, "first_scheduled_s")[2] - by_id(rec, "arrival_s")[2]
    assert wait_s == pytest.approx(LATENCY_S + num_bytes / LINK_BW)
    assert pool.report()["mean_fetch_wait_s"] == pytest.approx(wait_s)
    # Per-replica caches under the same load-only routing: B misses.
    rec, _ = simulate(LeastLoaded(), shared_prefix_workload())
    assert by_id(rec, "replica_id")[2] == 1 and by_id(rec, "num_prefix_hit_tokens")[2] == 0


def test_pool_hit_counts_segments_held_by_any_replica():
    pool = TokenLake()
    simulate(pool, shared_prefix_workload())
    # After the run replica 0 holds 1-4 (A) and replica 1 holds 1-3 and 9's full blocks.
    req = Request(id=99, arrival_s=0.0, num_prompt_tokens=400, max_output_tokens=1,
                  hash_ids=(1, 2, 3, 4, 5, 6, 7))
    assert pool.pool_hit(req) == 4
    assert [r.replica_id for r in pool.holders(4)] == [0]
    assert [r.replica_id for r in pool.holders(1)] == [0, 1]


def test_a_duplicate_cold_segment_is_evicted_first():
    pool = TokenLake()
    rec, _ = simulate(pool, shared_prefix_workload(with_followup=True))
    d = by_id(rec, "replica_id")[3]
    assert by_id(rec, "num_prefix_hit_tokens")[3] == 3 * SEG
    other = pool._replicas[1 - d].kv.prefix.evictable
    assert set(list(other)[:3]) == {1, 2, 3}  # first in line for eviction there
    assert pool.counts["num_dedup"] == 3 and pool.counts["num_heavy_hitter_copies"] == 0


def test_a_heavy_hitter_keeps_a_second_copy():
    pool = TokenLake(heavy_hitter_min_uses=1, max_replicas=2)
    simulate(pool, shared_prefix_workload(with_followup=True))
    assert pool.counts["num_dedup"] == 0 and pool.counts["num_heavy_hitter_copies"] == 3
    for h in (1, 2, 3):
        assert len(pool.holders(h)) == 2


def test_heavy_hitters_are_counted_in_a_window():
    pool = TokenLake(heavy_hitter_min_uses=2, heavy_hitter_window_s=10.0)
    pool._note_use(7, 0.0)
    assert not pool.is_heavy_hitter(7, 1.0)
    pool._note_use(7, 1.0)
    assert pool.is_heavy_hitter(7, 1.0)
    assert not pool.is_heavy_hitter(7, 11.0)  # the window has passed
    pool._note_use(7, 12.0)  # a new window starts
    assert not pool.is_heavy_hitter(7, 12.0)


def test_a_segment_that_does_not_fit_is_not_fetched():
    """Replica 1 is nearly full with a long request when B's segments land: what does not fit
    is computed instead (each replica's share of the pool is bounded by its KV blocks)."""
    w = make_workload(np.array([0.0, 0.0001, 0.05, 0.0501]), np.array([256, 560, 300, 250]),
                      np.array([2, 150, 100, 2]),
                      hash_ids=[[1, 2, 3, 4], list(range(200, 209)), list(range(100, 105)),
                                [1, 2, 3, 9]], hash_block_tokens=SEG)
    pool = TokenLake()
    rec, _ = sim(w, pools(mixed=2, bw=LINK_BW, blocks=48), pool,
                 kv_bytes_per_token=KV_BYTES_PER_TOKEN, latency_s=LATENCY_S)
    assert by_id(rec, "replica_id")[3] == 1
    fetched, unfetched = pool.counts["num_fetched_segments"], pool.counts["num_unfetched_segments"]
    assert fetched + unfetched == 3 and unfetched > 0
    # What was placed is an ordinary evictable entry: B, waiting for E's blocks, may lose it
    # too (as with any per-replica cache), never gain more than was placed.
    assert by_id(rec, "num_prefix_hit_tokens")[3] <= fetched * SEG


def test_same_config_same_results():
    cfg = config_from_dict(config("tokenlake", 3.0, 120))
    a, b = run(cfg), run(cfg)
    for col, values in a.records.requests.items():
        assert np.array_equal(values, b.records.requests[col], equal_nan=True), col
    assert a.summary["routing"] == b.summary["routing"]


@pytest.mark.parametrize(("args", "needle"), [
    ("max_replicas=0", "max_replicas must be >= 1"),
    ("heavy_hitter_window_s=0", "heavy_hitter_window_s must be > 0"),
    ("heavy_hitter_min_uses=0", "heavy_hitter_min_uses must be >= 1"),
])
def test_bad_pool_args_are_one_line_errors(args, needle, capsys):
    assert main(["repro", "tokenlake", "--quick", "--set", f"cluster.router.args.{args}"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_bad_cache_aware_args_are_one_line_errors(capsys, tmp_path):
    assert main(["run", "--out", str(tmp_path / "x"), "--set", "cluster.router.name=cache_aware",
                 "--set", "cluster.router.args.cache_threshold=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cache_threshold must be in [0, 1]" in err and len(err.splitlines()) == 1


# ---- cache-aware routing (sgl-router) -----------------------------------------------------
class _View:
    def __init__(self, replica_id: int, num_requests: int) -> None:
        self.replica_id = replica_id
        self.running = [None] * num_requests
        self.waiting: list[None] = []
        self.hash_block_tokens = SEG

    @property
    def kv(self) -> _View:
        return self


class _Cluster:
    def __init__(self, *loads: int) -> None:
        self.replicas = [_View(i, n) for i, n in enumerate(loads)]


def _req(rid: int, hash_ids: tuple[int, ...], num_prompt_tokens: int) -> Request:
    return Request(id=rid, arrival_s=0.0, num_prompt_tokens=num_prompt_tokens,
                   max_output_tokens=1, hash_ids=hash_ids)


def test_cache_aware_follows_a_match_above_the_threshold_else_the_smallest_tree():
    router = CacheAware()
    view = _Cluster(0, 0, 0)
    assert router.route(view, _req(0, (1, 2, 3, 4), 256), 0.0) == 0  # empty trees: smallest
    assert router.route(view, _req(1, (7, 8), 128), 0.0) == 1  # no match: smallest tree
    # 2 of 4 segments match replica 0's tree (50% > 30%): follow it, even though busier.
    assert router.route(_Cluster(5, 0, 0), _req(2, (1, 2, 5, 6), 256), 0.0) == 0
    # 1 of 4 (25% <= 30%): the smallest tree, replica 2.
    assert router.route(view, _req(3, (1, 9, 10, 11), 256), 0.0) == 2
    assert router.report() == {"num_balance_routes": 0, "num_cache_routes": 1,
                               "num_smallest_tree_routes": 3}


def test_cache_aware_balances_only_past_both_load_bounds():
    router = CacheAware()
    router.route(_Cluster(0, 0), _req(0, (1, 2), 128), 0.0)  # the tree of replica 0
    # Gap 65 > 64 and 70 > 1.5 x 5: both bounds passed, the least loaded.
    assert router.route(_Cluster(70, 5), _req(1, (5, 6), 128), 0.0) == 1
    # Gap 60 <= 64: affinity holds despite the ratio of 61.
    assert router.route(_Cluster(61, 1), _req(2, (1, 2), 128), 0.0) == 0
    # Gap 100 > 64 but 300 <= 1.5 x 200: affinity holds.
    assert router.route(_Cluster(300, 200), _req(3, (1, 2), 128), 0.0) == 0
    assert router.counts["num_balance_routes"] == 1


def test_cache_aware_trees_forget_least_recent_tails_at_the_eviction_interval():
    router = CacheAware(max_tree_tokens=3 * SEG, eviction_interval_s=10.0)
    router.route(_Cluster(0), _req(0, (1, 2, 3, 4, 5), 320), 0.0)
    assert len(router._trees[0]) == 5  # not trimmed before the interval
    router.route(_Cluster(0), _req(1, (8,), 64), 10.0)
    assert list(router._trees[0]) == [3, 2, 1, 8]  # trimmed to 3, then 8 was inserted
    assert isinstance(router._trees[0], OrderedDict)
