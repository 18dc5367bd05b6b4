"""Goodput search is monotone: a harder requirement never gives a higher answer, and the
answer is within tolerance of the true threshold, for any monotone attainment curve."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.search.threshold import search_threshold

thresholds = st.floats(min_value=0.05, max_value=500.0)
starts = st.floats(min_value=0.1, max_value=100.0)
tols = st.sampled_from([0.01, 0.05, 0.2])


def logistic(center: float, width: float):
    return lambda rate: 1.0 / (1.0 + math.exp(min((rate - center) / width, 700.0)))


@settings(max_examples=150, deadline=None)
@given(t1=thresholds, t2=thresholds, start=starts, tol=tols,
       target=st.floats(min_value=0.05, max_value=1.0))
def test_pointwise_lower_attainment_never_gives_higher_goodput(t1, t2, start, tol, target):
    """Curve A is below curve B everywhere (A's knee is earlier): goodput(A) <= goodput(B)."""
    lo, hi = sorted((t1, t2))
    a = search_threshold(logistic(lo, lo / 10), target=target, start_rate_per_s=start,
                         rel_tol=tol, max_runs=60)
    b = search_threshold(logistic(hi, hi / 10), target=target, start_rate_per_s=start,
                         rel_tol=tol, max_runs=60)
    # None: no rate passes (a logistic never quite reaches a target of 1.0)
    assert (a.goodput_rate_per_s or 0.0) <= (b.goodput_rate_per_s or 0.0)


@settings(max_examples=150, deadline=None)
@given(center=thresholds, start=starts, tol=tols,
       targets=st.tuples(st.floats(0.05, 1.0), st.floats(0.05, 1.0)))
def test_stricter_target_never_gives_higher_goodput(center, start, tol, targets):
    loose, strict = sorted(targets)
    curve = logistic(center, center / 5)
    g_strict = search_threshold(curve, target=strict, start_rate_per_s=start, rel_tol=tol,
                                max_runs=60).goodput_rate_per_s
    g_loose = search_threshold(curve, target=loose, start_rate_per_s=start, rel_tol=tol,
                               max_runs=60).goodput_rate_per_s
    assert (g_strict or 0.0) <= (g_loose or 0.0)


@settings(max_examples=150, deadline=None)
@given(threshold=thresholds, start=starts, tol=tols)
def test_answer_within_tolerance_of_a_step_threshold(threshold, start, tol):
    r = search_threshold(lambda rate: 1.0 if rate <= threshold else 0.0, target=0.9,
                         start_rate_per_s=start, rel_tol=tol, max_runs=60)
    assert r.status == "converged"
    assert threshold / (1 + tol) <= r.goodput_rate_per_s <= threshold
    assert r.lowest_fail_rate_per_s > threshold
