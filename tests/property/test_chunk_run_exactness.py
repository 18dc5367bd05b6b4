"""Chunk runs (``serving/chunk_runs.py``): a long prompt's chunks advanced in one event, alone
or with the running requests' decodes riding along, give exactly what stepping them one at a
time gives: every request column and the step count against stepping (whose decode steps,
unlike a run's, are not windowed: its timeline rows and KV block-seconds differ from
fast-forward's in the known ways), and against fast-forward without runs every timeline row,
the busy and KV integrals and the inter-token gaps too, to the last bit."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from tests.conftest import make_workload, simulate

from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, PrefixAffinity, RoundRobin
from fleetsim.policies.watermark import WatermarkPlanner
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.request import Request

HASH_BLOCK = 32
# Prefill priced by its tokens and context, so every chunk of a run has its own duration.
MODEL = LinearStepModel(0.004, 3e-5, 2e-7)


@st.composite
def long_prompts(draw, max_requests=12):
    """Prompts up to 40 budgets long, in prefix families (prefix hits, and duplicates that a
    chunk's promotion frees)."""
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.002, 0.02, 0.1, 0.5]), min_size=n,
                         max_size=n))
    prompts = draw(st.lists(st.integers(1, 700), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    families = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    hash_ids = [[f * 1000 + j for j in range(-(-p // HASH_BLOCK))]
                for p, f in zip(prompts, families, strict=True)]
    return make_workload(np.cumsum(gaps), prompts, outputs, hash_ids=hash_ids,
                         hash_block_tokens=HASH_BLOCK)


class NoRuns(TokenBudgetPlanner):
    """The token budget without ``prefill_chunks_repeat`` and ``mixed_chunks_repeat``
    (capabilities are not inherited): fast-forward with decode windows only."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)


# A prompt of each family, 20 hash blocks long: what the probe asks the prefix caches.
PROBES = [Request(-1 - f, 0.0, 20 * HASH_BLOCK, 1,
                  hash_ids=tuple(f * 1000 + j for j in range(20))) for f in range(3)]


class LoadProbe:
    """A controller that reads every replica's ``load_tokens`` and prefix-cache matches every
    few milliseconds (reads that must be exact with windows and runs in flight: the load
    counts the chunks done by then, a match settles the run first)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.seen: list[tuple[float, list[tuple[int, ...]]]] = []

    def start(self, cluster):
        return 0.0

    def on_tick(self, cluster, now_s):
        self.seen.append((now_s, [(r.load_tokens, *(r.view.num_matched_entries(q)
                                                    for q in PROBES))
                                  for r in cluster.replicas]))
        return now_s + self.every_s if len(self.seen) < 2000 else None


class WatermarkNoRuns(WatermarkPlanner):
    """``watermark`` without ``prefill_chunks_repeat``."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)


def _same_requests(slow, fast):
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert slow.num_steps == fast.num_steps
    for replica, busy_s in slow.busy_s_by_replica.items():
        assert np.isclose(busy_s, fast.busy_s_by_replica[replica], rtol=1e-9)
        assert np.isclose(slow.kv_block_seconds_by_replica[replica],
                          fast.kv_block_seconds_by_replica[replica], rtol=1e-9)


def _same(slow, fast, exact_timeline=True):
    _same_requests(slow, fast)
    if exact_timeline:  # one replica: its rows in the same order
        for col, values in slow.timeline.items():
            assert np.array_equal(values, fast.timeline[col]), col
    else:  # replicas' rows interleave as they are written: the same rows
        def rows(rec):
            table = np.column_stack([np.asarray(v, dtype=np.float64)
                                     for v in rec.timeline.values()])
            return table[np.lexsort(table.T[::-1])]
        assert np.array_equal(rows(slow), rows(fast))
    assert sorted(slow.busy_s_by_replica.items()) == sorted(fast.busy_s_by_replica.items())
    for pooled in ("itl_gaps_s", "itl_counts"):  # every inter-token gap, pooled
        a, b = getattr(slow, pooled), getattr(fast, pooled)
        assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), pooled
    assert (sorted(slow.kv_block_seconds_by_replica.items())
            == sorted(fast.kv_block_seconds_by_replica.items()))


@settings(max_examples=120, deadline=None)
@given(workload=long_prompts(), budget=st.sampled_from([16, 24, 48]),
       kv_blocks=st.integers(8, 120), max_running=st.integers(1, 6),
       ordering=st.sampled_from(["fcfs", "priority", "sjf"]),
       variant=st.sampled_from(["default", "reserve_full_isl", "threshold", "watermark"]),
       until_s=st.sampled_from([math.inf, 0.05, 0.4, 2.0]))
@example(workload=make_workload([0.0, 0.05], [600, 100], [3, 2]), budget=16, kv_blocks=120,
         max_running=2, ordering="fcfs", variant="default", until_s=math.inf)
# A decode window once opened after a plan whose blocks evicted a cached prefix that a waiting
# request would have hit: stepping admitted it at the next step (needing fewer blocks without
# the hit), the window did not (found by this test at 4x its examples; fixed in ``_execute``).
@example(workload=make_workload([0.0] * 11, [1, 1, 1, 1, 1, 32, 143, 33, 1, 1, 1],
                                [1, 1, 1, 1, 1, 1, 18, 1, 1, 1, 1],
                                hash_ids=[(0,)] * 6 + [(1000, 1001, 1002, 1003, 1004), (0, 1)]
                                + [(0,)] * 3, hash_block_tokens=HASH_BLOCK),
         budget=16, kv_blocks=8, max_running=2, ordering="fcfs", variant="default",
         until_s=math.inf)
# A prompt admitted by a mixed step's plan sorts ahead of the decode beside it (``sjf``: it
# has fewer outputs left) and takes the whole budget at the next step: no run may open there
# (found by the engine's debug check of the promise, ``mixed_chunks_repeat``).
@example(workload=make_workload([0.0, 0.0, 0.002], [1, 1, 31], [1, 3, 1],
                                hash_ids=[(0,)] * 3, hash_block_tokens=HASH_BLOCK),
         budget=16, kv_blocks=8, max_running=2, ordering="sjf", variant="default",
         until_s=math.inf)
def test_chunk_runs_equal_stepping_bit_for_bit(workload, budget, kv_blocks, max_running,
                                               ordering, variant, until_s):
    # (a prompt that does not fit the blocks is preempted and recomputed again and again:
    # runs then end where blocks run short, and start over after each recompute)
    longest = int((workload.num_prompt_tokens + workload.num_output_tokens).max())
    if -(-longest // 16) > kv_blocks:
        kv_blocks = -(-longest // 16)

    def policy(cls=TokenBudgetPlanner):
        if variant == "watermark":  # vLLM v0's admission (its own class, also declaring it)
            return WatermarkPlanner() if cls is TokenBudgetPlanner else WatermarkNoRuns()
        if variant == "reserve_full_isl":
            return cls(reserve_full_isl=True)
        if variant == "threshold":  # a cap above the budget: the budget still binds
            return cls(long_prefill_token_threshold=budget + 8)
        return cls()

    kw = dict(step_model=MODEL, kv_blocks=kv_blocks, max_batched_tokens=budget,
              max_running=max_running, ordering=ordering, until_s=until_s)
    slow, stepped = simulate(workload, fast_forward=False, batch_policy=policy(), **kw)
    windows, windowed = simulate(workload, fast_forward=True, batch_policy=policy(NoRuns),
                                 **kw)
    fast, replica = simulate(workload, fast_forward=True, batch_policy=policy(), **kw)
    _same_requests(slow, fast)
    _same(windows, fast)
    # where the run stopped (at until_s: mid-run), the replica as stepping left it (a
    # decode window's service seconds, added up in another order, aside)
    assert replica.load_tokens == stepped.load_tokens
    assert replica.kv.num_used_blocks == stepped.kv.num_used_blocks
    assert ([(r.id, r.num_computed_tokens, r.service_s) for r in replica.running]
            == [(r.id, r.num_computed_tokens, r.service_s) for r in windowed.running])
    if until_s == math.inf:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0


@settings(max_examples=60, deadline=None)
@given(workload=long_prompts(max_requests=20), shape=st.sampled_from(["mixed", "pd"]),
       replicas=st.integers(1, 2), router=st.sampled_from(["least_loaded", "prefix",
                                                             "round_robin"]),
       blocks=st.sampled_from([60, 400]), bw=st.sampled_from([1e6, 1e30]),
       probe_every_s=st.sampled_from([0.0037, 0.023]))
def test_chunk_runs_in_a_cluster_equal_stepping(workload, shape, replicas, router, blocks,
                                                bw, probe_every_s):
    """Routers read the replicas' load mid-run (``load_tokens`` counts the chunks done by
    then), hand-offs free a prefill replica's blocks mid-run (a cut), and the decode side
    takes the prompts a run finished. Where two replicas' steps end at the very same instant,
    the kernel runs the two ends in the order they were scheduled, which a run changes
    (docs/engine.md, *Chunk runs*): such draws are left out."""
    decode = LinearStepModel(0.004, 1e-4, 2e-7)
    if shape == "mixed":
        setup = [PoolSetup(name="m", role="mixed", num_replicas=replicas, step_model=MODEL,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=bw)]
    else:
        setup = [PoolSetup(name="p", role="prefill", num_replicas=replicas, step_model=MODEL,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=bw),
                 PoolSetup(name="d", role="decode", num_replicas=replicas, step_model=decode,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=bw)]

    def run(fast_forward, policy=TokenBudgetPlanner):
        make_router = {"least_loaded": LeastLoaded, "prefix": PrefixAffinity,
                       "round_robin": RoundRobin}[router]
        # (reads every 3.7 ms cut most runs inside their first step; every 23 ms, runs
        # settle several steps before a read)
        probe = LoadProbe(probe_every_s)
        return probe, *simulate_cluster(
            workload, setup, router=make_router(), decode_router=LeastLoaded(),
            make_batch_policy=policy, order_key=make_ordering("fcfs"),
            rng=np.random.default_rng(0), kv_bytes_per_token=1000.0, link_latency_s=0.0,
            block_size=16, max_batched_tokens=32, max_running=8,
            fast_forward=fast_forward, debug=True, controllers=[probe])

    slow_probe, slow, _ = run(False)
    ends = np.column_stack([slow.timeline["end_s"], slow.timeline["replica_id"]])
    ends = np.unique(ends, axis=0)  # (a replica's own rows at one instant count once)
    assume(len(np.unique(ends[:, 0])) == len(ends))
    _, windows, _ = run(True, NoRuns)
    probe, fast, cluster = run(True)
    assert probe.seen == slow_probe.seen
    assert len(fast.requests["request_id"]) == len(workload)
    _same_requests(slow, fast)
    _same(windows, fast, exact_timeline=False)
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0
