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


class _Scaled:
    """A run's summary with the given Req95 and Req99 (the SLO scales)."""

    def __init__(self, req95: float, req99: float) -> None:
        self.summary = {"programs": {"slo_scale": {"req95": req95, "req99": req99}}}


class _FixedScales:
    """A ReproContext whose runs give each policy fixed Req95/Req99 (no simulation)."""

    quick = True

    def __init__(self, by_policy: dict[str, tuple[float, float]]) -> None:
        self.by_policy = by_policy

    def run_many(self, runs):
        return [_Scaled(*self.by_policy[policy]) for policy, _, _ in runs]


def test_hexagent_says_which_baseline_its_average_wins_or_loses_against():
    """The paper gives only the mean over its three baselines; the document also gives the
    mean against each, so a ratio below 1 says where it comes from."""
    from fleetsim.repro.hexagent import compare

    scales = {"hexagent": (1.0, 2.0), "w-fcfs": (2.0, 4.0), "w-llf": (1.0, 2.0),
              "atlas": (0.5, 1.0), "hexagent-speed-aware": (1.0, 2.0),
              "w-fcfs-placement": (2.0, 4.0)}
    comparison = compare(_FixedScales(scales))
    # reductions 1 - hexagent / baseline: w-fcfs 50%, w-llf 0%, atlas -100%; mean -16.7%
    assert comparison.ratio == pytest.approx(1 / (1 + 1 / 6))
    assert ("per baseline, mean reduction over the settings (Req95/Req99): w-fcfs "
            "-50.0%/-50.0%, w-llf +0.0%/+0.0%, atlas +100.0%/+100.0%") in comparison.notes
