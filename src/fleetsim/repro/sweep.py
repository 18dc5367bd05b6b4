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
from fleetsim.repro.frame import ReproContext
from fleetsim.results import RunFiles
from fleetsim.run import RunResult
from fleetsim.workloads import Workload

Run = RunResult | RunFiles
Curves = dict[str, dict[str, float | None]]
"""policy -> rate label -> metric value (None: not measured, e.g. requests left unfinished),
the ``results`` of a ``Comparison``."""


@dataclass(frozen=True, slots=True)
class RateSweep:
    """The runs of a sweep: ``runs[policy][i]`` is the run at ``rates[i]`` (a list that may
    stop short of ``rates``: ``sweep_rates``'s ``until``)."""

    rates: tuple[float, ...]
    labels: tuple[str, ...]
    runs: dict[str, list[Run]]

    def curves(self, metric: Callable[[Run], Any]) -> Curves:
        """``metric`` of every run, by policy then rate label (a policy whose sweep stopped
        short has no label past its last run)."""
        return {policy: {label: metric(run) for label, run in zip(self.labels, runs,
                                                                   strict=False)}
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
                prefix: str = "", workload: Callable[[int], Workload] | None = None,
                until: Callable[[list[Run]], bool] | None = None) -> RateSweep:
    """Run ``config(policy, i)`` (the config at ``rates[i]``) for every policy and rate, kept
    in ``ctx`` under (policy, ``prefix + label(rate)``): ``prefix`` tells a second sweep of
    the same policies apart (e.g. another dataset).

    ``workload(i)``: requests built in memory for ``rates[i]``, the same for every policy
    (``run()``'s ``workload``). ``until(runs)``: a policy whose runs so far satisfy it runs no
    higher rate (its crossings are set; CPU time), so the sweep goes a rate at a time, the
    policies still running given together, and ``runs[policy]`` may stop short of ``rates``."""
    labels = tuple(label(rate) for rate in rates)
    done: dict[str, list[Run]] = {policy: [] for policy in policies}
    rounds = [range(len(rates))] if until is None else [range(i, i + 1)
                                                         for i in range(len(rates))]
    for indices in rounds:
        wls = {i: workload(i) for i in indices} if workload is not None else {}
        todo = [(policy, i) for policy in policies for i in indices
                if until is None or not (done[policy] and until(done[policy]))]
        if not todo:
            break  # every policy's crossings are set
        results = ctx.run_many([(policy, prefix + labels[i], config(policy, i))
                                for policy, i in todo],
                               workloads=[wls.get(i) for _, i in todo])
        for (policy, _), result in zip(todo, results, strict=True):
            done[policy].append(result)
    return RateSweep(tuple(rates), labels, done)
