"""A wake-up at a monotonic-clock deadline, to within about 0.1 ms, for an asyncio loop.

The loops' own timers work in whole milliseconds: uvloop rounds the delay to ms and compares
it with a loop clock truncated to ms (it fired up to 0.4 ms early and, at p90, 0.6 ms late
here), asyncio's selector rounds its timeout up to the next ms (0.7 ms late at the median),
and an emulated step end left the engine ~1 ms late on average. On Linux the alarm is a
``timerfd`` armed at the absolute deadline on ``CLOCK_MONOTONIC`` (the clock of
``time.monotonic``) and watched by the loop like any socket: the loop's own poll returns when
it expires, with no thread and no extra wake-up (0.11 ms late at the median, 0.14 ms at p90,
measured on a loaded 2-core machine; docs/validation.md). Elsewhere, or with another clock,
it falls back to ``call_at``.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_NONBLOCK, TFD_CLOEXEC = 0o4000, 0o2000000
TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Alarm:
    """One pending deadline at a time; ``set`` replaces it. ``close`` releases it."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._loop = loop
        self._clock = clock
        self._future: asyncio.Future[None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._fd: int | None = None
        self._libc: ctypes.CDLL | None = None
        if sys.platform == "linux" and clock is time.monotonic:
            self._open_timerfd()

    @property
    def precise(self) -> bool:
        """True when a timerfd backs the alarm (else the loop's ms timers)."""
        return self._fd is not None

    def _open_timerfd(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        try:
            self._loop.add_reader(fd, self._on_expiry)
        except (NotImplementedError, OSError):  # a loop that cannot watch it
            os.close(fd)
            return
        self._libc, self._fd = libc, fd

    def set(self, deadline_s: float, future: asyncio.Future[None]) -> None:
        """Resolve ``future`` once ``clock() >= deadline_s``."""
        self._future = future
        if self._fd is None:
            if self._handle is not None:
                self._handle.cancel()
            delay_s = max(0.0, deadline_s - self._clock())
            self._handle = self._loop.call_later(delay_s, self._resolve)
            return
        # An absolute time of zero would disarm the timer; anything in the past fires now.
        deadline_s = max(deadline_s, 1e-9)
        sec = int(deadline_s)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((deadline_s - sec) * 1e9)))
        assert self._libc is not None
        if self._libc.timerfd_settime(self._fd, TFD_TIMER_ABSTIME, ctypes.byref(spec),
                                      None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        fd, self._fd = self._fd, None
        if fd is not None:
            self._loop.remove_reader(fd)
            os.close(fd)
        self._future = None

    def _on_expiry(self) -> None:
        try:
            os.read(self._fd, 8)  # type: ignore[arg-type]
        except BlockingIOError:  # re-armed after it expired: not due yet
            return
        self._resolve()

    def _resolve(self) -> None:
        future, self._future = self._future, None
        if future is not None and not future.done():
            future.set_result(None)
