from enum import IntEnum

import pytest

from fleetsim.core import Simulator


class Kind(IntEnum):
    FIRST = 0
    SECOND = 1


def test_same_time_events_follow_kind_then_push_order():
    sim = Simulator()
    log = []
    sim.on(Kind.FIRST, lambda p: log.append(("first", p, sim.now_s)))
    sim.on(Kind.SECOND, lambda p: log.append(("second", p, sim.now_s)))
    sim.schedule(1.0, Kind.SECOND, "a")
    sim.schedule(1.0, Kind.FIRST, "b")
    sim.schedule(0.5, Kind.SECOND, "c")
    sim.schedule(1.0, Kind.FIRST, "d")
    sim.run()
    assert log == [("second", "c", 0.5), ("first", "b", 1.0), ("first", "d", 1.0),
                   ("second", "a", 1.0)]
    assert sim.num_events == 4


def test_payloads_are_never_compared():
    sim = Simulator()
    seen = []
    sim.on(Kind.FIRST, seen.append)
    unorderable = [object(), object()]
    for p in unorderable:
        sim.schedule(2.0, Kind.FIRST, p)
    sim.run()
    assert seen == unorderable


def test_run_until_stops_before_later_events_and_resumes():
    sim = Simulator()
    seen = []
    sim.on(Kind.FIRST, seen.append)
    for t in (1.0, 2.0, 3.0):
        sim.schedule(t, Kind.FIRST, t)
    sim.run(until_s=2.0)
    assert seen == [1.0, 2.0]
    assert sim.peek_s() == 3.0
    sim.run()
    assert seen == [1.0, 2.0, 3.0]


def test_cannot_schedule_in_the_past_or_register_twice():
    sim = Simulator()
    sim.on(Kind.FIRST, lambda p: sim.schedule(0.5, Kind.FIRST))
    sim.schedule(1.0, Kind.FIRST)
    with pytest.raises(ValueError, match="before now"):
        sim.run()
    with pytest.raises(ValueError, match="is taken"):
        sim.on(Kind.FIRST, print)


_SPIN = """
import functools, os, signal, threading
from fleetsim.core.simulator import Simulator
# Ctrl-C's handler, whatever was inherited: a background job of a non-interactive shell
# (`make test &` in a script) starts with SIGINT ignored, and the loop would spin to the timeout.
signal.signal(signal.SIGINT, signal.default_int_handler)
sim = Simulator()
# A loop with no interpreted code at all: the handler reschedules itself (C and, in the
# compiled engine, compiled code only).
sim.on(1, functools.partial(sim.schedule, 0.0, 1), "spin")
sim.schedule(0.0, 1)
try:  # the timer starts inside: under load its signal may come before sim.run() does
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    sim.run()
except KeyboardInterrupt:
    print("interrupted after", sim.num_events or "some", "events")
"""


def test_ctrl_c_stops_the_event_loop_even_when_it_runs_no_interpreted_code():
    """The compiled loop lets pending signals in every few thousand events (before, it
    ignored Ctrl-C until the run ended)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True,
                          timeout=60)
    assert "interrupted after" in done.stdout, done.stderr[-2000:]
