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
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf.kv_movement import query_bytes_per_token, store_token_cost
from fleetsim.policies.cache_aware import CacheAware
from fleetsim.policies.mooncake import Mooncake
from fleetsim.policies.routing import LeastLoaded
from fleetsim.policies.tokenlake import TokenLake
from fleetsim.repro.tokenlake import config
from fleetsim.run import run
from fleetsim.serving.kv_cache import KVCache
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


def test_a_request_reads_segments_another_replica_holds_and_pays_the_transfer():
    pool = TokenLake()
    rec, cluster = simulate(pool, shared_prefix_workload())
    replica, hits = by_id(rec, "replica_id"), by_id(rec, "num_prefix_hit_tokens")
    assert (replica[0], replica[1], replica[2]) == (0, 0, 1)
    assert hits[2] == 3 * SEG  # segments 1-3 from replica 0's cache; 9 is new
    num_bytes = 3 * SEG * KV_BYTES_PER_TOKEN  # no query size given: the KV moves
    assert pool.counts["num_remote_segments"] == 3
    assert pool.counts["transfer_bytes"] == num_bytes
    assert cluster.transfers.num_bytes_by_client["pool_read"] == num_bytes
    wait_s = by_id(rec, "first_scheduled_s")[2] - by_id(rec, "arrival_s")[2]
    assert wait_s == pytest.approx(LATENCY_S + num_bytes / LINK_BW)
    assert pool.report()["mean_transfer_wait_s"] == pytest.approx(wait_s)
    # Borrowed, not copied: segments 1-3 are cached once, on replica 0.
    assert all(pool.num_copies(h) == 1 for h in (1, 2, 3))
    assert 1 not in cluster.replicas[1].kv.prefix.entries
    # Per-replica caches under the same load-only routing: B misses.
    rec, _ = simulate(LeastLoaded(), shared_prefix_workload())
    assert by_id(rec, "replica_id")[2] == 1 and by_id(rec, "num_prefix_hit_tokens")[2] == 0


def test_the_smaller_of_query_and_kv_moves():
    """B computes 250 - 3 x 64 = 58 new tokens against 3 remote segments (192 tokens)."""
    pool = TokenLake(query_bytes_per_token=2 * KV_BYTES_PER_TOKEN)
    simulate(pool, shared_prefix_workload())
    assert pool.counts["transfer_bytes"] == 58 * 2 * KV_BYTES_PER_TOKEN
    assert pool.counts["num_query_shipped"] == 1
    pool = TokenLake(query_bytes_per_token=4 * KV_BYTES_PER_TOKEN)  # 232 > 192 tokens' KV
    simulate(pool, shared_prefix_workload())
    assert pool.counts["transfer_bytes"] == 3 * SEG * KV_BYTES_PER_TOKEN
    assert pool.counts["num_query_shipped"] == 0


def test_a_segment_computed_twice_is_cached_once():
    """X and Y arrive together with the same new prompt: each replica computes it, and the
    one that finishes second shares the first one's blocks and frees its own."""
    w = make_workload(np.array([0.0, 0.0]), np.array([200, 200]), np.array([2, 2]),
                      hash_ids=[[50, 51, 52, 53], [50, 51, 52, 53]], hash_block_tokens=SEG)
    pool = TokenLake()
    rec, _ = simulate(pool, w)
    assert sorted(by_id(rec, "replica_id")) == [0, 1]
    assert pool.report()["num_deduplicated"] == 3  # 200 // 64 full blocks
    assert all(pool.num_copies(h) == 1 for h in (50, 51, 52))
    rec, cluster = simulate(LeastLoaded(), w)
    assert all(sum(h in r.kv.prefix.entries for r in cluster.replicas) == 2 for h in (50, 51))


def test_a_heavy_hitter_is_copied_to_the_replica_that_reads_it():
    pool = TokenLake(heavy_hitter_min_uses=1, max_replicas=2)
    rec, _ = simulate(pool, shared_prefix_workload())
    assert by_id(rec, "num_prefix_hit_tokens")[2] == 3 * SEG
    assert pool.counts["num_heavy_hitter_copies"] == 3
    assert all(pool.num_copies(h) == 2 for h in (1, 2, 3))
    pool = TokenLake(heavy_hitter_min_uses=1, max_replicas=1)  # one copy at most: borrowed
    simulate(pool, shared_prefix_workload())
    assert pool.counts["num_heavy_hitter_copies"] == 0
    assert all(pool.num_copies(h) == 1 for h in (1, 2, 3))


def test_heavy_hitters_are_counted_in_a_window():
    pool = TokenLake(heavy_hitter_min_uses=2, heavy_hitter_window_s=10.0)
    pool._note_use(7, 0.0)
    assert not pool.is_heavy_hitter(7, 1.0)
    pool._note_use(7, 1.0)
    assert pool.is_heavy_hitter(7, 1.0)
    assert not pool.is_heavy_hitter(7, 11.0)  # the window has passed
    pool._note_use(7, 12.0)  # a new window starts
    assert not pool.is_heavy_hitter(7, 12.0)


def test_a_borrowed_segment_pins_its_owners_blocks_not_the_borrowers():
    """The pool's capacity is each replica's own KV: a borrower takes no blocks for what it
    reads, the owner's stay pinned until it gives them back (and the owner is told)."""
    owner, borrower = KVCache(40, 16, SEG), KVCache(40, 16, SEG)
    told: list[str] = []
    caches = [owner.prefix, borrower.prefix]
    owner.prefix.join_pool(caches, lambda: told.append("owner"))
    borrower.prefix.join_pool(caches, lambda: told.append("borrower"))
    x = Request(id=0, arrival_s=0.0, num_prompt_tokens=200, max_output_tokens=1,
                hash_ids=(1, 2, 3, 4))
    owner.admit(x)
    owner.allocate(x, owner.blocks_needed(x, 200))
    x.num_computed_tokens = 200
    owner.promote(x)
    owner.release(x)  # blocks 1-3 stay cached, unused: 12 evictable blocks
    assert owner.num_available_blocks == 40
    y = Request(id=1, arrival_s=0.0, num_prompt_tokens=200, max_output_tokens=1,
                hash_ids=(1, 2, 3, 5))
    assert borrower.num_matched_entries(y) == 3
    assert borrower.admission_blocks(y, 8) == 1  # only the 8 new tokens' block
    borrower.admit(y)
    assert y.num_computed_tokens == 3 * SEG
    assert owner.num_available_blocks == 40 - 12 and borrower.num_available_blocks == 40
    owner.check([])
    borrower.check([(y.num_private_blocks, y.hash_ids, y.num_cached_entries)])
    borrower.release(y)
    assert owner.num_available_blocks == 40 and told == ["owner"] * 3
    owner.check([])
    borrower.check([])


def test_same_config_same_results():
    cfg = config_from_dict(config("tokenlake", 3.0, 60))
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


def test_fast_forward_equals_stepping_with_the_pool():
    """Borrowers give back blocks from other replicas' steps: the owners' windows are cut
    then, so skipping decode steps changes nothing."""
    results = []
    for fast_forward in (True, False):
        cfg = config("tokenlake", 3.0, 60)
        cfg["engine"] = {"fast_forward": fast_forward, "debug": True}
        results.append(run(config_from_dict(cfg)))
    fast, slow = results
    assert fast.summary["routing"]["num_remote_reads"] > 0
    for col, values in slow.records.requests.items():
        assert np.array_equal(values, fast.records.requests[col], equal_nan=True), col


def test_the_embedded_mooncake_slice_is_the_head_of_the_trace():
    """The first 10 minutes of Mooncake's conversation trace (data/README.md), with its
    license; its prefix hashes load as 512-token blocks."""
    from importlib import resources

    from fleetsim.workloads import load_trace

    data = resources.files("fleetsim").joinpath("data")
    w = load_trace("embedded:mooncake_conversation_10min")
    assert len(w) == 1750 and w.hash_block_tokens == 512 and w.arrival_s[-1] == 597.0
    assert "Apache License" in data.joinpath("MOONCAKE_LICENSE.txt").read_text()


# ---- Mooncake: the host KV store and its conductor (TokenLake's second baseline) ----------
HOST_BW = 2e6  # bytes/s of each prefill replica's host link


def mooncake_pools():
    from dataclasses import replace

    from fleetsim.serving.cluster import PoolSetup
    out = pools(prefill=2, decode=1, bw=LINK_BW)
    prefill: PoolSetup = out[0]
    return [replace(prefill, num_host_kv_blocks=100, host_bw_bytes_per_s=HOST_BW), out[1]]


def test_mooncake_loads_a_prefix_from_the_host_store_over_the_host_link():
    """A computes segments 1-4 on prefill replica 0; C keeps replica 0 busy, so the conductor
    sends B (segments 1-3 shared) to replica 1, which loads them from the store over its host
    link before queueing. Without the store (the mechanism removed) B recomputes them."""
    store = Mooncake(store_bytes=1e9, store_token_cost=0.1)
    rec, cluster = sim(shared_prefix_workload(), mooncake_pools(), store,
                       kv_bytes_per_token=KV_BYTES_PER_TOKEN, latency_s=LATENCY_S)
    replica, hits = by_id(rec, "prefill_replica_id"), by_id(rec, "num_prefix_hit_tokens")
    assert (replica[0], replica[1], replica[2]) == (0, 0, 1)
    assert hits[2] == 3 * SEG
    num_bytes = 3 * SEG * KV_BYTES_PER_TOKEN
    assert store.counts["num_store_segments"] == 3
    assert cluster.transfers.num_bytes_by_client["store_read"] == num_bytes
    wait_s = by_id(rec, "first_scheduled_s")[2] - by_id(rec, "arrival_s")[2]
    assert wait_s == pytest.approx(LATENCY_S + num_bytes / HOST_BW)
    assert store.report()["mean_store_wait_s"] == pytest.approx(wait_s)
    no_store = Mooncake(store_bytes=0.0)
    rec, _ = sim(shared_prefix_workload(), mooncake_pools(), no_store,
                 kv_bytes_per_token=KV_BYTES_PER_TOKEN, latency_s=LATENCY_S)
    assert by_id(rec, "prefill_replica_id")[2] == 1
    assert by_id(rec, "num_prefix_hit_tokens")[2] == 0


def test_the_mooncake_store_evicts_least_recently_used_segments_at_capacity():
    """A store of 2 segments: B's match enters A's segments 1-3 in turn, so segment 1, the
    least recently used, leaves it, and B's match is cut to what the store holds."""
    store = Mooncake(store_bytes=2 * SEG * KV_BYTES_PER_TOKEN)
    rec, _ = sim(shared_prefix_workload(), mooncake_pools(), store,
                 kv_bytes_per_token=KV_BYTES_PER_TOKEN, latency_s=LATENCY_S)
    assert store.report()["num_store_segments_held"] == 2
    assert store.counts["num_store_evictions"] == 1
    assert store.counts["num_store_segments"] == 0  # segment 1 gone: no leading run to load
    assert by_id(rec, "num_prefix_hit_tokens")[2] == 0


def test_the_store_load_is_priced_from_the_model_and_the_gpu():
    """KV bytes per token over PCIe, over a token's prefill at the BF16 roofline."""
    assert store_token_cost(get_model("llama-3.1-8b"), get_gpu("h100")) == pytest.approx(
        (131072 / 64e9) / (2 * 8030261248 / 989e12))


def test_a_shipped_query_moves_its_query_and_attention_output_on_every_layer():
    """Llama-3.1-8B: 32 heads x 128 x 32 layers, BF16, out and back."""
    assert query_bytes_per_token(get_model("llama-3.1-8b")) == 2 * 32 * 128 * 32 * 2


def test_tokenlake_with_cache_aware_routing_routes_as_cache_aware_does():
    """The ablation that keeps the pool and removes TokenLake's scheduling: its choices are
    the cache_aware router's on the same views."""
    router, reference = TokenLake(cache_aware_routing=True), CacheAware()
    view = _Cluster(0, 0, 0)
    for i, (hashes, n) in enumerate([((1, 2, 3, 4), 256), ((7, 8), 128), ((1, 2, 9), 192)]):
        assert router.route(view, _req(i, hashes, n), 0.0) == reference.route(
            view, _req(i, hashes, n), 0.0)
