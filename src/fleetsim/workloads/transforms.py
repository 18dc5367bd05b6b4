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


def fit_context(workload: Workload, max_tokens: int, mode: str) -> tuple[Workload, int]:
    """Requests longer than ``max_tokens`` (prompt + output) clipped or dropped; returns the
    new workload and how many requests were changed.

    ``clip`` follows Vidur (``trace_request_length_generator.py``): the excess is taken from
    the prompt and the output in proportion to their lengths (rounded up), keeping at least
    one token of each. ``drop`` removes the requests. Prefix hashes of a clipped prompt are
    cut to the blocks it still covers.
    """
    prompt, output = workload.num_prompt_tokens, workload.num_output_tokens
    total = prompt + output
    over = total > max_tokens
    num = int(over.sum())
    if not num:
        return workload, 0
    if mode == "drop":
        keep = ~over
        idx = np.flatnonzero(keep)
        return dataclasses.replace(
            workload, arrival_s=workload.arrival_s[keep], num_prompt_tokens=prompt[keep],
            num_output_tokens=output[keep],
            hash_ids=None if workload.hash_ids is None else tuple(
                workload.hash_ids[i] for i in idx),
            priority=None if workload.priority is None else workload.priority[keep]), num
    excess = np.maximum(total - max_tokens, 0)
    cut_prompt = np.ceil(excess * prompt / total).astype(np.int64)
    new_prompt = np.maximum(prompt - cut_prompt, 1)
    new_output = np.maximum(np.minimum(output, max_tokens - new_prompt), 1)
    new_prompt = np.minimum(new_prompt, max_tokens - new_output)
    hash_ids = workload.hash_ids
    if hash_ids is not None:
        per = workload.hash_block_tokens
        hash_ids = tuple(h[:-(-int(p) // per)] if o else h for h, p, o in
                         zip(hash_ids, new_prompt, over, strict=True))
    return dataclasses.replace(workload, num_prompt_tokens=new_prompt,
                               num_output_tokens=new_output, hash_ids=hash_ids), num
