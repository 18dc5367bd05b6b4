"""The Autellix and HexAGenT entries' own arithmetic: throughput at the same latency from a
rate sweep (crossings interpolated, bounds flagged) and the entries' ablation sets."""

from __future__ import annotations

import pytest

from fleetsim.metrics.slo import crossing_rate as max_rate
from fleetsim.repro import REPRODUCTIONS
from fleetsim.repro.autellix import _ratio

RATES = (1.0, 2.0, 4.0)


def test_max_rate_interpolates_the_crossing_between_swept_rates():
    # 1.5 at 2/s, 2.5 at 4/s: the target 2 is crossed half way, at 3/s
    assert max_rate(RATES, [1.2, 1.5, 2.5], 2.0) == pytest.approx(3.0)
    assert max_rate(RATES, [1.2, 1.5, 1.9], 2.0) == 4.0  # never crossed: the top (a bound)
    assert max_rate(RATES, [2.2, 2.5, 3.0], 2.0) is None  # crossed below the sweep
    assert max_rate(RATES, [1.2, None, 3.0], 2.0) == 1.0  # a failed run ends the curve


def test_throughput_ratio_is_a_bound_only_when_a_curve_never_crosses():
    ratio, bound = _ratio(RATES, [1.2, 1.5, 2.5], [1.5, 2.5, 3.5], 2.0)
    assert ratio == pytest.approx(3.0 / 1.5) and not bound
    ratio, bound = _ratio(RATES, [1.2, 1.5, 1.9], [1.5, 2.5, 3.5], 2.0)
    assert ratio == pytest.approx(4.0 / 1.5) and bound
    assert _ratio(RATES, [2.2, 2.5, 3.0], [1.5, 2.5, 3.5], 2.0) == (None, False)


@pytest.mark.parametrize(("name", "ablations"), [
    ("autellix", {"atlas-least-loaded", "fcfs-locality", "atlas-no-preempt", "plas"}),
    ("hexagent", {"hexagent-speed-aware", "w-fcfs-placement"}),
])
def test_the_entries_run_router_and_scheduler_ablations(name, ablations):
    """Each mechanism removed on its own, run as a baseline so its ratio is in the record."""
    assert ablations <= set(REPRODUCTIONS[name].baselines)
