"""The Autellix and HexAGenT entries' own arithmetic: throughput at the same latency from a
rate sweep (crossings interpolated, bounds flagged) and the entries' ablation sets."""

from __future__ import annotations

from types import SimpleNamespace

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
        self.summary = {"programs": {"slo_scale": {"req95": req95, "req99": req99}},
                        "pools": [{"gpu": "H200", "role": "prefill", "busy_fraction": 0.9},
                                  {"gpu": "H200", "role": "decode", "busy_fraction": 0.5},
                                  {"gpu": "A100", "role": "decode", "busy_fraction": 0.0}]}


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
    # and whether the routers leave a GPU type's decode replicas idle (prefill pools left out)
    assert ("decode replicas busy, share of the run, by GPU (llama-3.1-70b lats @8/s): "
            "hexagent H200 50%, A100 0%; w-fcfs H200 50%, A100 0%; hexagent-speed-aware "
            "H200 50%, A100 0%") in comparison.notes


class _Slowdowns:
    """A ReproContext whose runs give fixed mean slowdowns per (policy, rate); it keeps the
    configs it was given."""

    quick = False

    def __init__(self, by_policy: dict[str, list[float]], rates: tuple[float, ...]) -> None:
        self.by_policy, self.rates, self.configs = by_policy, rates, []

    def run_many(self, runs, workloads=None):
        out = []
        for policy, _, config in runs:
            self.configs.append(config)
            slowdown = self.by_policy[policy][self.rates.index(
                config["programs"]["rate_per_s"])]
            out.append(SimpleNamespace(summary={
                "programs": {"slowdown": {"mean": slowdown}, "num_unfinished": 0},
                "num_preemptions": 3, "kv_cache": {"mean_used_fraction": 0.5}}))
        return out


def test_autellix_full_run_measures_the_schedulers_where_kv_binds():
    """The regime where the scheduler can matter: one engine of a GPU whose KV binds, the
    schedulers against vLLM in the ratio's form (crossings of the same target)."""
    from fleetsim.repro.autellix import KV_BOUND_GPU, KV_BOUND_RATES, kv_bound_notes

    rates = KV_BOUND_RATES  # 0.5, 0.75, 1, ...: vllm crosses 2 at 0.75, atlas at 1
    ctx = _Slowdowns({"vllm": [1.5, 2.0, 3.0, 4.0, 5.0, 6.0],
                      "atlas": [1.5, 1.75, 2.0, 3.0, 4.0, 5.0],
                      "atlas-no-preempt": [1.5, 3.0, 3.5, 4.0, 5.0, 6.0]}, rates)
    notes = kv_bound_notes(ctx)
    assert {(c["hardware"]["gpu"], c["hardware"]["num_replicas"]) for c in ctx.configs} == {
        (KV_BOUND_GPU, 1)}
    assert len(ctx.configs) == 3 * len(rates)
    assert any("atlas over vllm at mean slowdown <= 2: 1.33x" in n for n in notes)
    # atlas-no-preempt crosses 2 at 0.5 + 0.25 * 0.5 / 1.5
    assert any(f"atlas-no-preempt over vllm at mean slowdown <= 2: "
               f"{(0.5 + 0.25 / 3) / 0.75:.2f}x" in n for n in notes)
