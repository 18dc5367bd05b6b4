"""The rate search on stub attainment functions with known thresholds (no simulation)."""

from __future__ import annotations

import math

import pytest

from fleetsim.search.threshold import search_threshold


def step(threshold: float, high: float = 1.0, low: float = 0.5):
    """Attainment ``high`` up to ``threshold``, ``low`` above; counts its calls."""
    calls = []

    def probe(rate: float) -> float:
        calls.append(rate)
        return high if rate <= threshold else low

    probe.calls = calls
    return probe


@pytest.mark.parametrize("threshold", [0.013, 0.9, 7.0, 123.4, 5e4])
@pytest.mark.parametrize("start", [1.0, 30.0])
def test_bisection_converges_to_known_threshold(threshold, start):
    probe = step(threshold)
    r = search_threshold(probe, target=0.9, start_rate_per_s=start, rel_tol=0.02, max_runs=60)
    assert r.status == "converged"
    assert r.goodput_rate_per_s <= threshold
    assert r.goodput_rate_per_s >= threshold / 1.02
    assert r.lowest_fail_rate_per_s > threshold
    assert r.lowest_fail_rate_per_s / r.goodput_rate_per_s <= 1.02 + 1e-12
    assert r.monotone
    assert len(probe.calls) == len(r.probes) == len(set(probe.calls))


def test_smooth_attainment_meets_target_share():
    """A logistic attainment curve: the answer is where it crosses the target."""
    def probe(rate):
        return 1.0 / (1.0 + math.exp((rate - 20.0) / 2.0))

    r = search_threshold(probe, target=0.75, start_rate_per_s=5.0, rel_tol=0.01, max_runs=40)
    exact = 20.0 + 2.0 * math.log(1 / 0.75 - 1)  # attainment(exact) == 0.75
    assert exact / 1.01 <= r.goodput_rate_per_s <= exact
    best = next(p for p in r.probes if p.rate_per_s == r.goodput_rate_per_s)
    assert best.attainment >= 0.75


def test_run_cap_is_respected():
    probe = step(1000.0)
    r = search_threshold(probe, target=0.9, start_rate_per_s=1.0, rel_tol=1e-6, max_runs=7)
    assert len(probe.calls) == 7
    assert r.status == "max_runs"
    assert r.goodput_rate_per_s is not None  # best so far is still reported


def test_bounds_give_statuses():
    r = search_threshold(step(50.0), target=0.9, start_rate_per_s=1.0, max_rate_per_s=10.0)
    assert r.status == "at_max_rate"
    assert r.goodput_rate_per_s == pytest.approx(10.0)
    assert r.lowest_fail_rate_per_s is None
    r = search_threshold(step(0.5), target=0.9, start_rate_per_s=8.0, min_rate_per_s=2.0)
    assert r.status == "below_min_rate"
    assert r.goodput_rate_per_s is None
    assert min(p.rate_per_s for p in r.probes) == pytest.approx(2.0)


def pocket(lo: float, hi: float, threshold: float = 10.0):
    """Meets the target up to ``threshold`` except in a failing pocket [lo, hi] (noise)."""
    return lambda rate: 0.0 if lo <= rate <= hi else (1.0 if rate <= threshold else 0.0)


def test_verification_finds_a_pocket_and_the_answer_drops_below_it():
    # From 1 req/s the search brackets [8, 16], bisects to about 9.9 and verifies at about
    # 9.0, inside the pocket: a miss below passes, so the answer must fall under the pocket.
    r = search_threshold(pocket(8.9, 9.1), target=0.9, start_rate_per_s=1.0, rel_tol=0.05,
                         max_runs=30, num_verify=1)
    assert not r.monotone
    assert r.goodput_rate_per_s < 8.9
    assert all(f < p for f, p in r.violations)
    assert any(8.9 <= f <= 9.1 for f, _ in r.violations)


def test_without_verification_the_pocket_goes_unseen():
    r = search_threshold(pocket(8.9, 9.1), target=0.9, start_rate_per_s=1.0, rel_tol=0.05,
                         max_runs=30, num_verify=0)
    assert r.monotone
    assert 9.5 <= r.goodput_rate_per_s <= 10.0


def test_answer_is_highest_pass_below_lowest_fail():
    """Whatever the probe order, the reported rate never sits above a failing probe."""
    r = search_threshold(pocket(3.9, 4.1), target=0.9, start_rate_per_s=2.0, rel_tol=0.05,
                         max_runs=30, growth=2.0)
    # 2 passes, 4 fails (pocket), bisect between 2 and 4: all answers are below 4.
    assert r.goodput_rate_per_s < 3.9
    assert r.lowest_fail_rate_per_s == pytest.approx(4.0)


def test_exact_target_counts_as_met():
    r = search_threshold(lambda rate: 0.9 if rate <= 3.0 else 0.89, target=0.9,
                         start_rate_per_s=1.0, rel_tol=0.01)
    assert 3.0 / 1.01 <= r.goodput_rate_per_s <= 3.0


@pytest.mark.parametrize("kw", [{"target": 0.0}, {"target": 1.2}, {"rel_tol": 0.0},
                                {"max_runs": 0}, {"min_rate_per_s": 5.0, "max_rate_per_s": 1.0}])
def test_bad_arguments_raise(kw):
    args = {"target": 0.9, "start_rate_per_s": 1.0, **kw}
    with pytest.raises(ValueError):
        search_threshold(lambda r: 1.0, **args)
