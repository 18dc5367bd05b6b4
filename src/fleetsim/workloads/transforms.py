"""Workload transformations: rate scaling, time slicing and truncation. Each returns a new Workload.

Rows are sorted by arrival, so slicing by time is a ``searchsorted`` and a contiguous view.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from fleetsim.workloads.workload import Workload


def scale_rate(workload: Workload, factor: float) -> Workload:
    """Multiply the arrival rate by ``factor``: every arrival time (and gap) is divided by it.

    ``factor = 2`` replays the trace twice as fast (half the span, same requests).
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate scale factor must be a finite number > 0, got {factor}")
    if factor == 1.0:
        return workload
    return dataclasses.replace(workload, arrival_s=workload.arrival_s / factor)


def time_slice(
    workload: Workload, start_s: float = 0.0, duration_s: float | None = None
) -> Workload:
    """Requests arriving in ``[start_s, start_s + duration_s)``, with times shifted by ``-start_s``.

    ``duration_s = None`` keeps everything from ``start_s`` on. The gap between ``start_s`` and
    the first kept arrival is preserved.
    """
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be a finite number >= 0, got {start_s}")
    if duration_s is not None and not duration_s > 0:
        raise ValueError(f"duration_s must be > 0 or None, got {duration_s}")
    if start_s == 0.0 and duration_s is None:
        return workload
    lo = int(np.searchsorted(workload.arrival_s, start_s, side="left"))
    hi = len(workload)
    if duration_s is not None:
        hi = int(np.searchsorted(workload.arrival_s, start_s + duration_s, side="left"))
    return _take(workload, lo, hi, shift_s=start_s)


def head(workload: Workload, max_requests: int | None) -> Workload:
    """The first ``max_requests`` requests (all of them for None)."""
    if max_requests is None or max_requests >= len(workload):
        return workload
    if max_requests < 0:
        raise ValueError(f"max_requests must be >= 0 or None, got {max_requests}")
    return _take(workload, 0, max_requests, shift_s=0.0)


def _take(workload: Workload, lo: int, hi: int, *, shift_s: float) -> Workload:
    arrival_s = workload.arrival_s[lo:hi]
    return dataclasses.replace(
        workload,
        arrival_s=arrival_s - shift_s if shift_s else arrival_s,
        num_prompt_tokens=workload.num_prompt_tokens[lo:hi],
        num_output_tokens=workload.num_output_tokens[lo:hi],
        hash_ids=None if workload.hash_ids is None else workload.hash_ids[lo:hi],
        priority=None if workload.priority is None else workload.priority[lo:hi],
    )
