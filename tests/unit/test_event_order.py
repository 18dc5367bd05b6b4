"""The compiled kernel keeps its pending events as ``Event`` objects in its own heap
(``push_event``/``pop_event``), the pure-Python one as ``(time_s, kind, seq, payload)``
tuples in ``heapq``'s: both must pop in the same order."""

from __future__ import annotations

import heapq
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim import native
from fleetsim.core import simulator
from fleetsim.core.simulator import Event, Simulator, pop_event, push_event

TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.0 + 2**-52, 3.25, math.inf])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(TIMES, st.sampled_from([5, 10, 40, 50])), min_size=1, max_size=40))
def test_events_pop_in_tuple_order(entries):
    tuples = [(t, kind, seq, seq) for seq, (t, kind) in enumerate(entries)]
    events = [Event(t, kind, seq, payload) for t, kind, seq, payload in tuples]
    heapq.heapify(tuples)
    heapq.heapify(events)
    popped = [heapq.heappop(events) for _ in range(len(events))]
    assert [(e.time_s, e.kind, e.seq, e.payload) for e in popped] == [
        heapq.heappop(tuples) for _ in range(len(tuples))]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.tuples(TIMES, st.sampled_from([5, 10, 40, 50])), st.none()),
                max_size=80))
def test_the_kernels_heap_pops_as_heapq(ops):
    """Pushes (a time and a kind) and pops (None) interleaved: ``pop_event`` returns what
    ``heapq.heappop`` returns from the same pushes as tuples, and the heaps stay the same
    size."""
    tuples: list[tuple[float, int, int, int]] = []
    events: list[Event] = []
    for seq, op in enumerate(ops):
        if op is None:
            if tuples:
                e = pop_event(events)
                assert (e.time_s, e.kind, e.seq, e.payload) == heapq.heappop(tuples)
            continue
        t, kind = op
        heapq.heappush(tuples, (t, kind, seq, -seq))
        push_event(events, Event(t, kind, seq, -seq))
        assert len(events) == len(tuples)
    while tuples:
        e = pop_event(events)
        assert (e.time_s, e.kind, e.seq, e.payload) == heapq.heappop(tuples)
    assert events == []


def test_kernel_kind_matches_the_build():
    """Events as objects exactly when the kernel runs compiled."""
    assert (native.engine() == "mypyc") == simulator.COMPILED


def test_same_time_events_run_by_kind_then_push_order():
    sim = Simulator()
    seen: list[tuple[float, str]] = []
    sim.on(40, lambda p: seen.append((sim.now_s, p)), "end")
    sim.on(10, lambda p: seen.append((sim.now_s, p)), "arrival")
    for at_s, kind, name in [(2.0, 40, "e1"), (1.0, 40, "e0"), (2.0, 10, "a1"),
                             (2.0, 40, "e2"), (2.0, 10, "a2")]:
        sim.schedule(at_s, kind, name)
    assert sim.peek_s() == 1.0
    sim.run(until_s=1.5)
    assert seen == [(1.0, "e0")] and sim.now_s == 1.5
    sim.run()
    assert seen == [(1.0, "e0"), (2.0, "a1"), (2.0, "a2"), (2.0, "e1"), (2.0, "e2")]
    assert sim.peek_s() == math.inf
