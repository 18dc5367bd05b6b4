"""What brings the emulator's timing to the simulator's: the precise wake-up, arrivals at
receipt, and the simulator's measured front-end overhead."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.live.alarm import Alarm
from fleetsim.live.engine import LiveEngine
from fleetsim.run import run


def test_alarm_resolves_at_its_deadline_never_before():
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop)
        try:
            woke = []
            for delay_s in (0.0, -1.0, 0.003, 0.02):
                fut = loop.create_future()
                deadline = time.monotonic() + delay_s
                alarm.set(deadline, fut)
                await asyncio.wait_for(fut, 5.0)
                woke.append(time.monotonic() - deadline)
            return woke
        finally:
            alarm.close()

    late = asyncio.run(scenario())
    assert len(late) == 4
    assert all(x >= 0 for x in late)


def test_alarm_set_replaces_the_pending_deadline():
    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        alarm = Alarm(loop)
        try:
            far, near = loop.create_future(), loop.create_future()
            alarm.set(time.monotonic() + 3600.0, far)
            alarm.set(time.monotonic() + 0.001, near)
            await asyncio.wait_for(near, 5.0)
            return far.done(), near.done()
        finally:
            alarm.close()

    assert asyncio.run(scenario()) == (False, True)


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
