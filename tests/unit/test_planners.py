"""Deployment planners, re-planning triggers and the [elastic] section of ``fleetsim run``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies.planners import (
    ConcurrencyPlanner,
    Periodic,
    SlaPlanner,
    StaticPlanner,
    Threshold,
)
from fleetsim.run import run
from fleetsim.serving.contract import MonitorWindow, PoolState

MODEL = LinearStepModel(0.01, 1e-4, 0.0)


def pool(name, role, max_replicas=8, **counts):
    return PoolState(name=name, role=role, num_gpus_per_replica=1, max_replicas=max_replicas,
                     num_replicas_by_role=counts or {role: 1}, step_model=MODEL,
                     num_kv_blocks=100_000, block_size=16, max_running=256)


def window(**kw):
    base = dict(start_s=0.0, end_s=60.0, num_arrivals=600, mean_prompt_tokens=1000.0,
                num_finished=600, mean_output_tokens=100.0, mean_ttft_s=0.22,
                mean_itl_s=math.nan, num_waiting=0, num_in_flight_by_role={})
    return MonitorWindow(**{**base, **kw})


PD = [pool("p", "prefill"), pool("d", "decode")]


def test_sla_planner_sizes_prefill_and_decode_as_dynamo_does():
    # 10 req/s x 1000 tokens over one prefill's 1000 / 0.11 s: 1.1 -> 2 prefill replicas.
    # Decode: the largest batch with 0.01 + 1e-4 b <= 0.03 s is 200, 6667 tok/s; 10 x 100
    # tok/s needs 0.15 -> 1 replica.
    plan = SlaPlanner(ttft_s=1.0, itl_s=0.03).plan(PD, window(), 60.0)
    assert plan == {("p", "prefill"): 2, ("d", "decode"): 1}


def test_sla_planner_corrects_by_measured_latency():
    # A TTFT below the model's (prefix hits) scales the prefill load down: 0.055 / 0.11.
    plan = SlaPlanner(ttft_s=1.0, itl_s=0.03).plan(PD, window(mean_ttft_s=0.055), 60.0)
    assert plan[("p", "prefill")] == 1
    # ITL 4x the model's at the measured batch (50 decoding: 0.015 s): the target shrinks
    # to 0.0075 s, below one token's step, so batch 1 (99 tok/s): 1000 / 99 -> 11, capped 8.
    plan = SlaPlanner(ttft_s=1.0, itl_s=0.03).plan(
        PD, window(mean_itl_s=0.06, num_in_flight_by_role={"decode": 50}), 60.0)
    assert plan[("d", "decode")] == 8


def test_sla_planner_gives_a_mixed_pool_both_needs_and_waits_for_lengths():
    mixed = [pool("m", "mixed")]
    plan = SlaPlanner(ttft_s=1.0, itl_s=0.03).plan(mixed, window(), 60.0)
    assert plan == {("m", "mixed"): math.ceil(1.1 + 0.15)}
    assert SlaPlanner().plan(mixed, window(mean_output_tokens=math.nan), 60.0) == {}


def test_static_planner_holds_its_first_plan():
    planner = StaticPlanner(ttft_s=1.0, itl_s=0.03)
    first = planner.plan(PD, window(), 60.0)
    assert planner.plan(PD, window(num_arrivals=6000), 120.0) == first
    assert SlaPlanner(ttft_s=1.0, itl_s=0.03).plan(PD, window(num_arrivals=6000), 120.0) != first


def test_concurrency_planner_follows_in_flight_requests():
    plan = ConcurrencyPlanner(target_in_flight=10, target_utilization=0.5).plan(
        PD, window(num_in_flight_by_role={"prefill": 11, "decode": 4}), 60.0)
    assert plan == {("p", "prefill"): 3, ("d", "decode"): 1}


def test_triggers():
    periodic = Periodic(every=3)
    assert [periodic.should_replan(window()) for _ in range(7)] == [
        True, False, False, True, False, False, True]
    th = Threshold(ttft_s=1.0, itl_s=0.05)
    assert th.should_replan(window(mean_ttft_s=1.5))
    assert th.should_replan(window(mean_ttft_s=0.5, num_waiting=3))
    assert not th.should_replan(window(mean_ttft_s=0.5, mean_itl_s=0.04))
    assert th.should_replan(window(mean_ttft_s=0.1, mean_itl_s=0.01))  # over-provisioned


# ---- fleetsim run -------------------------------------------------------------------------
SWING = {
    "model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "num_replicas": 1},
    "workload": {"trace": None, "rate_per_s": 6.0, "duration_s": 240,
                 "prompt_tokens": {"kind": "fixed", "value": 2048},
                 "output_tokens": {"kind": "fixed", "value": 128},
                 "rate_profile": [[0, 0.3], [80, 3.0], [160, 0.3]]},
}


def elastic_run(**elastic):
    return run(config_from_dict({**SWING, "elastic": elastic}))


def test_an_empty_elastic_section_changes_nothing():
    base = run(config_from_dict(SWING))
    same = elastic_run()
    for col, values in base.records.requests.items():
        assert np.array_equal(values, same.records.requests[col], equal_nan=True), col
    assert same.summary["elastic"]["timeline"] == []


def test_schedule_joins_and_leaves_and_every_request_finishes():
    r = elastic_run(schedule=[{"at_s": 60, "pool": "default", "num_gpus": 3},
                              {"at_s": 150, "pool": "default", "num_gpus": 1}],
                    leave_rule="requeue")
    e = r.summary["elastic"]
    actions = [t["action"] for t in e["timeline"]]
    assert actions.count("add") == 2 and actions.count("remove") == 2
    assert actions.count("retired") == 2
    ids = sorted(r.records.requests["request_id"].tolist())
    assert ids == list(range(len(r.workload)))
    assert set(r.records.requests["replica_id"].tolist()) == {0, 1, 2}
    # One GPU per replica: the run held 1 GPU throughout, 2 more from 60 s until they left.
    assert e["gpu_seconds"] == pytest.approx(e["gpu_seconds_by_pool"]["default"])
    assert 1 * 150 + 2 * 90 <= e["gpu_seconds"] <= 1 * 240 + 2 * 100 + 300
    assert e["usd"] == pytest.approx(e["gpu_seconds"] * r.summary["cost"]["usd_per_hour"] / 3600)


def test_planner_beats_static_on_a_swing_and_overhead_delays_its_plans():
    grow = [{"at_s": 0, "pool": "default", "num_gpus": 8}]
    static = elastic_run(schedule=grow, monitor_interval_s=20, planner={"name": "static"})
    sla = elastic_run(schedule=grow, monitor_interval_s=20, planner={"name": "sla"},
                      plan_overhead_s=2.0)
    assert sla.summary["ttft_s"]["mean"] < 0.5 * static.summary["ttft_s"]["mean"]
    e = sla.summary["elastic"]
    assert e["planner_overhead_s"] == pytest.approx(2.0 * e["num_plans"])
    plans = {t["time_s"] for t in e["timeline"] if t["action"] == "plan"}
    adds = [t["time_s"] for t in e["timeline"] if t["action"] == "add"]
    assert adds and all(any(a == pytest.approx(p + 2.0) for p in plans) for a in adds)


@pytest.mark.parametrize(("setting", "words"), [
    ("elastic.monitor_interval_s=0", ["monitor_interval_s", "0.0", "> 0"]),
    ('elastic.schedule=[{at_s=10,pool="default",num_gpus=0}]',
     ["elastic.schedule[0].num_gpus", "got 0", "keep at least one"]),
    ("elastic.planner.name=nope", ["elastic.planner.name", "'nope'", "sla"]),
])
def test_bad_elastic_input_is_one_line_and_exit_2(tmp_path, capsys, setting, words):
    code = main(["run", "--out", str(tmp_path / "o"), "--set", setting,
                 "--set", "workload.max_requests=10"])
    _, err = capsys.readouterr()
    assert code == 2
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line
    for w in words:
        assert w in line


def test_cli_writes_the_timeline(tmp_path, capsys):
    out = tmp_path / "o"
    code = main(["run", "--out", str(out), "--set", "workload.max_requests=30",
                 "--set", 'elastic.schedule=[{at_s=1,pool="default",num_gpus=2}]'])
    stdout, _ = capsys.readouterr()
    assert code == 0
    assert "elastic: changes / plans / requeued" in stdout
    timeline = json.loads((out / "elastic_timeline.json").read_text())
    assert [t["action"] for t in timeline][:2] == ["gpus", "add"]


def test_sla_planner_linear_predictor_continues_a_ramp():
    # 10 then 20 req/s: the linear forecast is 30 req/s (3.3 prefill replicas -> 4), the
    # constant one 20 (2.2 -> 3).
    constant, linear = SlaPlanner(itl_s=0.03), SlaPlanner(itl_s=0.03, predictor="linear")
    for planner in (constant, linear):
        planner.plan(PD, window(), 60.0)
    assert constant.plan(PD, window(num_arrivals=1200), 120.0)[("p", "prefill")] == 3
    assert linear.plan(PD, window(num_arrivals=1200), 120.0)[("p", "prefill")] == 4
    with pytest.raises(ValueError, match="predictor"):
        SlaPlanner(predictor="prophet")


class BadPlanner:
    def plan(self, pools, window, now_s):
        return {("default", "mixed"): 1.5}


def test_a_planner_returning_a_bad_plan_is_named_with_exit_2(tmp_path, capsys):
    code = main(["run", "--out", str(tmp_path / "o"), "--set", "workload.max_requests=40",
                 "--set", "elastic.monitor_interval_s=1",
                 "--set", "elastic.planner.name=tests.unit.test_planners:BadPlanner"])
    _, err = capsys.readouterr()
    assert code == 2
    assert "elastic.planner (BadPlanner)" in err and "replicas >= 0" in err
    assert "Traceback" not in err
