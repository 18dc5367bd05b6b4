"""The one rate-sweep harness (``repro/sweep.py``): every policy at every rate given to
``run_many`` at once, kept under (policy, rate label), read back per policy in rate order,
and each curve's SLO crossing."""

from __future__ import annotations

import pytest

from fleetsim.repro.frame import ReproContext, RunFiles
from fleetsim.repro.sweep import sweep_rates


class _Ctx(ReproContext):
    """A context whose runs are scripted: the config's ``value`` is the run's metric."""

    def run_many(self, runs):
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
