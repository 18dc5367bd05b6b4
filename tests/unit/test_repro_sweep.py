"""The one rate-sweep harness (``repro/sweep.py``): every policy at every rate given to
``run_many`` at once, kept under (policy, rate label), read back per policy in rate order,
and each curve's SLO crossing."""

from __future__ import annotations

import pytest

from fleetsim.repro.frame import ReproContext, RunFiles
from fleetsim.repro.sweep import sweep_rates


class _Ctx(ReproContext):
    """A context whose runs are scripted: the config's ``value`` is the run's metric."""

    def run_many(self, runs, *, workloads=None):
        self.given = list(runs)
        out = [RunFiles({"value": base["value"]}, dict(base)) for _, _, base in runs]
        self.runs.update({(p, load): r for (p, load, _), r in zip(runs, out, strict=True)})
        return out


CURVES = {"fast": [0.1, 0.2, 0.4], "slow": [0.2, 0.5, 0.9]}


def _sweep(**kw):
    ctx = _Ctx(quick=True, overrides=())
    sweep = sweep_rates(ctx, ("fast", "slow"), (1.0, 2.0, 4.0),
                        lambda policy, i: {"value": CURVES[policy][i], "policy": policy},
                        **kw)
    return ctx, sweep


def test_every_run_is_given_at_once_and_kept_under_policy_and_rate():
    ctx, sweep = _sweep()
    assert [(p, load) for p, load, _ in ctx.given] == [
        ("fast", "1"), ("fast", "2"), ("fast", "4"), ("slow", "1"), ("slow", "2"),
        ("slow", "4")]
    assert list(ctx.runs) == [(p, load) for p, load, _ in ctx.given]
    assert sweep.labels == ("1", "2", "4")
    assert [r.config["value"] for r in sweep.runs["slow"]] == CURVES["slow"]


def test_curves_and_crossings_read_each_policy_in_rate_order():
    _, sweep = _sweep()
    curves = sweep.curves(lambda run: run.summary["value"])
    assert curves == {p: dict(zip(("1", "2", "4"), v, strict=True)) for p, v in CURVES.items()}
    at = sweep.crossings(curves, 0.3)
    assert at["fast"] == pytest.approx(3.0)  # 0.2 at 2/s, 0.4 at 4/s: half way
    assert at["slow"] == pytest.approx(1.0 + 0.1 / 0.3)
    assert sweep.crossings(curves, 0.15, rising=False) == {"fast": None, "slow": 4.0}


def test_a_label_format_and_a_prefix_tell_two_sweeps_apart():
    ctx, sweep = _sweep(label=lambda r: f"{r:.2f}", prefix="long ")
    assert sweep.labels == ("1.00", "2.00", "4.00")
    assert ("fast", "long 1.00") in ctx.runs
    assert set(sweep.curves(lambda run: 0.0)["fast"]) == {"1.00", "2.00", "4.00"}


def test_until_stops_a_policy_once_its_crossing_is_set_a_rate_at_a_time():
    """A policy past the limit runs no higher rate; the others go on, given together per rate;
    the curve stops short and its crossing is the one of the whole curve."""
    ctx = _Ctx(quick=True, overrides=())
    curves = {"fast": [0.1, 0.2, 0.4, 0.1], "slow": [0.2, 0.5, 0.9, 0.1]}
    rounds = []
    original = ctx.run_many

    def run_many(runs, **kw):
        rounds.append([(p, load) for p, load, _ in runs])
        return original(runs, **kw)

    ctx.run_many = run_many
    sweep = sweep_rates(ctx, ("fast", "slow"), (1.0, 2.0, 4.0, 8.0),
                        lambda policy, i: {"value": curves[policy][i]},
                        until=lambda runs: runs[-1].summary["value"] > 0.3)
    # slow passed 0.3 at 2/s, fast at 4/s: nothing runs at 8/s
    assert rounds == [[("fast", "1"), ("slow", "1")], [("fast", "2"), ("slow", "2")],
                      [("fast", "4")]]
    values = sweep.curves(lambda run: run.summary["value"])
    assert values == {"fast": {"1": 0.1, "2": 0.2, "4": 0.4}, "slow": {"1": 0.2, "2": 0.5}}
    whole = {"slow": dict(zip(("1", "2", "4", "8"), curves["slow"], strict=True))}
    assert sweep.crossings(values, 0.3)["slow"] == sweep.crossings(whole, 0.3)["slow"]


def test_a_workload_per_rate_reaches_every_policys_run_in_order():
    import numpy as np

    from fleetsim.workloads import Workload

    ctx = _Ctx(quick=True, overrides=())
    given = []
    original = ctx.run_many

    def run_many(runs, *, workloads=None):
        given.extend(len(w.arrival_s) for w in workloads)
        return original(runs, workloads=workloads)

    ctx.run_many = run_many

    def requests(i):
        n = 2 + i
        return Workload(arrival_s=np.arange(n, dtype=np.float64),
                        num_prompt_tokens=np.ones(n, dtype=np.int64),
                        num_output_tokens=np.ones(n, dtype=np.int64))

    sweep_rates(ctx, ("fast", "slow"), (1.0, 2.0, 4.0), lambda p, i: {"value": 0.0},
                workload=requests)
    assert given == [2, 3, 4, 2, 3, 4]


def test_run_many_takes_in_memory_requests_here_and_in_helpers():
    """``run_many``'s ``workloads`` reach ``run()`` whether the runs stay here or go to
    helper processes: the same request rows either way."""
    import numpy as np

    from fleetsim.repro.loongserve import QUICK_REQUESTS, baseline_config
    from fleetsim.repro.pool import SubRuns
    from fleetsim.workloads.long_context import workload

    wl = workload("mixed", QUICK_REQUESTS // 4, 0.2, seed=0)
    runs = [("vllm", "0.2", baseline_config("vllm", "mixed"))]
    here = ReproContext(quick=True, overrides=()).run_many(runs, workloads=[wl])
    there = ReproContext(quick=True, overrides=(), subruns=SubRuns(2)).run_many(
        runs, workloads=[wl])
    assert here[0].summary["num_requests"] == len(wl.arrival_s)
    assert here[0].summary == there[0].summary
    for col, values in here[0].records.requests.items():
        assert np.array_equal(values, there[0].records.requests[col],
                              equal_nan=values.dtype.kind == "f"), col
