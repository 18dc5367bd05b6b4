"""What brings the emulator's timing to the simulator's: the precise wake-up, arrivals at
receipt, and the simulator's measured front-end overhead."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.live.alarm import Alarm
from fleetsim.live.compare import frontend_overhead
from fleetsim.live.engine import LiveEngine
from fleetsim.run import run


@pytest.mark.parametrize("clock", [time.monotonic, lambda: time.monotonic()],
                         ids=["timerfd", "loop timers"])
def test_alarm_resolves_at_its_deadline_never_before(clock):
    """Deadlines in the past fire at once, later ones not before they come (the timerfd on
    Linux with the monotonic clock; the loop's timers with any other clock)."""
    async def scenario() -> tuple[bool, list[float]]:
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop, clock)
        try:
            woke = []
            for delay_s in (0.0, -1.0, 0.003, 0.02, -1e9):
                fut = loop.create_future()
                deadline = time.monotonic() + delay_s
                alarm.set(deadline, fut)
                await asyncio.wait_for(fut, 5.0)
                woke.append(time.monotonic() - deadline)
            return alarm.precise, woke
        finally:
            alarm.close()

    precise, late = asyncio.run(scenario())
    assert precise == (clock is time.monotonic and sys.platform == "linux")
    assert len(late) == 5
    if precise:  # the loop's ms timers may fire a fraction of a ms early (uvloop)
        assert all(x >= 0 for x in late)


def test_alarm_set_replaces_the_pending_deadline():
    async def scenario() -> tuple[bool, bool, bool]:
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop)
        try:
            far, near, last = loop.create_future(), loop.create_future(), loop.create_future()
            alarm.set(time.monotonic() + 3600.0, far)
            alarm.set(time.monotonic() + 0.001, near)
            await asyncio.wait_for(near, 5.0)
            alarm.set(time.monotonic() + 0.002, last)  # re-armed after it fired
            await asyncio.wait_for(last, 5.0)
            return far.done(), near.done(), last.done()
        finally:
            alarm.close()

    assert asyncio.run(scenario()) == (False, True, True)


def test_a_request_enters_the_engine_when_it_was_received():
    """Submitted later (its body read and parsed meanwhile), it still arrives at receipt; a
    later receipt never goes before an earlier submit's arrival (ids keep arrival order)."""
    wall = [100.0]
    engine = LiveEngine(load_config(None, []), clock=lambda: wall[0])

    async def scenario() -> list[float]:
        engine.start()
        try:
            wall[0] = 100.5
            a = engine.submit(100, 4, received_s=100.25)
            b = engine.submit(100, 4, received_s=100.125)  # parsed faster than a
            c = engine.submit(100, 4)  # now
            return [a.req.arrival_s, b.req.arrival_s, c.req.arrival_s]
        finally:
            await engine.stop()

    assert asyncio.run(scenario()) == [0.25, 0.25, 0.5]


def _latencies(overhead_s: float) -> dict[str, np.ndarray]:
    config = load_config(None, ["workload.max_requests=60",
                                f"cluster.frontend_overhead_s={overhead_s}"])
    req = run(config).records.requests
    order = np.argsort(req["request_id"])
    return {k: np.asarray(req[k])[order] for k in ("arrival_s", "first_token_s", "finish_s",
                                                   "num_output_tokens")}


def test_frontend_overhead_adds_exactly_to_ttft_and_e2e_and_leaves_tpot():
    """A constant shift of every arrival translates the whole run."""
    base, shifted = _latencies(0.0), _latencies(0.004)
    assert np.array_equal(base["arrival_s"], shifted["arrival_s"])  # send times stay
    for key in ("first_token_s", "finish_s"):
        assert np.allclose(shifted[key] - base[key], 0.004, rtol=0, atol=1e-9)
    tpot = [(r["finish_s"] - r["first_token_s"]) for r in (base, shifted)]
    assert np.allclose(tpot[0], tpot[1], rtol=0, atol=1e-9)


@pytest.mark.parametrize("value", ["-0.001", "11", "nan"])
def test_a_bad_frontend_overhead_is_one_line_and_exit_2(capsys, value):
    code = main(["run", "--set", f"cluster.frontend_overhead_s={value}",
                 "--set", "workload.max_requests=5"])
    err = capsys.readouterr().err
    assert code == 2
    assert "cluster.frontend_overhead_s" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def _write_rows(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_frontend_overhead_matches_requests_in_arrival_order(tmp_path):
    """Live rows are the client's (send times), engine rows the emulator's (arrival at the
    server); two sends swapped on the wire still pair by their lengths; a failed request and
    an unmatched one are left out."""
    live = _write_rows(tmp_path / "live.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.030},
        {"arrival_s": 1.0, "prompt_tokens": 20, "output_tokens": 5, "ttft_s": 0.050},
        {"arrival_s": 1.0001, "prompt_tokens": 30, "output_tokens": 5, "ttft_s": 0.040},
        {"arrival_s": 2.0, "prompt_tokens": 40, "output_tokens": 5, "ttft_s": None,
         "status": "error"},
        {"arrival_s": 3.0, "prompt_tokens": 99, "output_tokens": 9, "ttft_s": 0.5}])
    engine = _write_rows(tmp_path / "engine.jsonl", [
        {"arrival_s": 5.001, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.026},
        {"arrival_s": 6.002, "prompt_tokens": 30, "output_tokens": 5, "ttft_s": 0.034},
        {"arrival_s": 6.003, "prompt_tokens": 20, "output_tokens": 5, "ttft_s": 0.048},
        {"arrival_s": 7.0, "prompt_tokens": 40, "output_tokens": 5, "ttft_s": 0.02}])
    fe = frontend_overhead(live, engine)
    assert fe["num_matched"] == 3
    assert fe["p50"] == pytest.approx(0.004)
    assert fe["mean"] == pytest.approx((0.004 + 0.002 + 0.006) / 3)


def test_frontend_overhead_without_a_match_is_an_input_error(tmp_path):
    live = _write_rows(tmp_path / "live.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.03}])
    engine = _write_rows(tmp_path / "engine.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 11, "output_tokens": 5, "ttft_s": 0.03}])
    with pytest.raises(FleetsimInputError, match="fleetsim emulate --record"):
        frontend_overhead(live, engine)


def test_compare_prints_the_front_end_and_the_key_to_include_it(tmp_path, capsys):
    live = _write_rows(tmp_path / "live.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.03,
         "tpot_s": 0.01, "e2e_s": 0.07}])
    engine = _write_rows(tmp_path / "engine.jsonl", [
        {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.025}])
    sim = tmp_path / "sim"
    assert main(["run", "--set", f'workload.trace="{live}"', "--out", str(sim), "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", live, str(sim), "--engine", engine]) == 0
    out = capsys.readouterr().out
    assert ("front end (live TTFT - engine TTFT, 1 of 1 requests matched by arrival order, "
            "prompt and output lengths): mean 5.0 ms") in out
    assert "--set cluster.frontend_overhead_s=0.0050" in out
