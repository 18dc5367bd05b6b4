"""The Autellix and HexAGenT entries' own arithmetic: throughput at the same latency from a
rate sweep (crossings interpolated, bounds flagged), Autellix's in the paper's metric (s/token)
and the entries' ablation sets."""

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


class _ProgramCurves:
    """A ReproContext whose runs give fixed mean latencies per token and slowdowns per
    (policy, rate), every program's standalone latency per token 10 ms; it keeps the configs
    it was given."""

    def __init__(self, per_token: dict[str, list[float]], slowdown: dict[str, list[float]],
                 rates: tuple[float, ...], quick: bool = False) -> None:
        self.per_token, self.slowdown, self.rates = per_token, slowdown, rates
        self.quick, self.configs = quick, []

    def run_many(self, runs, workloads=None):
        out = []
        for policy, _, config in runs:
            self.configs.append(config)
            i = self.rates.index(config["programs"]["rate_per_s"])
            out.append(SimpleNamespace(summary={
                "programs": {"latency_per_token_s": {"mean": self.per_token[policy][i]},
                             "standalone_per_token_s": {"mean": 0.01},
                             "slowdown": {"mean": self.slowdown[policy][i]},
                             "num_unfinished": 0},
                "num_preemptions": 3, "kv_cache": {"mean_used_fraction": 0.5}}))
        return out


def test_autellix_headline_is_throughput_at_twice_the_standalone_latency_per_token():
    """The ratio and the ablations in the paper's metric (s/token, target 2 x the standalone
    10 ms: 20 ms), the former slowdown form in the notes, from different curves."""
    from fleetsim.repro.autellix import ABLATIONS, QUICK_RATES, compare

    assert QUICK_RATES == (2.0, 6.0, 24.0)
    fast, slow = [0.015, 0.018, 0.022], [0.015, 0.025, 0.04]  # 20 ms crossed at 15/s, at 4/s
    per_token = {"atlas": fast, "vllm": slow, "atlas-least-loaded": slow,
                 "fcfs-locality": fast, "atlas-no-preempt": fast, "plas": slow}
    # slowdown 2 crossed by vllm at 6 + 18 x 0.2 / 0.7 programs/s, never by atlas (24: a bound)
    slowdowns = {p: [1.2, 1.4, 1.6] if v is fast else [1.5, 1.8, 2.5]
                 for p, v in per_token.items()}
    comparison = compare(_ProgramCurves(per_token, slowdowns, QUICK_RATES, quick=True))
    assert comparison.ratio == pytest.approx(15.0 / 4.0) and not comparison.ratio_is_bound
    assert comparison.reference == ("target", pytest.approx(0.02))
    assert comparison.headline["atlas"] == pytest.approx(15.0)
    assert comparison.results["vllm"] == dict(zip(("2", "6", "24"), slow, strict=True))
    assert comparison.attribution == pytest.approx(
        {"atlas-least-loaded": 1.0, "fcfs-locality": 3.75, "atlas-no-preempt": 3.75,
         "plas": 1.0})
    assert set(comparison.attribution) == set(ABLATIONS)
    assert any(n.startswith("the former form, mean slowdown (JCT / T_w): atlas over vllm "
                            f"<= 2: {24 / (6 + 18 * 0.2 / 0.7):.2f}x") for n in comparison.notes)


def test_autellix_full_run_measures_the_schedulers_where_kv_binds():
    """The regime where the scheduler can matter: one engine of a GPU whose KV binds, the
    schedulers against vLLM in the ratio's form (crossings of the same target)."""
    from fleetsim.repro.autellix import KV_BOUND_GPU, KV_BOUND_RATES, kv_bound_notes

    rates = KV_BOUND_RATES  # 0.5, 0.75, 1, ...: vllm crosses 20 ms at 0.75, atlas at 1
    ms = {"vllm": [15, 20, 30, 40, 50, 60], "atlas": [15, 17.5, 20, 30, 40, 50],
          "atlas-no-preempt": [15, 30, 35, 40, 50, 60]}
    ctx = _ProgramCurves({p: [v / 1e3 for v in vs] for p, vs in ms.items()},
                         {p: [v / 10 for v in vs] for p, vs in ms.items()}, rates)
    notes = kv_bound_notes(ctx)
    assert {(c["hardware"]["gpu"], c["hardware"]["num_replicas"]) for c in ctx.configs} == {
        (KV_BOUND_GPU, 1)}
    assert len(ctx.configs) == 3 * len(rates)
    assert any("atlas over vllm at mean latency per token <= 20.0 ms (2x the standalone 10.0 "
               "ms/token): 1.33x" in n and n.endswith("in mean slowdown <= 2: 1.33x")
               for n in notes)
    # atlas-no-preempt crosses 20 ms at 0.5 + 0.25 * 5 / 15
    assert any(f"atlas-no-preempt over vllm at mean latency per token <= 20.0 ms (2x the "
               f"standalone 10.0 ms/token): {(0.5 + 0.25 / 3) / 0.75:.2f}x" in n for n in notes)
