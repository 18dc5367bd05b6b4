"""The one SLO crossing and the one SLO attainment (metrics/slo.py) every entry and summary
uses: a crossing interpolated between swept rates, bounds and misses, both directions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetsim.metrics.slo import attainment, crossing_rate, slo_met

RATES = (1.0, 2.0, 4.0)


@pytest.mark.parametrize(("values", "want"), [
    ([1.2, 1.5, 2.5], 3.0),  # 1.5 at 2/s, 2.5 at 4/s: the target 2 is crossed half way
    ([1.2, 1.5, 1.9], 4.0),  # never crossed: the top rate (a bound)
    ([1.2, 1.5, 2.0], 4.0),  # at the target is within it
    ([2.2, 2.5, 3.0], None),  # beyond at the lowest rate
    ([1.2, None, 3.0], 1.0),  # a run that did not finish ends the curve
    ([None, 1.0, 1.0], None),
])
def test_a_rising_curve_crosses_where_it_first_exceeds_the_limit(values, want):
    got = crossing_rate(RATES, values, 2.0)
    assert got == (None if want is None else pytest.approx(want))
    # a sweep that skips the rates after the crossing (CPU time) reads the same
    got = crossing_rate((*RATES, 8.0), values, 2.0)
    want = 8.0 if want == 4.0 else want
    assert got == (None if want is None else pytest.approx(want))


def test_a_curve_that_comes_back_under_the_limit_keeps_its_first_crossing():
    assert crossing_rate((1.0, 2.0, 3.0, 4.0), [1.0, 3.0, 1.0, 1.0], 2.0) == pytest.approx(1.5)


@pytest.mark.parametrize("values", [[1.0, 0.95, 0.85, 0.5], [1.0, 1.0, 0.93, 0.91],
                                    [0.5, 1.0, 1.0, 1.0], [0.97, 0.6]])
def test_a_falling_curve_is_the_mirror_of_a_rising_one(values):
    """Attainment falls with load: beyond is below the limit, and the crossing is the one of
    the negated curve, bit for bit (negation is exact)."""
    rates = (1.0, 2.0, 3.0, 4.0)
    assert crossing_rate(rates, values, 0.9, rising=False) == crossing_rate(
        rates, [-v for v in values], -0.9)


def test_a_falling_curve_interpolates_between_its_last_pass_and_first_miss():
    assert crossing_rate((1.0, 2.0, 3.0), [1.0, 0.95, 0.85], 0.9, rising=False) == (
        pytest.approx(2.5))
    assert crossing_rate((1.0, 2.0), [0.95, 0.92], 0.9, rising=False) == 2.0
    assert crossing_rate((1.0, 2.0), [0.5, 0.4], 0.9, rising=False) is None


def test_attainment_counts_both_targets_and_a_one_token_output_has_no_tpot_to_miss():
    ttft = [0.5, 2.0, 0.5, 0.5]
    tpot = [0.01, 0.01, 0.2, math.nan]
    met_ttft, met_tpot = slo_met(ttft, tpot, 1.0, 0.1)
    assert met_ttft.tolist() == [True, False, True, True]
    assert met_tpot.tolist() == [True, True, False, True]
    assert attainment(ttft, tpot, 1.0, 0.1) == 0.5
    # the unfinished have no latencies: counted as misses through the denominator
    assert attainment(ttft, tpot, 1.0, 0.1, num_requests=8) == 0.25
    assert attainment([], [], 1.0, 0.1) == 0.0


def test_attainment_takes_a_target_per_request():
    ttft = np.array([3.0, 3.0])
    assert attainment(ttft, [0.01, 0.01], np.array([2.0, 4.0]), 0.1) == 0.5
