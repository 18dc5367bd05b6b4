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


def test_replay_of_the_incumbent_predicts_the_window_within_5_percent():
    # Scored on the window just measured, the incumbent's score is the replay of that window
    # under the deployment that served it.
    windowed = evolve_run(score_on="window")
    searches = [t for t in windowed.summary["elastic"]["evolution"]["timeline"]
                if t["action"] == "search"]
    assert len(searches) >= 6
    for t in searches:
        assert t["scored_window"] == t["window"]
        num, ttft, attainment = _real_by_window(windowed, *t["window"])
        incumbent = t["scores"][0]
        assert incumbent["policy"] == t["incumbent"]
        assert num == t["num_arrivals"]
        assert incumbent["mean_ttft_s"] == pytest.approx(ttft, rel=0.05), t["window"]
        if incumbent["slo_attainment"] >= 0.99:  # where the window's own work fits
            assert incumbent["slo_attainment"] == pytest.approx(attainment, abs=0.05)


def _score(s):
    """The documented score: attainment up to 0.99; below it the lower mean TTFT; then fewer
    GPU-seconds."""
    capped = min(s["slo_attainment"], 0.99)
    return (capped, 0.0 if capped >= 0.99 else -s["mean_ttft_s"], -s["gpu_seconds"])


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
        assert _score(win) > _score(inc)
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
    planner = EvolvePlanner(sla_itl_s=(0.05,), sla_predictors=("constant", "linear"),
                            concurrency_targets=(32,), periodic_every=(3,), threshold=False)
    labels = [p.label for p in planner.space()]
    assert labels == [
        "sla(itl_s=0.05,predictor=constant)+always",
        "sla(itl_s=0.05,predictor=constant)+periodic(every=3)",
        "sla(itl_s=0.05,predictor=linear)+always",
        "sla(itl_s=0.05,predictor=linear)+periodic(every=3)",
        "concurrency(target_in_flight=32)+always",
        "concurrency(target_in_flight=32)+periodic(every=3)"]
    assert len(EvolvePlanner().space()) == (2 * 2 + 4) * (1 + 2 + 1)


@pytest.mark.parametrize(("settings", "words"), [
    (["elastic.monitor_interval_s=0"], ["elastic", "monitor_interval_s", "got 0.0", "> 0"]),
    (["elastic.planner.args.sla_itl_s=[]", "elastic.planner.args.concurrency_targets=[]"],
     ["elastic.planner.args", "policy space is empty", "sla_itl_s=[]",
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


# ---- the LLM proposer, against a fake OpenAI-compatible endpoint on loopback --------------
GOOD = '''```python
import math

class Planner:
    def plan(self, pools, window, now_s):
        rate = window.num_arrivals / window.interval_s
        return {(p.name, p.role): min(p.max_replicas, max(1, math.ceil(rate / 7)))
                for p in pools}
```'''
LATER_RAISES = '''```python
class Planner:
    def __init__(self):
        self.calls = 0
    def plan(self, pools, window, now_s):
        self.calls += 1
        if self.calls > 2:
            return 1 / 0
        rate = window.num_arrivals / window.interval_s
        return {(p.name, p.role): min(p.max_replicas, max(1, -int(-rate // 7))) for p in pools}
```'''
BAD = {
    "raises": ("class Planner:\n    def plan(self, pools, window, now_s):\n"
               "        return {}['x']\n", "raised KeyError"),
    "loops": ("class Planner:\n    def plan(self, pools, window, now_s):\n"
              "        while True:\n            pass\n", "budget of 1000 lines"),
    "imports": ("import os\nclass Planner:\n    def plan(self, pools, window, now_s):\n"
                "        return {}\n", "imports 'os'"),
    "invalid": ("class Planner:\n    def plan(self, pools, window, now_s):\n"
                "        return {(pools[0].name, pools[0].role): 1.5}\n", "invalid plan entry"),
    "opens": ("class Planner:\n    def plan(self, pools, window, now_s):\n"
              "        open('out.txt', 'w')\n        return {}\n", "NameError"),
}


@pytest.fixture
def endpoint():
    """A loopback chat-completions server answering every call with ``replies[0]``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    replies: list[str] = []
    asked: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked.append(body)
            out = json.dumps({"choices": [{"message": {"content": replies[0]}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", replies, asked
    finally:
        server.shutdown()
        server.server_close()


def _llm_records(r):
    return [t for t in r.summary["elastic"]["evolution"]["timeline"] if t["action"] == "llm"]


def test_llm_written_policy_is_validated_scored_and_can_serve(endpoint):
    url, replies, asked = endpoint
    replies.append(GOOD)
    r = evolve_run(llm_url=url, llm_model="fake", llm_max_lines=1000)
    records = _llm_records(r)
    assert records and all(t["status"] == "accepted" for t in records)
    assert asked[0]["model"] == "fake" and "class Planner" in asked[0]["messages"][0]["content"]
    searches = [t for t in r.summary["elastic"]["evolution"]["timeline"]
                if t["action"] == "search"]
    assert all(any(s["policy"].startswith("llm(") for s in t["scores"]) for t in searches)
    assert len(asked) == len(searches) == len(records)


@pytest.mark.parametrize("case", sorted(BAD))
def test_misbehaving_llm_code_is_discarded_with_its_reason(endpoint, case):
    url, replies, _ = endpoint
    code, reason = BAD[case]
    replies.append(code)
    r = evolve_run(llm_url=url, llm_max_lines=1000)
    records = _llm_records(r)
    assert records and all(t["status"] == "rejected" and reason in t["reason"]
                           for t in records)
    assert r.summary["num_finished"] == r.summary["num_requests"]
    searches = [t for t in r.summary["elastic"]["evolution"]["timeline"]
                if t["action"] == "search"]
    assert not any(s["policy"].startswith("llm(") for t in searches for s in t["scores"])


def test_llm_policy_that_fails_later_leaves_and_its_predecessor_serves_again(endpoint):
    url, replies, _ = endpoint
    replies.append(LATER_RAISES)
    # A space of one policy: the written one is the only challenger.
    r = evolve_run(llm_url=url, sla_itl_s=[0.05], sla_predictors=["constant"],
                   concurrency_targets=[], periodic_every=[], threshold=False)
    ev = r.summary["elastic"]["evolution"]
    discarded = [t for t in ev["timeline"] if t.get("status") == "discarded"]
    assert discarded and all("ZeroDivisionError" in t["reason"] for t in discarded)
    for t in discarded:
        later = [u for u in ev["timeline"] if u["time_s"] > t["time_s"] and "scores" in u]
        assert not any(s["policy"] == t["policy"] for u in later for s in u["scores"])
    swaps = [t for t in ev["timeline"] if t["action"] == "swap"]
    served = [t for t in discarded if t["policy"] in {u["to"] for u in swaps}]
    assert served  # one served before it failed: the one it replaced is back at once
    for t in served:
        back = [u for u in swaps if u["time_s"] == t["time_s"] and u["from"] == t["policy"]]
        came = [u for u in swaps if u["to"] == t["policy"]][-1]
        assert back and back[0]["to"] == came["from"]
    assert r.summary["num_finished"] == r.summary["num_requests"]


def test_unreachable_endpoint_falls_back_with_one_warning():
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.warns(UserWarning, match="llm_url") as caught:
        r = evolve_run(llm_url=f"http://127.0.0.1:{port}/v1", llm_timeout_s=2.0)
    assert len([w for w in caught if "llm_url" in str(w.message)]) == 1
    ev = r.summary["elastic"]["evolution"]
    assert "built-in proposer only" in ev["llm_warning"]
    assert ev["num_searches"] >= 6 and not _llm_records(r)


def test_cli_llm_flags_reach_the_planner(tmp_path, capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "o"
    with pytest.warns(UserWarning, match="built-in proposer only"):
        code = main(["run", "--out", str(out), "--set", "workload.max_requests=100",
                     "--set", "elastic.monitor_interval_s=10",
                     "--set", "elastic.planner.name=evolve",
                     "--llm-url", f"http://127.0.0.1:{port}/v1", "--llm-model", "m"])
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["elastic"]["planner"]["args"] == {
        "llm_url": f"http://127.0.0.1:{port}/v1", "llm_model": "m"}
    evolution = json.loads((out / "evolution_timeline.json").read_text())
    assert str(port) in evolution["llm_warning"]


def _window(arrivals, start_s=0.0, end_s=20.0, backlog=()):
    from fleetsim.serving.contract import MonitorWindow
    return MonitorWindow(start_s=start_s, end_s=end_s, num_arrivals=len(arrivals),
                         mean_prompt_tokens=math.nan, num_finished=0,
                         mean_output_tokens=math.nan, mean_ttft_s=math.nan,
                         mean_itl_s=math.nan, num_waiting=0, num_in_flight_by_role={},
                         arrivals=tuple(arrivals), backlog=backlog)


def test_forecast_window_is_the_last_one_compressed_to_the_rate_and_repeated():
    from fleetsim.policies.evolve import forecast_arrivals
    arrivals = [(2.0 * i + 1.0, 100 + i, 10 + i) for i in range(10)]  # 0.5/s over [0, 20)
    out = forecast_arrivals(_window(arrivals), 1.5)
    assert len(out) == 30  # 1.5/s over the next 20 s
    assert all(20.0 <= t < 40.0 for t, _, _ in out)
    assert [t for t, _, _ in out] == sorted(t for t, _, _ in out)
    assert out[0][0] == pytest.approx(20.0 + 1.0 / 3) and out[10][0] == pytest.approx(
        20.0 + 20.0 / 3 + 1.0 / 3)
    assert [(p, o) for _, p, o in out] == [(p, o) for _, p, o in arrivals] * 3
    # At the window's own rate it is the window, moved by one interval.
    assert forecast_arrivals(_window(arrivals), 0.5) == tuple(
        (t + 20.0, p, o) for t, p, o in arrivals)


@pytest.mark.parametrize(("rates", "k", "expected"), [
    ([2.0], 3, 2.0), ([2.0, 6.0], 3, 10.0),  # a ramp continues
    ([6.0, 10.0, 4.0], 3, 10.0),  # a dip does not hide the peak k windows back
    ([6.0, 10.0, 4.0], 1, 4.0), ([9.0, 10.0, 4.0, 3.0], 2, 4.0)])
def test_forecast_rate_is_the_max_of_the_last_k_and_the_trend(rates, k, expected):
    planner = EvolvePlanner(forecast_windows=k)
    planner._rates = list(rates)
    assert planner.forecast_rate() == pytest.approx(expected)


def test_default_search_scores_the_next_window_at_the_forecast_rate(evolved):
    searches = [t for t in evolved.summary["elastic"]["evolution"]["timeline"]
                if t["action"] == "search"]
    assert searches and all(t["scored_on"] == "forecast" for t in searches)
    for t in searches:
        start, end = t["window"]
        assert t["scored_window"] == [end, 2 * end - start]
        assert t["scored_rate_per_s"] >= t["num_arrivals"] / (end - start) - 1e-9


def test_below_the_target_lower_ttft_beats_fewer_gpus():
    from fleetsim.policies.evolve import score
    # All miss: the deployment that serves sooner wins, not the cheaper one.
    assert score(0.0, 3.0, 240.0, 0.99) > score(0.0, 9.0, 90.0, 0.99)
    assert score(0.5, 9.0, 90.0, 0.99) > score(0.0, 3.0, 240.0, 0.99)
    # At the target, only cost counts.
    assert score(1.0, 0.5, 90.0, 0.99) > score(0.995, 0.1, 120.0, 0.99)
