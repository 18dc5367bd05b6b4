"""Run the points of a sweep (or any independent tasks, ``run_tasks``): in this process, in
local worker processes, or as Ray tasks.

Every backend calls the same pure ``run_point`` and gets back the same ``PointResult``, so
a point's results do not depend on where it ran (each point's config carries its seed).
A point that raises is returned as a failed result with its message; it never stops the
others. Files are written by the caller, on the machine that drives the sweep.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from fleetsim.errors import FleetsimInputError
from fleetsim.sweep.spec import Point

BACKENDS = ("inline", "process", "ray")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True, eq=False)
class PointResult:
    """What one point produced; ``summary`` is None when it failed."""

    index: int
    values: dict[str, Any]
    status: str
    """ok | failed."""
    error: str | None = None
    """One-line message of a failed point."""
    traceback: str | None = None
    """Full traceback of an unexpected exception (None for bad input)."""
    summary: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None
    """Per-request columns (numpy arrays) as ``RunResult.records.requests``."""


def run_point(point: Point) -> PointResult:
    """Build the point's config, run it, catch everything: never raises."""
    from fleetsim.config import config_from_dict
    from fleetsim.run import run

    values = dict(point.values)
    try:
        config = config_from_dict(point.config_data)
        result = run(config)
    except FleetsimInputError as err:
        return PointResult(index=point.index, values=values, status="failed", error=str(err))
    except Exception as err:  # noqa: BLE001 - a failed point is reported, not raised
        return PointResult(index=point.index, values=values, status="failed",
                           error=f"{type(err).__name__}: {err}",
                           traceback=traceback.format_exc())
    return PointResult(index=point.index, values=values, status="ok", summary=result.summary,
                       config=result.config, requests=dict(result.records.requests))


def run_points(
    points: Sequence[Point], *, backend: str = "process", workers: int | None = None,
    ray_address: str | None = None,
) -> Iterator[PointResult]:
    """Yield each point's result as it finishes (completion order, not index order)."""
    yield from run_tasks(run_point, points, backend=backend, workers=workers,
                         ray_address=ray_address, on_worker_failure=_failed_point)


def run_tasks(
    fn: Callable[[T], R], items: Sequence[T], *, backend: str = "process",
    workers: int | None = None, ray_address: str | None = None,
    on_worker_failure: Callable[[T, str], R], preload: Sequence[str] = (),
) -> Iterator[R]:
    """Yield ``fn(item)`` for each item as it finishes (completion order), in this process,
    in local worker processes or as Ray tasks. ``fn`` is a module-level function that never
    raises; a worker that dies (killed, out of memory) gives ``on_worker_failure(item,
    message)`` instead. ``preload``: modules the fork server imports once for every worker."""
    if backend not in BACKENDS:
        raise FleetsimInputError("backend", backend, f"use one of {', '.join(BACKENDS)}")
    if not items:
        return
    if backend == "inline":
        yield from map(fn, items)
    elif backend == "process":
        yield from _run_in_processes(fn, items, workers or os.cpu_count() or 1,
                                     on_worker_failure, preload)
    else:
        yield from _run_on_ray(fn, items, ray_address or "local", workers, on_worker_failure)


def _run_in_processes(fn: Callable[[T], R], items: Sequence[T], workers: int,
                      on_failure: Callable[[T, str], R], preload: Sequence[str]
                      ) -> Iterator[R]:
    # forkserver/spawn: a fresh interpreter per worker, never a fork of a process that may
    # hold threads (rich's progress refresher, Ray); forkserver starts workers faster.
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if context.get_start_method() == "forkserver":
        # Import the simulator once in the fork server, not once per worker (~0.5 s each).
        context.set_forkserver_preload(["fleetsim.run", "fleetsim.sweep.runner", *preload])
    pool = ProcessPoolExecutor(max_workers=min(workers, len(items)), mp_context=context)
    try:
        futures: dict[Future[R], T] = {pool.submit(fn, item): item for item in items}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield _result_of(future.result, futures[future], on_failure)
    finally:  # on Ctrl-C, drop the items not started instead of running them all first
        pool.shutdown(wait=True, cancel_futures=True)


def _run_on_ray(fn: Callable[[T], R], items: Sequence[T], address: str, workers: int | None,
                on_failure: Callable[[T, str], R]) -> Iterator[R]:
    ray = import_ray()
    started_here = False
    if not ray.is_initialized():
        try:
            if address == "local":
                ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise FleetsimInputError("--ray", address,
                                     f"could not connect ({err}); use 'local', 'auto' or "
                                     f"ray://HOST:PORT of a running cluster") from None
        started_here = True
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = {task.remote(item): item for item in items}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield _result_of(partial(ray.get, ref), refs[ref], on_failure)
    finally:
        if started_here:
            ray.shutdown()


def _result_of(get: Callable[[], R], item: T, on_failure: Callable[[T, str], R]) -> R:
    # fn never raises; this catches the worker itself dying (killed, out of memory).
    try:
        return get()
    except Exception as err:  # noqa: BLE001
        return on_failure(item, f"worker failed: {type(err).__name__}: {err}")


def _failed_point(point: Point, message: str) -> PointResult:
    return PointResult(index=point.index, values=dict(point.values), status="failed",
                       error=message)


def import_ray() -> Any:
    """Ray, or a one-line error saying how to install it (it is an optional extra)."""
    try:
        import ray
    except ImportError:
        raise FleetsimInputError("--ray", "ray is not installed",
                                 "pip install 'fleetsim[ray]' (or run without --ray)") from None
    return ray
