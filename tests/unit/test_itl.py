"""Inter-token latency: per request (mean, p99, max) and pooled (vllm bench serve's ITL),
checked against gaps computed independently from the step log, with fast-forward on and off."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import make_workload, simulate

from fleetsim.metrics.summary import itl_distribution, per_request_latencies, weighted_percentiles
from fleetsim.perf.base import LinearStepModel

# Decode steps lengthen as KV grows, so gaps differ step to step.
MODEL = LinearStepModel(0.01, 1e-4, 1e-5)


@pytest.mark.parametrize("fast_forward", [False, True])
def test_lone_requests_gaps_are_the_step_durations(fast_forward):
    """One request at a time: its gaps are exactly the durations of the steps after its
    prefill, which the step log (fast-forward off) gives independently."""
    outputs = [2, 40, 257, 130]
    w = make_workload([0.0, 100.0, 200.0, 300.0], [50, 60, 70, 5], outputs)
    rec, _ = simulate(w, step_model=MODEL, max_running=1, fast_forward=fast_forward)
    ref, _ = simulate(w, step_model=MODEL, max_running=1, fast_forward=False)
    ends = ref.timeline["end_s"]
    lat = per_request_latencies(rec.requests)
    all_gaps = []
    for i, (rid, n) in enumerate(zip(rec.requests["request_id"], rec.requests["num_output_tokens"],
                                     strict=True)):
        first = rec.requests["first_token_s"][i]
        k = int(np.searchsorted(ends, first))
        token_times = ends[k:k + n]
        assert token_times[0] == first and token_times[-1] == rec.requests["finish_s"][i]
        gaps = np.diff(token_times)
        all_gaps.append(gaps)
        assert lat["itl_mean_s"][i] == pytest.approx(gaps.mean(), rel=1e-12), rid
        assert lat["itl_max_s"][i] == gaps.max(), rid
        assert lat["itl_p99_s"][i] == np.percentile(gaps, 99), rid
    pooled = np.concatenate(all_gaps)
    d = itl_distribution(rec)
    assert d["num_gaps"] == pooled.size == sum(n - 1 for n in outputs)
    assert d["p50"] == np.percentile(pooled, 50)
    assert d["p99"] == np.percentile(pooled, 99)
    assert d["max"] == pooled.max()
    assert d["mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert d["std"] == pytest.approx(pooled.std(), rel=1e-9)


def test_a_preemption_shows_as_one_long_gap():
    """Two long requests in a cache too small for both: the one preempted waits for the
    other to finish, and its largest gap is that wait, many ordinary steps long."""
    w = make_workload([0.0, 0.0], [60, 60], [120, 120])
    rec, _ = simulate(w, step_model=MODEL, kv_blocks=14, block_size=16)
    r = rec.requests
    assert r["num_preemptions"].sum() >= 1
    lat = per_request_latencies(r)
    victim = int(np.argmax(r["num_preemptions"]))
    assert lat["itl_max_s"][victim] > 10 * np.nanmedian(lat["itl_mean_s"])
    # the same run with fast-forward gives the same figures
    fast, _ = simulate(w, step_model=MODEL, kv_blocks=14, block_size=16, fast_forward=True)
    slow, _ = simulate(w, step_model=MODEL, kv_blocks=14, block_size=16, fast_forward=False)
    for col in ("itl_p99_s", "itl_max_s", "last_token_s"):
        assert np.array_equal(fast.requests[col], slow.requests[col], equal_nan=True)


def test_weighted_percentiles_equal_numpy_on_the_expanded_sample():
    rng = np.random.default_rng(3)
    values = np.sort(rng.random(50))
    counts = rng.integers(1, 9, 50)
    expanded = np.repeat(values, counts)
    pcts = [0.1, 1, 25, 50, 90, 99, 99.9, 100]
    assert weighted_percentiles(values, counts, pcts) == list(np.percentile(expanded, pcts))
