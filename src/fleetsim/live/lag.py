"""How far a live process's event loop falls behind real time.

A server or load generator starved of CPU (a busy machine) delivers every token late, and
what it measures then describes the machine, not the serving stack. A task sleeps
``interval_s`` at a time and records by how much each wake-up came late (Node's
``monitorEventLoopDelay`` and uvloop users' loop-lag probes do the same). Samples of the
last ``window_s`` seconds are kept, so a request's row can carry the worst lag seen while it
was in flight (``lag_s``); above ``warn_s`` the process prints a warning, at most once per
``warn_every_s``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Callable

DEFAULT_WARN_S = 0.05
"""Lag that deserves a warning: 50 ms is several decode steps of a small model (~5-10 ms
each), so latencies measured then are visibly the machine's."""


class LagMonitor:
    """Samples the running loop's lag; ``start`` inside the loop, ``stop`` before it ends."""

    def __init__(self, name: str, *, warn_s: float = DEFAULT_WARN_S, interval_s: float = 0.05,
                 window_s: float = 120.0, warn_every_s: float = 10.0,
                 say: Callable[[str], None] | None = None) -> None:
        self.name = name
        self.warn_s = warn_s
        self.interval_s = interval_s
        self.warn_every_s = warn_every_s
        self.samples: deque[tuple[float, float]] = deque(maxlen=max(1, int(window_s /
                                                                        interval_s)))
        """(monotonic time of the wake-up, its lag in seconds), oldest first."""
        self.max_lag_s = 0.0
        self.num_warnings = 0
        self._last_warning = -float("inf")
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self._task: asyncio.Task[None] | None = None
        self._due: float | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            self._due = due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self._due = None
            self.observe(now, max(0.0, now - due))

    def observe(self, now: float, lag_s: float) -> None:
        """Record one sample (the sampling task calls it; tests may too)."""
        self.samples.append((now, lag_s))
        self.max_lag_s = max(self.max_lag_s, lag_s)
        if lag_s > self.warn_s and now - self._last_warning >= self.warn_every_s:
            self._last_warning = now
            self.num_warnings += 1
            self._say(f"fleetsim {self.name}: warning: the event loop ran {1e3 * lag_s:.0f} ms "
                      f"behind real time (threshold {1e3 * self.warn_s:.0f} ms): this machine "
                      f"is short of CPU, and latencies measured now include the wait")

    def lag_since(self, t0: float) -> float:
        """The worst lag sampled since monotonic time ``t0``, the wake-up now overdue
        included (seconds; 0 if none)."""
        worst = 0.0 if self._due is None else max(0.0, time.monotonic() - self._due)
        for t, lag in reversed(self.samples):
            if t < t0:
                break
            worst = max(worst, lag)
        return worst

    def current_s(self) -> float:
        """The latest sample's lag (0 before the first)."""
        return self.samples[-1][1] if self.samples else 0.0
