"""SimPy-style processes on fleetsim's event kernel (STYLE.md section 9): orchestration that
happens rarely (an RL stage, a controller, a program DAG) reads as a story, ``yield
timeout(d)`` and ``yield event``, while the serving engine's hot path stays as it is. A few
events per stage, never per token. Like the kernel, it knows nothing about LLMs.

A process is a generator. It yields a ``Timeout`` (resume after that many seconds) or an
``Event`` (resume when it fires; at once if it already has). ``all_of`` waits for several.
Resumptions go through the kernel as events of kind ``PROCESS_RESUME`` (60, after every
engine kind at the same time, so a generation that finishes at t is fully recorded before the
process that waited for it reads it).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any, Final

from fleetsim.core.simulator import Simulator

PROCESS_RESUME: Final = 60

Process = Generator[Any, Any, None]


@dataclass(frozen=True, slots=True)
class Timeout:
    delay_s: float


class Event:
    """Fires once (``succeed``); processes waiting on it resume then."""

    __slots__ = ("_waiters", "fired", "kernel", "value")

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.fired = False
        self.value: Any = None
        self._waiters: list[Process] = []

    def succeed(self, value: Any = None) -> None:
        if self.fired:
            raise RuntimeError("an event fires once")
        self.fired, self.value = True, value
        for proc in self._waiters:
            self.kernel.resume(proc, value)
        self._waiters.clear()

    def wait(self, proc: Process) -> None:
        if self.fired:
            self.kernel.resume(proc, self.value)
        else:
            self._waiters.append(proc)


class Kernel:
    """Runs processes on ``sim``."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        sim.on(PROCESS_RESUME, self._on_resume, "process")

    def start(self, proc: Process) -> None:
        self.resume(proc, None)

    def event(self) -> Event:
        return Event(self)

    def all_of(self, events: Iterable[Event]) -> Event:
        """An event that fires when every one of ``events`` has."""
        events = list(events)
        done = self.event()
        left = [len(events)]
        if not events:
            done.succeed()
            return done

        def one() -> None:
            left[0] -= 1
            if left[0] == 0:
                done.succeed()

        for ev in events:
            if ev.fired:
                left[0] -= 1
            else:
                ev._waiters.append(_Callback(one))  # type: ignore[arg-type]
        if left[0] == 0 and not done.fired:
            done.succeed()
        return done

    def resume(self, proc: Process, value: Any, delay_s: float = 0.0) -> None:
        self.sim.schedule(self.sim.now_s + delay_s, PROCESS_RESUME, (proc, value))

    def _on_resume(self, payload: tuple[Process, Any]) -> None:
        proc, value = payload
        if isinstance(proc, _Callback):
            proc.fn()
            return
        try:
            command = proc.send(value)
        except StopIteration:
            return
        if isinstance(command, Timeout):
            if not command.delay_s >= 0:
                raise ValueError(f"timeout must be >= 0 s, got {command.delay_s}")
            self.resume(proc, None, command.delay_s)
        elif isinstance(command, Event):
            command.wait(proc)
        else:
            raise TypeError(f"a process yields Timeout or Event, got {command!r}")


class _Callback:
    """A waiter that runs a function instead of resuming a generator (``all_of``)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any) -> None:
        self.fn = fn
