"""Property tests: generic CSV round-trip and transformation invariants on random workloads."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.workloads import (
    Workload,
    head,
    load_generic,
    load_trace,
    save_generic_csv,
    scale_rate,
    time_slice,
)


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n = draw(st.integers(1, 30))
    gaps = draw(
        st.lists(st.floats(0.0, 100.0, allow_subnormal=False), min_size=n - 1, max_size=n - 1)
    )
    arrival = np.concatenate(([0.0], np.cumsum(gaps)))
    prompt = draw(st.lists(st.integers(1, 100_000), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 4096), min_size=n, max_size=n))
    block = draw(st.sampled_from([16, 512]))
    hash_ids = None
    if draw(st.booleans()):
        hash_ids = tuple(
            tuple(draw(st.lists(st.integers(0, 2**62), max_size=-(-p // block)))) for p in prompt
        )
    priority = None
    if draw(st.booleans()):
        priority = np.array(draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)))
    return Workload(
        arrival_s=arrival,
        num_prompt_tokens=np.array(prompt, dtype=np.int64),
        num_output_tokens=np.array(output, dtype=np.int64),
        hash_ids=hash_ids,
        hash_block_tokens=block,
        priority=priority,
    )


@settings(max_examples=60, deadline=None)
@given(w=workloads())
def test_generic_csv_round_trip(w: Workload) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.csv"
        save_generic_csv(w, path)
        back = load_trace(path, hash_block_tokens=w.hash_block_tokens)
        assert load_generic(path, hash_block_tokens=w.hash_block_tokens).hash_ids == back.hash_ids
    np.testing.assert_array_equal(back.arrival_s, w.arrival_s)
    np.testing.assert_array_equal(back.num_prompt_tokens, w.num_prompt_tokens)
    np.testing.assert_array_equal(back.num_output_tokens, w.num_output_tokens)
    assert back.hash_ids == w.hash_ids
    assert back.hash_block_tokens == w.hash_block_tokens
    if w.priority is None:
        assert back.priority is None
    else:
        assert back.priority is not None
        np.testing.assert_array_equal(back.priority, w.priority)


@settings(max_examples=100, deadline=None)
@given(
    w=workloads(),
    k=st.floats(0.01, 100.0),
    start_s=st.floats(0.0, 500.0),
    duration_s=st.none() | st.floats(0.001, 500.0),
    max_requests=st.none() | st.integers(0, 40),
)
def test_transforms_keep_rows_consistent(
    w: Workload, k: float, start_s: float, duration_s: float | None, max_requests: int | None
) -> None:
    out = head(time_slice(scale_rate(w, k), start_s, duration_s), max_requests)
    n = len(out)
    assert n <= len(w)
    if max_requests is not None:
        assert n <= max_requests
    assert np.all(np.diff(out.arrival_s) >= 0)
    assert np.all(out.arrival_s >= 0)
    if duration_s is not None:
        assert np.all(out.arrival_s <= duration_s)
    # Rows stay together: each kept row is a row of the original, in order.
    scaled = w.arrival_s / k
    kept = np.flatnonzero(scaled >= start_s)[:n]
    np.testing.assert_array_equal(out.num_prompt_tokens, w.num_prompt_tokens[kept])
    if w.hash_ids is not None:
        assert out.hash_ids == tuple(w.hash_ids[i] for i in kept)
