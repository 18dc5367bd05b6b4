"""FastServe's fast-forward (``StepPlan.repeat_rule``: windows over the batch only, the other
resident jobs paused) is exact: every request's record, every timeline row and the busy and
KV-use integrals equal stepping one plan at a time, under the MLFQ (demotions on attained
service, starvation checks), FCFS and SRPT, with and without proactive swapping, on tight KV,
with windows that stop at arrivals and windows cut back by them."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import make_workload

from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import FastServePlanner, make_ordering
from fleetsim.serving.cluster import OnlyReplica, PoolSetup, simulate
from fleetsim.serving.settings import EngineSettings, PlugIns

# A step model with decode terms (windows add them in plain Python); the base quantum below
# is a few steps, so jobs are demoted inside what would be a window.
MODEL = LinearStepModel(0.01, 1e-4, 1e-6)


class Counting(FastServePlanner):
    """FastServe, counting its plans (a window is planned once)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.num_plans = 0

    def plan(self, view, now_s):
        self.num_plans += 1
        return FastServePlanner.plan(self, view, now_s)


def _run(workload, policy_args, blocks, host_blocks, fast_forward, stop_at_arrivals,
         track_itl=False):
    policy = Counting(**policy_args)
    pool = PoolSetup(name="default", role="mixed", num_replicas=1, step_model=MODEL,
                     num_kv_blocks=blocks, link_bw_bytes_per_s=math.inf,
                     num_host_kv_blocks=host_blocks, host_bw_bytes_per_s=2e7,
                     host_latency_s=1e-4)
    engine = EngineSettings(block_size=16, max_batched_tokens=256, max_running=64,
                            fast_forward=fast_forward, debug=True, kv_bytes_per_token=1000.0,
                            windows_stop_at_arrivals=stop_at_arrivals, track_itl=track_itl)
    plugins = PlugIns(make_batch_policy=lambda: policy, order_key=make_ordering("fcfs"),
                      router=OnlyReplica(), decode_router=OnlyReplica(),
                      rng=np.random.default_rng(0))
    records, _ = simulate(workload, [pool], engine, plugins)
    return records, policy


@st.composite
def workloads(draw):
    n = draw(st.integers(2, 24))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.003, 0.02, 0.1, 0.5]), min_size=n,
                         max_size=n))
    # A recompute prefills prompt and outputs whole: they fit the 256-token budget together.
    prompts = draw(st.lists(st.integers(1, 130), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    return make_workload(np.cumsum(gaps), prompts, outputs)


@settings(max_examples=80, deadline=None)
@given(workload=workloads(), scheduler=st.sampled_from(["mlfq", "fcfs", "srpt"]),
       swap=st.booleans(), blocks=st.integers(24, 80), host_blocks=st.sampled_from([0, 40, 400]),
       batch=st.integers(1, 6), quantum_s=st.sampled_from([0.01, 0.03, 0.2]),
       period=st.sampled_from([3, 17, 1000]), stop_at_arrivals=st.booleans(),
       track_itl=st.booleans())
def test_fast_forward_equals_stepping(workload, scheduler, swap, blocks, host_blocks, batch,
                                      quantum_s, period, stop_at_arrivals, track_itl):
    args = {"scheduler": scheduler, "proactive_swap": swap, "max_batch_size": batch,
            "base_quantum_s": quantum_s, "starvation_period": period,
            "starvation_limit_s": 0.05, "min_free_blocks": 2}
    fast, fast_policy = _run(workload, args, blocks, host_blocks, True, stop_at_arrivals,
                             track_itl)
    slow, slow_policy = _run(workload, args, blocks, host_blocks, False, stop_at_arrivals,
                             track_itl)
    assert len(slow.requests["request_id"]) == len(workload)  # everyone finishes
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    for col, values in slow.timeline.items():
        assert np.array_equal(values, fast.timeline[col]), col
    assert slow.num_steps == fast.num_steps
    assert slow.busy_s_by_replica == fast.busy_s_by_replica
    assert slow.kv_block_seconds_by_replica == fast.kv_block_seconds_by_replica
    if track_itl:  # the gaps between tokens, as (distinct gap, count)
        assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
        assert np.array_equal(slow.itl_counts, fast.itl_counts)
    # The policy counts its plans as if it had made each (its starvation checks).
    assert fast_policy._iterations == slow_policy._iterations == slow_policy.num_plans
    assert fast_policy.num_plans <= slow_policy.num_plans


def test_windows_replace_most_plans_of_a_decoding_batch():
    """Eight jobs, batch of four, one long quantum: the planner plans a few steps (joins,
    the batch changes) and the engine runs the rest as windows, with the same records."""
    workload = make_workload([0.0] * 8, [20] * 8, [100] * 8)
    args = {"scheduler": "mlfq", "max_batch_size": 4, "base_quantum_s": 10.0}
    fast, fast_policy = _run(workload, args, 400, 0, True, True)
    slow, slow_policy = _run(workload, args, 400, 0, False, True)
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert slow_policy.num_plans == slow.num_steps
    assert fast_policy.num_plans < slow_policy.num_plans / 10
