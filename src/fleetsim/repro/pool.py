"""An entry's independent sub-simulations (sweep points, stage-balancing probes, ablations)
over the cores that are free, so that one long entry does not keep ``fleetsim repro all`` on
one core while the others sit idle.

``SubRuns.map(fn, items)`` returns ``[fn(item) for item in items]``, in order, computed in
helper processes. A reproduction run alone (``fleetsim repro NAME --workers N``) has ``N``
slots. Under ``fleetsim repro all`` every entry already holds one core of the entry pool, so
an entry has one slot (its own core, lent to a helper while it waits) plus the cores the
driver finds idle: when fewer entries are left than workers, the driver releases one
``CoreTokens`` token per idle worker, an entry takes tokens while it has items to start and
gives each back when that item is done, so the cores end up with whichever entry still has
work. Every item is a whole simulation with its own seed, so where it runs never changes
its result; the caller keeps its bookkeeping (progress, kept runs) in item order.

The helper processes live as long as the ``SubRuns`` (``close``, or a ``with`` block): an
entry maps many small rounds (LoongServe: 22 rate sweeps of 2-5 runs), and a fresh pool per
round started fresh processes that imported fleetsim again each time (``repro loongserve``
with 2 workers cost 28.6 s of CPU against 9.2 s in one process). A process that took part in
one round keeps its imports and its exact caches for the next.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

POLL_S = 0.5  # how often a waiting entry looks for cores another entry has given back


class CoreTokens:
    """Idle cores of the entry pool, shared by every entry of one ``repro all`` (a manager's
    semaphore, so it can travel inside a task). Tokens are only ever added by the driver, for
    workers that found no entry left to start, and taken and given back by entries."""

    def __init__(self, semaphore: Any) -> None:
        self._semaphore = semaphore

    def take(self) -> bool:
        """One idle core, if any (never waits)."""
        return bool(self._semaphore.acquire(False))

    def give(self, num: int = 1) -> None:
        for _ in range(num):
            self._semaphore.release()


def idle_workers(num_workers: int, num_entries: int, num_done: int) -> int:
    """Workers of the entry pool with no entry to run once ``num_done`` of ``num_entries``
    have finished (the pool starts entries in order, one per free worker)."""
    return max(0, num_workers - (num_entries - num_done))


class SubRuns:
    """Where an entry's sub-simulations run: ``slots`` helper processes of its own, plus
    ``tokens`` borrowed while it has items to start (None: none to borrow)."""

    def __init__(self, slots: int = 1, tokens: CoreTokens | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.tokens = tokens
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> SubRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the helper processes (they are started again if ``map`` is called)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        """The helper processes, started as items need them (never more than run at once:
        the slots plus every core that could be borrowed)."""
        if self._pool is None:
            context = multiprocessing.get_context(
                "forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                else "spawn")
            most = self.slots + ((os.cpu_count() or 1) if self.tokens is not None else 0)
            self._pool = ProcessPoolExecutor(max_workers=most, mp_context=context)
        return self._pool

    @property
    def parallel(self) -> bool:
        return self.slots > 1 or self.tokens is not None

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(item) for item in items]``; ``fn`` a module-level function (it is pickled)
        whose result pickles. An exception in ``fn`` is raised here."""
        if not self.parallel or len(items) <= 1:
            return [fn(item) for item in items]
        pool = self._executor()
        results: dict[int, R] = {}
        borrowed = 0
        running: dict[Future[R], int] = {}
        try:
            nxt = 0
            while nxt < len(items) or running:
                while nxt < len(items) and (
                        len(running) < self.slots + borrowed or self._borrow()):
                    if len(running) >= self.slots + borrowed:
                        borrowed += 1
                    running[pool.submit(fn, items[nxt])] = nxt
                    nxt += 1
                done, _ = wait(running, timeout=POLL_S if nxt < len(items) else None,
                               return_when=FIRST_COMPLETED)
                for future in done:
                    results[running.pop(future)] = future.result()
                # Nothing left to start: give back the cores the running items leave.
                spare = min(borrowed, self.slots + borrowed - len(running))
                if nxt == len(items) and spare > 0 and self.tokens is not None:
                    self.tokens.give(spare)
                    borrowed -= spare
        except BaseException:
            # An item failed (or we were interrupted): the other items' work is wasted, and
            # the processes may be broken; the next ``map`` starts fresh ones.
            self.close()
            raise
        finally:
            if borrowed and self.tokens is not None:
                self.tokens.give(borrowed)
        return [results[i] for i in range(len(items))]

    def _borrow(self) -> bool:
        return self.tokens is not None and self.tokens.take()
