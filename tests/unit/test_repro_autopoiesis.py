"""``fleetsim repro autopoiesis``: its scenarios, baselines, quick-slice direction and
determinism (the replay's accuracy against the run: ``tests/unit/test_evolve.py``)."""

from __future__ import annotations

import copy

import pytest

from fleetsim.config import config_from_dict
from fleetsim.repro.autopoiesis import MAX_GPUS_PER_POOL, SCENARIOS, _space, config
from fleetsim.run import run


@pytest.fixture
def quick(quick_run):
    """The quick slice's (comparison, ctx), from the run test_repro.py's per-entry test reads
    when this process ran it already (conftest.quick_run)."""
    run = quick_run("autopoiesis")
    return run.comparison, run.ctx


@pytest.mark.slow
def test_quick_slice_evolve_finishes_the_workload_sooner_than_the_static_planner(quick):
    comparison, ctx = quick
    # The full run's direction (docs/reproductions.md): evolve is faster than static.
    assert comparison.ratio is not None and comparison.ratio > 1.0
    res = comparison.results
    assert res["evolve"]["h100-fluctuating"] < res["static"]["h100-fluctuating"]
    assert set(comparison.attribution) == {"periodic"}
    evo = ctx.runs[("evolve", "h100-fluctuating")].summary["elastic"]["evolution"]
    assert evo["num_searches"] >= 1 and evo["search_overhead_s"] == pytest.approx(
        0.5 * evo["num_replays"])
    # The static planner plans once and holds; the periodic one re-plans at every point.
    static = ctx.runs[("static", "h100-fluctuating")].summary["elastic"]
    periodic = ctx.runs[("periodic", "h100-fluctuating")].summary["elastic"]
    assert static["num_changes"] <= 2 < periodic["num_changes"]


def test_periodic_is_the_evolving_planners_first_policy_and_the_space_has_12():
    space = _space()
    assert len(space) == 12 and len({label for label, _, _ in space}) == 12
    label, planner, trigger = space[0]
    assert planner["name"] == "sla" and trigger == {"name": "always", "args": {}}


def test_scenarios_are_the_papers_clusters_and_dynamics():
    for scenario in SCENARIOS:
        cfg = config_from_dict(config(scenario, {"name": "static"}))
        gpus = {p.gpu for p in cfg.cluster.pools}
        assert len(gpus) == (2 if scenario.startswith("hetero") else 1)
        counts = sorted({c.num_gpus for c in cfg.elastic.schedule})
        if scenario.endswith("autoscaling"):  # GPUs join and leave by the schedule
            assert counts == [MAX_GPUS_PER_POOL // 2, MAX_GPUS_PER_POOL]
        else:
            assert counts == [MAX_GPUS_PER_POOL]
        assert sum(MAX_GPUS_PER_POOL for _ in cfg.cluster.pools) == 32


def test_evolve_is_deterministic_per_seed():
    base = config("hetero-autoscaling", {"name": "evolve", "args": {
        "concurrency_targets": [32], "periodic_every": [2]}})
    base["workload"]["duration_s"] = 150
    first = run(config_from_dict(copy.deepcopy(base))).summary
    again = run(config_from_dict(copy.deepcopy(base))).summary
    assert first["elastic"] == again["elastic"] and first["makespan_s"] == again["makespan_s"]
    assert first["elastic"]["evolution"]["num_searches"] >= 1


@pytest.mark.slow
def test_timeline_figure_is_drawn_from_the_runs(quick, tmp_path):
    pytest.importorskip("matplotlib")
    from fleetsim.repro.autopoiesis import replicas_over_time, timeline_figure
    _, ctx = quick
    timeline_figure(ctx, tmp_path)
    assert (tmp_path / "timeline.png").stat().st_size > 10_000
    times, counts = replicas_over_time(ctx.runs[("periodic", "h100-fluctuating")].summary)
    assert times == sorted(times) and min(counts) >= 2 and max(counts) > 2  # P/D: 1 + 1 up
