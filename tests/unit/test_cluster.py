"""Multi-replica clusters: routing, P/D handoff over the KV link, and bad cluster configs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.conftest import by_id, make_workload

from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, PowerOfTwo, PrefixAffinity, RoundRobin
from fleetsim.run import run
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.standalone import standalone_latency_s

PREFILL = LinearStepModel(0.002, 5e-5, 1e-7)
DECODE = LinearStepModel(0.004, 1e-4, 2e-7)


def pools(*, mixed=0, prefill=0, decode=0, blocks=2000, bw=math.inf, decode_blocks=None):
    out = []
    if mixed:
        out.append(PoolSetup(name="m", role="mixed", num_replicas=mixed, step_model=PREFILL,
                             num_kv_blocks=blocks, link_bw_bytes_per_s=bw))
    if prefill:
        out.append(PoolSetup(name="p", role="prefill", num_replicas=prefill,
                             step_model=PREFILL, num_kv_blocks=blocks, link_bw_bytes_per_s=bw))
    if decode:
        out.append(PoolSetup(name="d", role="decode", num_replicas=decode, step_model=DECODE,
                             num_kv_blocks=decode_blocks or blocks, link_bw_bytes_per_s=bw))
    return out


def sim(workload, setup, router=None, *, kv_bytes_per_token=1000.0, latency_s=0.0,
        fast_forward=True, seed=0, max_running=64, **kw):
    return simulate_cluster(
        workload, setup, router=router or RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(seed), kv_bytes_per_token=kv_bytes_per_token,
        link_latency_s=latency_s, block_size=16, max_batched_tokens=512,
        max_running=max_running, fast_forward=fast_forward, debug=True, **kw)


def random_workload(n=120, seed=0, rate=40.0, hash_ids=False):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 600, n)
    hashes = None
    if hash_ids:
        fam = rng.integers(0, 4, n)
        hashes = [[int(f) * 1000 + j for j in range(-(-int(p) // 64))]
                  for p, f in zip(prompts, fam, strict=True)]
    return make_workload(np.cumsum(rng.exponential(1 / rate, n)), prompts,
                         rng.integers(1, 120, n), hash_ids=hashes, hash_block_tokens=64)


def test_round_robin_spreads_requests_in_turn():
    w = random_workload(40)
    rec, cluster = sim(w, pools(mixed=4))
    replica = by_id(rec, "replica_id")
    assert all(replica[i] == i % 4 for i in range(40))
    assert len(cluster.replicas) == 4


@pytest.mark.parametrize("router", [RoundRobin, LeastLoaded, PowerOfTwo, PrefixAffinity])
def test_every_router_serves_everyone_and_frees_all_kv(router):
    w = random_workload(150, hash_ids=True)
    rec, cluster = sim(w, pools(mixed=3, blocks=300), router=router())
    assert len(rec.requests["request_id"]) == 150
    for r in cluster.replicas:
        assert r.kv.num_used_blocks == 0 and r.load_tokens == 0
        assert not r.running and not r.waiting


def test_least_loaded_beats_round_robin_on_tail_latency_under_skew():
    # Alternating huge and tiny prompts: round robin sends every huge one to replica 0.
    n = 60
    prompts = [4000 if i % 2 == 0 else 10 for i in range(n)]
    w = make_workload(np.arange(n) * 0.01, prompts, [5] * n)
    rr, _ = sim(w, pools(mixed=2, blocks=5000), RoundRobin())
    ll, _ = sim(w, pools(mixed=2, blocks=5000), LeastLoaded())
    def e2e_p99(rec):
        return np.percentile(rec.requests["finish_s"] - rec.requests["arrival_s"], 99)

    assert e2e_p99(ll) < e2e_p99(rr)


def test_prefix_affinity_raises_hit_rate_over_round_robin():
    w = random_workload(200, hash_ids=True, rate=20.0)
    rr, _ = sim(w, pools(mixed=4), RoundRobin())
    pa, _ = sim(w, pools(mixed=4), PrefixAffinity())
    assert (pa.requests["num_prefix_hit_tokens"].sum()
            > rr.requests["num_prefix_hit_tokens"].sum())


@pytest.mark.parametrize(("loads", "want"), [([7], 0), ([2, 2], 0), ([5, 3, 3, 7], 1),
                                              ([9, 8, 7, 1], 3), ([0, 4, 0], 0)])
def test_least_loaded_takes_the_first_of_the_fewest_outstanding_tokens(loads, want):
    from types import SimpleNamespace

    view = SimpleNamespace(replicas=[SimpleNamespace(load_tokens=n) for n in loads])
    assert LeastLoaded().route(view, None, 0.0) == want
    # (any sequence of replicas, not only the engine's list)
    view = SimpleNamespace(replicas=tuple(view.replicas))
    assert LeastLoaded().route(view, None, 0.0) == want


def test_power_of_two_is_deterministic_per_seed():
    w = random_workload(100)
    a, _ = sim(w, pools(mixed=5), PowerOfTwo(), seed=3)
    b, _ = sim(w, pools(mixed=5), PowerOfTwo(), seed=3)
    assert np.array_equal(a.requests["replica_id"], b.requests["replica_id"])


def test_cluster_fast_forward_equals_step_by_step():
    """Windows of every replica are cut back by arrivals and transfers: still exact."""
    w = random_workload(150, seed=4)
    for setup in (pools(mixed=3, blocks=200), pools(prefill=1, decode=2, blocks=200, bw=5e6)):
        fast, _ = sim(w, setup, LeastLoaded(), fast_forward=True)
        slow, _ = sim(w, setup, LeastLoaded(), fast_forward=False)
        for col, values in slow.requests.items():
            assert np.array_equal(values, fast.requests[col], equal_nan=True), col


def test_pd_with_ideal_link_matches_standalone_latency():
    """One request alone: TTFT is its prefill on the prefill pool, E2E adds its decode
    steps on the decode pool, and the transfer takes no time."""
    w = make_workload([0.0], [700], [40])
    rec, _ = sim(w, pools(prefill=1, decode=1, bw=1e30), latency_s=0.0)
    expected = standalone_latency_s(PREFILL, w.num_prompt_tokens, w.num_output_tokens, 512,
                                    decode_step_model=DECODE)
    r = rec.requests
    assert r["finish_s"][0] - r["arrival_s"][0] == pytest.approx(expected[0], rel=1e-12)
    assert r["kv_transfer_s"][0] == pytest.approx(0.0, abs=1e-9)
    assert r["prefill_replica_id"][0] == 0 and r["replica_id"][0] == 1


def test_kv_transfer_takes_latency_plus_bytes_over_bandwidth():
    w = make_workload([0.0], [1000], [5])
    rec, cluster = sim(w, pools(prefill=1, decode=1, bw=1e6), kv_bytes_per_token=100.0,
                       latency_s=0.01)
    assert rec.requests["kv_transfer_s"][0] == pytest.approx(0.01 + 1000 * 100.0 / 1e6)
    assert cluster.transfers.num_bytes == 1000 * 100.0


def test_transfers_sharing_a_link_share_its_bandwidth():
    # Two prefills finish together on one prefill replica; their transfers share its egress.
    w = make_workload([0.0, 0.0], [200, 200], [5, 5])
    rec, _ = sim(w, pools(prefill=1, decode=2, bw=1e6), kv_bytes_per_token=100.0)
    alone = 200 * 100.0 / 1e6
    assert rec.requests["kv_transfer_s"].tolist() == pytest.approx([2 * alone, 2 * alone])


def test_decode_admission_waits_for_kv_and_conserves_blocks():
    # The decode replica holds 70 blocks: about one request at a time.
    w = make_workload(np.arange(6) * 0.001, [1000] * 6, [30] * 6)
    rec, cluster = sim(w, pools(prefill=1, decode=1, blocks=500, decode_blocks=70))
    r = rec.requests
    assert len(r["request_id"]) == 6
    assert r["kv_transfer_s"].max() > 0.05  # later ones waited for the decode replica's KV
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
        assert replica.kv.num_free_blocks + replica.kv.num_evictable_blocks == replica.kv.num_blocks


def test_run_reports_pools_cost_and_transfers():
    cfg = config_from_dict({
        "workload": {"max_requests": 60},
        "cluster": {"pools": [{"name": "p", "gpu": "h200", "role": "prefill"},
                              {"name": "d", "gpu": "a100", "role": "decode",
                               "num_replicas": 2}]},
    })
    s = run(cfg).summary
    assert [p["name"] for p in s["pools"]] == ["p", "d"]
    assert s["num_finished"] == 60
    assert s["kv_transfer_s"]["mean"] > 0
    assert s["cost"]["usd_per_hour"] == pytest.approx(
        sum(p["usd_per_hour"] for p in s["pools"]))
    for p in s["pools"]:
        assert 0 < p["busy_fraction"] <= 1 and 0 < len(p["timeline"]["busy_fraction"]) <= 60


@pytest.mark.parametrize(("pools_cfg", "link", "needle"), [
    ([{"name": "p", "gpu": "h100", "role": "prefill"}], {}, "no decode pool"),
    ([{"name": "d", "gpu": "h100", "role": "decode"}], {}, "no prefill pool"),
    ([{"name": "m", "gpu": "h100", "tp": 16}], {}, "tp"),
    ([{"name": "m", "gpu": "l40s", "tp": 1}], {}, "cluster.pools[0] (m)"),
    ([{"name": "p", "gpu": "h200", "role": "prefill"},
      {"name": "d", "gpu": "a100", "role": "decode"}], {"placement": "intra_node"},
     "inter_node"),
    ([{"name": "m", "gpu": "h100", "role": "both"}], {}, "role"),
])
def test_bad_clusters_are_clear_errors(pools_cfg, link, needle):
    def build_and_run():
        cfg = config_from_dict({"model": "llama-3.1-70b" if "l40s" in str(pools_cfg) else
                                "llama-3.1-8b", "workload": {"max_requests": 5},
                                "cluster": {"pools": pools_cfg, "link": link}})
        run(cfg)

    with pytest.raises(FleetsimInputError) as err:
        build_and_run()
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_pd_under_heavy_kv_pressure_finishes_everything():
    """Tiny KV on both sides: preemptions on the decode replica, waiting for transfers on
    the prefill one; every request still finishes and every block comes back."""
    w = random_workload(80, seed=9, rate=200.0)
    rec, cluster = sim(w, pools(prefill=1, decode=1, blocks=60, decode_blocks=60, bw=2e7),
                       max_running=8)
    assert len(rec.requests["request_id"]) == 80
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
    fast, _ = sim(w, pools(prefill=1, decode=1, blocks=60, decode_blocks=60, bw=2e7),
                  max_running=8, fast_forward=False)
    for col, values in fast.requests.items():
        assert np.array_equal(values, rec.requests[col], equal_nan=True), col


@pytest.mark.parametrize("router", [RoundRobin, LeastLoaded, PowerOfTwo, PrefixAffinity])
def test_routers_respect_replica_capacity(router):
    """A pool of small-KV replicas next to a big one: requests too big for the small ones
    always go to the big one, whatever the router; the rest may go anywhere."""
    big = PoolSetup(name="big", role="mixed", num_replicas=1, step_model=PREFILL,
                    num_kv_blocks=200, link_bw_bytes_per_s=math.inf)
    small = PoolSetup(name="small", role="mixed", num_replicas=3, step_model=PREFILL,
                      num_kv_blocks=20, link_bw_bytes_per_s=math.inf)
    w = random_workload(120, seed=2, hash_ids=True)
    rec, _ = sim(w, [big, small], router())
    r = rec.requests
    too_big = -(-(r["num_prompt_tokens"] + r["num_output_tokens"]) // 16) > 20
    assert too_big.any() and (~too_big).any()
    assert (r["replica_id"][too_big] == 0).all()
    assert len(r["request_id"]) == 120


def test_decode_router_respects_decode_capacity():
    setup = [PoolSetup(name="p", role="prefill", num_replicas=1, step_model=PREFILL,
                       num_kv_blocks=200, link_bw_bytes_per_s=1e9),
             PoolSetup(name="d-small", role="decode", num_replicas=2, step_model=DECODE,
                       num_kv_blocks=20, link_bw_bytes_per_s=1e9),
             PoolSetup(name="d-big", role="decode", num_replicas=1, step_model=DECODE,
                       num_kv_blocks=200, link_bw_bytes_per_s=1e9)]
    w = random_workload(80, seed=5)
    rec, _ = sim(w, setup)
    r = rec.requests
    too_big = -(-(r["num_prompt_tokens"] + r["num_output_tokens"]) // 16) > 20
    decoded = r["num_output_tokens"] > 1  # one-token requests finish on the prefill replica
    assert (too_big & decoded).any()
    assert (r["replica_id"][too_big & decoded] == 3).all()


def test_prefix_affinity_reports_its_balance_fallbacks_in_the_summary():
    cfg = {"hardware": {"num_replicas": 4}, "workload": {"max_requests": 300},
           "cluster": {"router": {"name": "prefix_affinity",
                                  "args": {"balance_abs_tokens": 0, "balance_rel": 1.0}}}}
    s = run(config_from_dict(cfg)).summary
    assert s["routing"]["router"] == "prefix_affinity"
    # A zero load bound sends every imbalanced arrival to the least loaded replica.
    assert 0 < s["routing"]["num_balance_routes"] <= 300
    plain = run(config_from_dict({"workload": {"max_requests": 50}})).summary
    assert plain["routing"] == {"router": plain["routing"]["router"]}
