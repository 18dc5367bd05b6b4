"""The compiled kernel keeps its pending events as ``Event`` objects in its own heap
(``push_event``/``pop_event``), the pure-Python one as ``(time_s, kind, seq, payload)``
tuples in ``heapq``'s: both must pop in the same order."""

from __future__ import annotations

import heapq
import math

import pytest
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


def _observed(ops, move: bool, objects: bool) -> list[object]:
    """Run ``ops`` on a simulator and note what can be observed: ``("at", t, key)``
    schedules key's event at now + t, ``("earlier", t, key)`` moves key's pending event to
    now + t when that is earlier (``move_earlier``, or, ``move`` false, a fresh ``schedule``
    whose original then does nothing when it comes, as a cut window's old end does),
    ``("run", t, _)`` runs to now + t. Returns the handlers' (time, kind, key) and the time
    after every run. ``objects``: the kernel keeps ``Event`` objects in its own heap (as
    compiled; its code runs interpreted too), else tuples in ``heapq``'s."""
    sim = Simulator()
    sim._compiled = objects
    pending: dict[int, tuple[object, float, int]] = {}  # key -> (handle, time, version)
    seen: list[object] = []
    version = 0

    def handler(kind):
        def handle(payload):
            key, v = payload
            if key in pending and pending[key][2] == v:  # (an old one does nothing)
                del pending[key]
                seen.append(("ran", sim.now_s, kind, key))
        return handle

    for kind in (10, 40):
        sim.on(kind, handler(kind))
    for op, t, key in ops:
        if op == "run":
            sim.run(sim.now_s + t)
            seen.append(("run", sim.now_s))
            continue
        kind = 40 if key % 2 else 10
        at_s = sim.now_s + t
        version += 1
        if op == "at" and key not in pending:
            pending[key] = (sim.schedule(at_s, kind, (key, version)), at_s, version)
        elif op == "earlier" and key in pending and at_s < pending[key][1]:
            handle = pending[key][0]
            new = (sim.move_earlier(handle, at_s, kind, (key, version)) if move
                   else sim.schedule(at_s, kind, (key, version)))
            pending[key] = (new, at_s, version)
    sim.run()
    seen.append(("end", sim.now_s))
    return seen


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["at", "at", "earlier", "earlier", "run"]),
                          st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0]), st.integers(0, 7)),
                max_size=60))
def test_an_event_moved_earlier_runs_as_a_fresh_one_would(ops):
    """``move_earlier`` (a window cut back by an arrival moves its end event up) runs the
    same events at the same times in the same order as a fresh ``schedule`` whose original
    is left to do nothing, and every run ends at the same time."""
    want = _observed(ops, move=False, objects=False)
    assert _observed(ops, move=True, objects=True) == want
    assert _observed(ops, move=False, objects=True) == want


@pytest.mark.parametrize("objects", [True, False])
def test_the_object_kernel_moves_the_event_itself(objects):
    """The object heap (the compiled kernel's) moves the event ``schedule`` returned, no
    second event; the tuple heap schedules a second. Either way a run ends where it did."""
    sim = Simulator()
    sim._compiled = objects
    sim.on(40, lambda p: None)
    first = sim.schedule(2.0, 40, "a")
    moved = sim.move_earlier(first, 1.0, 40, "a")
    if objects:
        assert moved is first and len(sim._events) == 1 and sim.peek_s() == 1.0
    else:
        assert first is None and moved is None and sim.peek_s() == 1.0
        assert len(sim._heap) == 2  # (the original is left to do nothing)
    sim.run(1.5)
    assert sim.now_s == 1.5  # (the original, at 2.0, still counts as pending)
    sim.run()
    assert sim.now_s == 2.0 and sim.peek_s() == math.inf


def test_with_moving_off_the_original_stays_for_peek():
    """Where ``peek_s``'s answer feeds results (``move_in_place`` off: a lone replica, whose
    windows stop at the next event), the object kernel schedules anew too, so the
    original, left to do nothing, is still the next event after the new one."""
    sim = Simulator()
    sim._compiled = True
    sim.move_in_place = False
    sim.on(40, lambda p: None)
    first = sim.schedule(2.0, 40, "a")
    moved = sim.move_earlier(first, 1.0, 40, "a")
    assert moved is not first and len(sim._events) == 2
    sim.run(1.5)
    assert sim.peek_s() == 2.0
