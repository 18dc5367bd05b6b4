"""The rate sweep most entries' key figure is: every policy run at every arrival rate, a metric
read from each run, and where each policy's curve crosses the SLO (throughput at the SLO).

One harness for every entry that sweeps rates through ``run()``: the runs are given to
``ReproContext.run_many`` at once (independent, so they spread over the free cores), kept
under (policy, rate label), and read back per policy in rate order."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetsim.metrics.slo import crossing_rate
from fleetsim.repro.frame import ReproContext, RunFiles
from fleetsim.run import RunResult

Run = RunResult | RunFiles
Curves = dict[str, dict[str, float | None]]
"""policy -> rate label -> metric value (None: not measured, e.g. requests left unfinished),
the ``results`` of a ``Comparison``."""


@dataclass(frozen=True, slots=True)
class RateSweep:
    """The runs of a sweep: ``runs[policy][i]`` is the run at ``rates[i]``."""

    rates: tuple[float, ...]
    labels: tuple[str, ...]
    runs: dict[str, list[Run]]

    def curves(self, metric: Callable[[Run], float | None]) -> Curves:
        """``metric`` of every run, by policy then rate label."""
        return {policy: {label: metric(run) for label, run in zip(self.labels, runs,
                                                                   strict=True)}
                for policy, runs in self.runs.items()}

    def crossings(self, curves: Curves, limit: float, *, rising: bool = True
                  ) -> dict[str, float | None]:
        """Each policy's rate where its curve leaves ``limit`` (``metrics.slo.crossing_rate``:
        interpolated; the top rate, a bound, if never; None if already at the lowest)."""
        return {policy: crossing_rate(self.rates, list(by_label.values()), limit, rising=rising)
                for policy, by_label in curves.items()}


def sweep_rates(ctx: ReproContext, policies: Sequence[str], rates: Sequence[float],
                config: Callable[[str, int], Mapping[str, Any]], *,
                label: Callable[[float], str] = lambda rate: f"{rate:g}",
                prefix: str = "") -> RateSweep:
    """Run ``config(policy, i)`` (the config at ``rates[i]``) for every policy and rate, kept
    in ``ctx`` under (policy, ``prefix + label(rate)``): ``prefix`` tells a second sweep of
    the same policies apart (e.g. another model)."""
    labels = tuple(label(rate) for rate in rates)
    runs = [(policy, prefix + labels[i], config(policy, i)) for policy in policies
            for i in range(len(rates))]
    done = iter(ctx.run_many(runs))
    return RateSweep(tuple(rates), labels,
                     {policy: [next(done) for _ in rates] for policy in policies})
