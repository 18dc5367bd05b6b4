"""Properties of the step-time model: bit-exact decode and chunk-run fast paths, and
monotonicity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import build_step_model

MODELS = [
    build_step_model(get_model("Llama-3.1-8B"), get_gpu("h100"), 1),
    build_step_model(get_model("Llama-3.1-70B"), get_gpu("a100"), 4),
    build_step_model(get_model("Mixtral-8x7B"), get_gpu("h100"), 2),
    build_step_model(get_model("Llama-3.1-8B"), get_gpu("h20"), 1),  # roofline only
    # async scheduling with a CPU cost that is sometimes the bottleneck, sometimes hidden
    build_step_model(get_model("Llama-3.1-8B"), get_gpu("h100"), 1, step_overhead_s=0.01,
                     step_overhead_per_seq_s=2e-5, async_scheduling=True),
]
which = st.sampled_from(range(len(MODELS)))
chunks = st.lists(st.tuples(st.integers(1, 20_000), st.integers(0, 200_000)), max_size=4)


@settings(max_examples=200, deadline=None)
@given(which, st.integers(0, 5000), st.lists(st.integers(0, 2**40), min_size=1, max_size=8))
def test_decode_fast_path_is_bit_exact(i, num_decode, kvs):
    sm = MODELS[i]
    kv = np.array(kvs, dtype=np.int64)
    vec = sm.decode_step_times_s(num_decode, kv)
    base, per_kv, extra = sm.decode_terms_s(num_decode)
    for got, k in zip(vec.tolist(), kvs, strict=True):
        assert got == sm.step_time_s((), num_decode, int(k))
        assert (base + per_kv * k) + extra == got


@settings(max_examples=200, deadline=None)
@given(which, st.integers(1, 20_000), st.integers(0, 512),
       st.lists(st.tuples(st.integers(0, 2_000_000), st.integers(0, 2**40)), min_size=1,
                max_size=8))
def test_chunk_run_prices_are_bit_exact(i, chunk, num_decode, points):
    """A chunk run's prices (``chunk_prices``: the terms its steps share added once) are
    ``step_time_s``'s, float for float (an async model's too)."""
    sm = MODELS[i]
    prices = sm.chunk_prices(chunk, num_decode)
    for ctx, kv in points:
        assert prices.step_s(ctx, kv) == sm.step_time_s([(chunk, ctx)], num_decode, kv)


@settings(max_examples=200, deadline=None)
@given(
    which,
    chunks,
    st.integers(0, 2000),
    st.integers(0, 10**7),
    st.integers(0, 3),
    st.integers(0, 5000),
    st.integers(0, 10**5),
)
def test_more_work_never_faster(i, prefill, n, kv, grow_chunk, more_new, more_kv):
    """Adding tokens to a chunk, context, decode requests or KV never makes a step faster."""
    sm = MODELS[i]
    kv = kv if n else 0
    base = sm.step_time_s(prefill, n, kv)
    assert base > 0 or (not prefill and n == 0)
    assert sm.step_time_s(prefill, n + 1, kv + more_kv) >= base
    if n:
        assert sm.step_time_s(prefill, n, kv + more_kv) >= base
    assert sm.step_time_s([*prefill, (1 + more_new, more_kv)], n, kv) >= base
    if prefill:
        j = grow_chunk % len(prefill)
        new, ctx = prefill[j]
        bigger = list(prefill)
        bigger[j] = (new + more_new, ctx)
        assert sm.step_time_s(bigger, n, kv) >= base
        bigger[j] = (new, ctx + more_kv)
        assert sm.step_time_s(bigger, n, kv) >= base
