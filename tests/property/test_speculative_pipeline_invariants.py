"""A speculating pipeline replica (``PipelineStepModel.with_speculation`` under the engine's
emission schedule): tokens conserved, KV never overcommitted, and fast-forward windows give
exactly the step-by-step results."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests.conftest import simulate
from tests.property.test_engine_invariants import BLOCK, PIPELINES, emissions, workloads


@settings(max_examples=40, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(6, 64), pp=st.sampled_from([2, 3, 4]),
       emission=emissions(), max_running=st.integers(1, 8), stop_at_arrivals=st.booleans())
def test_speculating_pipeline_fast_forward_equals_stepping(workload, kv_blocks, pp, emission,
                                                          max_running, stop_at_arrivals):
    k = emission.max_tokens - 1  # draft tokens per step
    total = workload.num_prompt_tokens + workload.num_output_tokens
    assume(bool((-(-(total + emission.num_lookahead_tokens) // BLOCK) <= kv_blocks).all()))
    step_model = PIPELINES[pp].with_speculation(k, k, "test")
    kw = dict(kv_blocks=kv_blocks, max_running=max_running, max_batched_tokens=128,
              step_model=step_model, block_size=BLOCK, speculative=emission)
    slow, _ = simulate(workload, fast_forward=False, **kw)
    fast, replica = simulate(workload, fast_forward=True,
                             windows_stop_at_arrivals=stop_at_arrivals, **kw)
    r = fast.requests
    assert len(r["request_id"]) == len(workload)
    assert fast.timeline["num_tokens"].sum() == r["num_computed_tokens"].sum()
    assert (fast.timeline["num_used_blocks"] <= kv_blocks).all()
    assert replica.kv.num_used_blocks == 0
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert slow.num_steps == fast.num_steps
