"""The evolving planner (``policies/evolve.py``) and its window replays (``serving/replay.py``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.policies.evolve import EvolvePlanner
from fleetsim.run import run

SWING = {
    "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "num_replicas": 1},
    "workload": {"trace": None, "rate_per_s": 6.0, "duration_s": 240,
                 "prompt_tokens": {"kind": "fixed", "value": 2048},
                 "output_tokens": {"kind": "fixed", "value": 128},
                 "rate_profile": [[0, 0.3], [80, 3.0], [160, 0.3]]},
}
GROW = [{"at_s": 0, "pool": "default", "num_gpus": 8}]


def evolve_run(**args):
    return run(config_from_dict({**SWING, "elastic": {
        "schedule": GROW, "monitor_interval_s": 20,
        "planner": {"name": "evolve", "args": args}}}))


@pytest.fixture(scope="module")
def evolved():
    return evolve_run()


def _real_by_window(r, start_s, end_s):
    """Mean TTFT and SLO attainment of the run's requests that arrived in the window."""
    req = r.records.requests
    ttft = req["first_token_s"] - req["arrival_s"]
    n = req["num_output_tokens"]
    tpot = np.where(n > 1, (req["finish_s"] - req["first_token_s"]) / np.maximum(n - 1, 1),
                    np.nan)
    met = (ttft <= 1.0) & (np.isnan(tpot) | (tpot <= 0.05))
    m = (req["arrival_s"] >= start_s) & (req["arrival_s"] < end_s)
    return int(m.sum()), float(ttft[m].mean()), float(met[m].mean())


def test_replay_of_the_incumbent_predicts_the_window_within_5_percent(evolved):
    searches = [t for t in evolved.summary["elastic"]["evolution"]["timeline"]
                if t["action"] == "search"]
    assert len(searches) >= 6
    for t in searches:
        num, ttft, attainment = _real_by_window(evolved, *t["window"])
        incumbent = t["scores"][0]
        assert incumbent["policy"] == t["incumbent"]
        assert num == t["num_arrivals"]
        assert incumbent["mean_ttft_s"] == pytest.approx(ttft, rel=0.05), t["window"]
        if incumbent["slo_attainment"] >= 0.99:  # where the window's own work fits
            assert incumbent["slo_attainment"] == pytest.approx(attainment, abs=0.05)


def test_search_swaps_a_better_policy_in_at_the_next_point_and_charges_its_replays(evolved):
    ev = evolved.summary["elastic"]["evolution"]
    timeline = ev["timeline"]
    searches = [t for t in timeline if t["action"] == "search"]
    assert ev["num_swaps"] >= 1
    assert ev["search_overhead_s"] == pytest.approx(0.5 * ev["num_replays"])
    assert ev["search_overhead_s"] == pytest.approx(sum(t["search_s"] for t in searches))
    for i, t in enumerate(timeline):
        if t["action"] != "swap":
            continue
        search = timeline[i - 1]
        assert search["action"] == "search" and search["winner"] == t["to"]
        # The first monitoring point after the search ended.
        assert t["time_s"] == search["time_s"] + 20
        scores = {s["policy"]: s for s in search["scores"]}
        win, inc = scores[t["to"]], scores[search["incumbent"]]
        assert (min(win["slo_attainment"], 0.99), -win["gpu_seconds"]) > (
            min(inc["slo_attainment"], 0.99), -inc["gpu_seconds"])
    assert [s["policy"] for s in ev["serving"]][1:] == [
        t["to"] for t in timeline if t["action"] == "swap"]


def test_a_slow_search_swaps_later_and_none_overlaps():
    r = evolve_run(replay_cost_s=15.0)
    timeline = r.summary["elastic"]["evolution"]["timeline"]
    ready_s = -math.inf
    for i, t in enumerate(timeline):
        if t["action"] == "search":
            assert t["time_s"] >= ready_s  # no search starts while one runs
            ready_s = t["time_s"] + t["search_s"]
        else:
            search = timeline[i - 1]
            end_s = search["time_s"] + search["search_s"]
            assert t["time_s"] == 20 * math.ceil(end_s / 20)
    assert any(t["search_s"] > 20 for t in timeline if t["action"] == "search")


def test_evolving_beats_the_static_planner_and_is_deterministic_per_seed(evolved):
    static = run(config_from_dict({**SWING, "elastic": {
        "schedule": GROW, "monitor_interval_s": 20, "planner": {"name": "static"}}}))
    assert evolved.summary["slo"]["attainment"] > static.summary["slo"]["attainment"] + 0.05
    again = evolve_run()
    assert again.summary["elastic"] == evolved.summary["elastic"]
    other = evolve_run(seed=1)
    drawn = [[s["policy"] for s in t["scores"]]
             for t in other.summary["elastic"]["evolution"]["timeline"] if "scores" in t]
    assert drawn != [[s["policy"] for s in t["scores"]]
                     for t in evolved.summary["elastic"]["evolution"]["timeline"]
                     if "scores" in t]


def test_policy_space_is_the_documented_grid():
    planner = EvolvePlanner(sla_ttft_s=(1.0,), sla_predictors=("constant", "linear"),
                            concurrency_targets=(32,), periodic_every=(3,), threshold=False)
    labels = [p.label for p in planner.space()]
    assert labels == [
        "sla(ttft_s=1.0,predictor=constant)+always",
        "sla(ttft_s=1.0,predictor=constant)+periodic(every=3)",
        "sla(ttft_s=1.0,predictor=linear)+always",
        "sla(ttft_s=1.0,predictor=linear)+periodic(every=3)",
        "concurrency(target_in_flight=32)+always",
        "concurrency(target_in_flight=32)+periodic(every=3)"]
    assert len(EvolvePlanner().space()) == (3 * 2 + 4) * (1 + 2 + 1)


@pytest.mark.parametrize(("settings", "words"), [
    (["elastic.monitor_interval_s=0"], ["elastic", "monitor_interval_s", "got 0.0", "> 0"]),
    (["elastic.planner.args.sla_ttft_s=[]", "elastic.planner.args.concurrency_targets=[]"],
     ["elastic.planner.args", "policy space is empty", "sla_ttft_s=[]",
      "concurrency_targets, at least one value"]),
    (["elastic.planner.args.num_candidates=0"],
     ["elastic.planner.args", "num_candidates must be >= 1, got 0"]),
])
def test_bad_evolve_input_is_one_line_and_exit_2(tmp_path, capsys, settings, words):
    argv = ["run", "--out", str(tmp_path / "o"), "--set", "workload.max_requests=10",
            "--set", "elastic.planner.name=evolve"]
    for s in settings:
        argv += ["--set", s]
    code = main(argv)
    _, err = capsys.readouterr()
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    for w in words:
        assert w in line


def test_cli_writes_the_evolution_timeline(tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["run", "--out", str(out), "--set", "workload.max_requests=200",
                 "--set", "elastic.monitor_interval_s=10", "--set", "elastic.planner.name=evolve",
                 "--set", 'elastic.schedule=[{at_s=0,pool="default",num_gpus=4}]'])
    stdout, _ = capsys.readouterr()
    assert code == 0 and "evolution_timeline.json" in stdout
    evolution = json.loads((out / "evolution_timeline.json").read_text())
    assert evolution["num_searches"] >= 1 and evolution["serving"][0]["from_s"] == 0.0
    assert evolution["timeline"][0]["action"] == "search"
