"""A wake-up at a wall-clock deadline, to within about 0.1 ms, for an asyncio loop.

The loops' own timers round to whole milliseconds (uvloop rounds the delay to ms and compares
it with a loop clock truncated to ms; asyncio's selector rounds its timeout up to the next ms),
so an emulated step end left the engine ~1 ms late on average (0.4-2 ms measured; see
docs/validation.md). Here a thread sleeps on a condition with the deadline as timeout (the
kernel's monotonic timed wait) and wakes the loop through ``call_soon_threadsafe``, which
writes to the loop's self-pipe and so returns its poll at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


class Alarm:
    """One pending deadline at a time; ``set`` replaces it. ``close`` ends the thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = loop
        self._clock = clock
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._future: asyncio.Future[None] | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fleetsim alarm", daemon=True)
        self._thread.start()

    def set(self, deadline_s: float, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` (on the loop) once ``clock() >= deadline_s``."""
        with self._cond:
            self._deadline, self._future = deadline_s, future
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(5.0)

    def _run(self) -> None:
        cond = self._cond
        with cond:
            while not self._closed:
                if self._deadline is None:
                    cond.wait()
                    continue
                left_s = self._deadline - self._clock()
                if left_s > 0:
                    cond.wait(left_s)
                    continue
                future, self._deadline, self._future = self._future, None, None
                if future is not None:
                    try:
                        self._loop.call_soon_threadsafe(_resolve, future)
                    except RuntimeError:  # the loop closed meanwhile: nobody waits
                        return


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
