"""The event kernel: a heap of events ordered by ``(time_s, kind, seq)`` and a dispatch
table (``(time_s, kind, seq, payload)`` tuples in pure Python, ``Event`` objects compiled).

It knows nothing about LLMs. Event kinds are open: a component picks an int for each kind
it handles and registers a handler with ``on(kind, handler, name)``. The int *is* the
same-time priority (smaller first), and ``seq`` (a per-simulator counter) breaks the
remaining ties in push order, so payloads are never compared and runs are deterministic.
The kinds of fleetsim's own components, in same-time order:

    5 controller tick   10 arrival   20 transfer start   25 shared-resource job start
    30 transfer check   33 shared-resource check   35 kept-KV expiry   40 step end
    50 wake-up (an idle replica plans after all same-time inputs)
    60 process resume (``process.py``: a waiting process reads what the engine did)

Time is simulated only.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any, Final

from fleetsim.core.interrupts import let_signals_in

if TYPE_CHECKING:  # (native 64-bit ints when compiled, plain ints at run time)
    from mypy_extensions import i64

# Events between two chances for a signal (Ctrl-C) to stop the compiled loop: about a
# millisecond of work, and a negligible cost.
SIGNAL_CHECK_EVERY: Final = 4096  # (Final: a constant in the compiled loop, not a lookup)

Handler = Callable[[Any], None]


class Event:
    """A pending event in the compiled kernel: ordered as its ``(time_s, kind, seq)`` tuple
    would be, by a compiled ``__lt__`` (a heap of tuples spends most of its compares in the
    tuple's generic item comparisons; the pure-Python kernel keeps tuples, whose comparison is
    C code there)."""

    __slots__ = ("index", "kind", "payload", "seq", "time_s")

    def __init__(self, time_s: float, kind: int, seq: int, payload: Any) -> None:
        self.time_s = time_s
        self.kind = kind
        self.seq = seq
        self.payload = payload
        # Its place in the kernel's heap (-1 once popped): ``Simulator.move_earlier`` moves
        # it up from there.
        self.index: i64 = -1

    def __lt__(self, other: Event) -> bool:
        return _before(self, other)


def _before(a: Event, b: Event) -> bool:
    """``a < b`` as native compares (the heap below calls it directly; ``heapq`` goes
    through the generic rich comparison to reach ``Event.__lt__``)."""
    if a.time_s != b.time_s:
        return a.time_s < b.time_s
    if a.kind != b.kind:
        return a.kind < b.kind
    return a.seq < b.seq


def push_event(events: list[Event], event: Event) -> None:
    """``heapq.heappush`` for the compiled kernel's events, compares native. Keys are
    unique (``seq``), so any correct heap pops the same sequence as ``heapq`` would."""
    events.append(event)
    _rise(events, event, len(events) - 1)


def pop_event(events: list[Event]) -> Event:
    """``heapq.heappop`` for the compiled kernel's events (its algorithm: the hole at the
    root goes down the smaller children to a leaf, the last event fills it and rises)."""
    last = events.pop()
    n: i64 = len(events)
    if n == 0:
        last.index = -1
        return last
    top = events[0]
    top.index = -1
    pos: i64 = 0
    child: i64 = 1
    while child < n:
        right: i64 = child + 1
        if right < n and not _before(events[child], events[right]):
            child = right
        moved = events[child]
        moved.index = pos
        events[pos] = moved
        pos = child
        child = 2 * pos + 1
    _rise(events, last, pos)
    return top


def _rise(events: list[Event], event: Event, pos: i64) -> None:
    """Put ``event`` at ``pos`` (a hole), moving it up past the parents it comes before."""
    while pos > 0:
        parent_pos: i64 = (pos - 1) >> 1
        parent = events[parent_pos]
        if not _before(event, parent):
            break
        parent.index = pos
        events[pos] = parent
        pos = parent_pos
    event.index = pos
    events[pos] = event


class Simulator:
    """A minimal discrete-event loop.

    Components register one handler per event kind with ``on(kind, handler)``, then
    ``schedule`` events. ``run`` pops events in (time, kind, seq) order and calls the handler
    with the payload; ``now_s`` is the time of the event being handled.
    """

    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []  # the pure-Python kernel's
        self._events: list[Event] = []  # the compiled kernel's
        self._compiled = COMPILED
        self._seq = 0  # (a plain counter: ``next`` on an ``itertools.count`` is a generic call)
        self._handlers: dict[int, Handler] = {}
        self.kind_names: dict[int, str] = {}  # kind -> name, for messages and docs
        self.num_events = 0
        # The latest time an event moved earlier (``move_earlier``) had: the event a fresh
        # ``schedule`` would have left behind, doing nothing when it came, still set the time
        # a run ends at (-inf: none pending).
        self._moved_from_s = -math.inf
        # Whether ``move_earlier`` may move an event in place. Off where ``peek_s``'s answer
        # feeds results (a lone replica's windows stop at the next event): the event a fresh
        # schedule leaves behind is part of that answer, and a moved one is not.
        self.move_in_place = True

    def on(self, kind: int, handler: Handler, name: str = "") -> None:
        """Register the handler for ``kind`` (one per kind; ``kind`` is also its same-time
        priority, smaller first)."""
        if kind in self._handlers:
            raise ValueError(f"event kind {kind} ({name or '?'}) is taken by "
                             f"{self.kind_names.get(kind) or 'another handler'}; pick another")
        self._handlers[kind] = handler
        self.kind_names[kind] = name or str(kind)

    def schedule(self, at_s: float, kind: int, payload: Any = None) -> Event | None:
        """Schedule an event at absolute simulated time ``at_s`` (never in the past).
        Returns it where it can be moved (``move_earlier``: the compiled kernel), else None."""
        if at_s < self.now_s:
            raise ValueError(f"cannot schedule at {at_s} s, before now ({self.now_s} s)")
        self._seq += 1
        if self._compiled:
            event = Event(at_s, kind, self._seq, payload)
            push_event(self._events, event)
            return event
        heappush(self._heap, (at_s, kind, self._seq, payload))
        return None

    def move_earlier(self, event: Event | None, at_s: float, kind: int,
                     payload: Any = None) -> Event | None:
        """``schedule(at_s, kind, payload)`` in place of ``event`` (what ``schedule``
        returned, still pending, later than ``at_s``), whose handler would do nothing when
        it came: the compiled kernel moves ``event`` itself to the key the new one would get
        (a window cut back by an arrival left one such event per arrival to pop); the pure
        kernel schedules the new one. The same events run in the same order, and a run ends
        at the same time; only ``peek_s`` no longer sees the original's time, so where its
        answer matters (``move_in_place`` off) the new one is scheduled too."""
        if (event is None or not self.move_in_place or event.index < 0
                or not at_s < event.time_s or at_s < self.now_s):
            return self.schedule(at_s, kind, payload)
        events = self._events
        index = event.index
        if index >= len(events) or events[index] is not event:  # (not this kernel's)
            return self.schedule(at_s, kind, payload)
        if event.time_s > self._moved_from_s:
            self._moved_from_s = event.time_s
        self._seq += 1
        event.time_s = at_s
        event.kind = kind
        event.seq = self._seq
        event.payload = payload
        _rise(events, event, index)  # (an earlier time: its key only got smaller)
        return event

    def peek_s(self) -> float:
        """Time of the next pending event, or +inf when none is pending."""
        if self._compiled:
            return self._events[0].time_s if self._events else math.inf
        return self._heap[0][0] if self._heap else math.inf

    def run(self, until_s: float = math.inf) -> None:
        """Handle events in order until the heap is empty or the next one is after ``until_s``."""
        handlers = self._handlers
        num_events = 0
        if self._compiled:
            events = self._events
            while events and events[0].time_s <= until_s:
                event = pop_event(events)
                self.now_s = event.time_s
                handlers[event.kind](event.payload)
                num_events += 1
                if not num_events % SIGNAL_CHECK_EVERY:
                    let_signals_in()
            moved_from_s = self._moved_from_s
            if -math.inf < moved_from_s <= until_s:
                # The events left behind by ``move_earlier``, up to ``until_s``, would have
                # been popped (doing nothing): the run ends at the latest if it is later.
                self._moved_from_s = -math.inf
                if moved_from_s > self.now_s:
                    self.now_s = moved_from_s
        else:
            heap, pop = self._heap, heappop
            while heap and heap[0][0] <= until_s:
                now_s, kind, _, payload = pop(heap)
                self.now_s = now_s
                handlers[kind](payload)
                num_events += 1
                if not num_events % SIGNAL_CHECK_EVERY:
                    let_signals_in()
        self.num_events += num_events
        if ((self._events or self._heap or self._moved_from_s > -math.inf)
                and until_s < math.inf):
            self.now_s = max(self.now_s, until_s)


# Whether this module runs compiled (``native.py``): a compiled class's methods are not Python
# functions. The two kernels order events alike; each keeps the representation it compares
# fastest.
COMPILED = not isinstance(Simulator.schedule, types.FunctionType)
