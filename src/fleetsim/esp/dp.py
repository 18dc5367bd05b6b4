"""LoongServe's prefill batching: split new requests into batches and give each a degree of
parallelism (DoP), by dynamic programming.

As the public scheduler (``longserve_c_scheduler/src/main.cpp``, ``minimize_prefill_iteration_
time``, called from ``router/manager.py::_schedule_new_req_list``): requests are sorted longest
first and cut into consecutive batches; instances are sorted by used KV (least first) and cut
into consecutive groups, one group per batch. Batch ``j`` on ``k_j`` instances takes
``T_kj(batch) = A_k + B_k*sum(l) + C_k*sum(l^2)`` (the analytical model), and the plan
minimises ``sum_j T_kj(batch_j) * sum_{r in batch_j} 1/l_r``: the summed per-input-token
latency. A batch's input tokens must fit the free KV slots of its instances.

The DP state is (requests served, instances used). The C++ code also prunes the choices with
the previous state's best ones (a heuristic that can miss the optimum); this one is exhaustive
(vectorised over the last batch's size), so it returns the true optimum, which the tests check
against brute force.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

Predictor = Callable[[int, float, float], float]
"""(k instances, sum of input lengths, sum of squared input lengths) -> seconds."""
# Up to this many requests the DP runs in plain floats (the same plan to the bit): about
# n^2 K^2 / 4 float steps against numpy's n K^2 / 2 vectorised rows of a few calls each.
# Interpreted it stays at 6, where it was first measured; compiled (``make native``: this
# module is then an extension, not a ``.py``) the plain loops win at every size measured
# (4 instances: 27 against 619 us a plan at 8 requests, 1.2 against 6.5 ms at 64).
SCALAR_MAX_REQUESTS = 6 if __file__.endswith(".py") else 1 << 30


@dataclass(frozen=True, slots=True)
class PrefillBatch:
    """One batch of the plan: indices into the caller's request list and instance list."""

    requests: tuple[int, ...]
    instances: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    batches: tuple[PrefillBatch, ...]
    objective_s: float
    """sum over batches of T(batch) * sum(1/l): the DP's minimised value."""


def plan_prefill(lengths: Sequence[int], free_tokens: Sequence[int], predict: Predictor,
                 coefficients: Sequence[tuple[float, float, float]] | None = None
                 ) -> PrefillPlan | None:
    """The optimal plan for requests of input ``lengths`` on instances with ``free_tokens``
    slots each, in the order given (the caller sorts them as LoongServe does); None when the
    requests do not fit. ``coefficients``: ``predict``'s, as ``coefficients_of(predict,
    max_k)`` gives them, for at least ``len(free_tokens)`` instances (a caller that plans
    often with one predictor reads them once: three calls of it per instance count a plan
    otherwise)."""
    n, num_inst = len(lengths), len(free_tokens)
    if n == 0 or num_inst == 0 or sum(lengths) > sum(free_tokens):
        return None
    coef = (list(coefficients[:num_inst + 1]) if coefficients is not None
            else coefficients_of(predict, num_inst))
    if len(coef) != num_inst + 1:
        raise ValueError(f"coefficients for {len(coef) - 1} instances, the plan has {num_inst}")
    if n <= SCALAR_MAX_REQUESTS:
        return _plan_prefill_scalar(lengths, free_tokens, coef)
    lens = np.asarray(lengths, dtype=np.float64)
    p1 = np.concatenate(([0.0], np.cumsum(lens)))
    p2 = np.concatenate(([0.0], np.cumsum(lens * lens)))
    pinv = np.concatenate(([0.0], np.cumsum(1.0 / lens)))
    cap = np.concatenate(([0], np.cumsum(np.asarray(free_tokens, dtype=np.int64))))
    best = np.full((n + 1, num_inst + 1), math.inf)
    best[0, 0] = 0.0
    choice = np.zeros((n + 1, num_inst + 1, 2), dtype=np.int64)  # (last batch size, its DoP)
    for i in range(1, n + 1):
        starts = np.arange(i - 1, -1, -1)  # batch of size b = i - start, b = 1..i
        s1, s2, sinv = p1[i] - p1[starts], p2[i] - p2[starts], pinv[i] - pinv[starts]
        for j in range(1, num_inst + 1):
            for k in range(1, j + 1):
                a, b, c = coef[k]
                cost = (a + b * s1 + c * s2) * sinv + best[starts, j - k]
                cost[s1 > cap[j] - cap[j - k]] = math.inf
                at = int(np.argmin(cost))
                if cost[at] < best[i, j]:
                    best[i, j] = cost[at]
                    choice[i, j] = (at + 1, k)
    j_best = int(np.argmin(best[n, 1:])) + 1
    if not math.isfinite(best[n, j_best]):
        return None
    batches: list[PrefillBatch] = []
    i, j = n, j_best
    while i > 0:
        size, k = (int(x) for x in choice[i, j])
        batches.append(PrefillBatch(requests=tuple(range(i - size, i)),
                                    instances=tuple(range(j - k, j))))
        i, j = i - size, j - k
    return PrefillPlan(batches=tuple(reversed(batches)), objective_s=float(best[n, j_best]))


def _plan_prefill_scalar(lengths: Sequence[int], free_tokens: Sequence[int],
                         coef: list[tuple[float, float, float]]) -> PrefillPlan | None:
    """``plan_prefill`` in plain floats, for a few requests (numpy's per-call cost dominates
    there): the same operations in the same order (prefix sums added left to right, each
    cost ``(a + b*s1 + c*s2) * sinv + best``, the first minimum kept), so the same plan and
    objective to the last bit."""
    n, num_inst = len(lengths), len(free_tokens)
    p1, p2, pinv = [0.0], [0.0], [0.0]
    for x in lengths:
        f = float(x)
        p1.append(p1[-1] + f)
        p2.append(p2[-1] + f * f)
        pinv.append(pinv[-1] + 1.0 / f)
    cap = [0]
    for free in free_tokens:
        cap.append(cap[-1] + int(free))
    inf = math.inf
    best = [[inf] * (num_inst + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    choice = [[(0, 0)] * (num_inst + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        row = best[i]
        # (the prefix sums at ``i`` read once: compiled, each read of a list of floats
        # unboxes one, and the loop below runs n^2 K^2 / 4 times)
        p1_i, p2_i, pinv_i = p1[i], p2[i], pinv[i]
        for j in range(1, num_inst + 1):
            for k in range(1, j + 1):
                a, b, c = coef[k]
                room = cap[j] - cap[j - k]
                low, at = inf, 0
                for size in range(1, i + 1):  # the batch of the last ``size`` requests
                    start = i - size
                    s1 = p1_i - p1[start]
                    if s1 > room:
                        cost = inf
                    else:
                        cost = ((a + b * s1 + c * (p2_i - p2[start])) * (pinv_i - pinv[start])
                                + best[start][j - k])
                    if cost < low or size == 1:
                        low, at = cost, size
                if low < row[j]:
                    row[j] = low
                    choice[i][j] = (at, k)
    last = best[n]
    j_best = 1  # the fewest instances among the best (a loop: ``min`` with a key is generic)
    for j in range(2, num_inst + 1):
        if last[j] < last[j_best]:
            j_best = j
    if not math.isfinite(last[j_best]):
        return None
    batches: list[PrefillBatch] = []
    i, j = n, j_best
    while i > 0:
        size, k = choice[i][j]
        batches.append(PrefillBatch(requests=tuple(range(i - size, i)),
                                    instances=tuple(range(j - k, j))))
        i, j = i - size, j - k
    return PrefillPlan(batches=tuple(reversed(batches)), objective_s=float(last[j_best]))


def plan_objective(lengths: Sequence[int], plan: Sequence[PrefillBatch], predict: Predictor
                   ) -> float:
    """The DP's objective for any plan (used to check it)."""
    total = 0.0
    for batch in plan:
        ls = [lengths[r] for r in batch.requests]
        t = predict(len(batch.instances), float(sum(ls)), float(sum(x * x for x in ls)))
        total += t * sum(1.0 / x for x in ls)
    return total


def coefficients_of(predict: Predictor, max_k: int) -> list[tuple[float, float, float]]:
    """``predict``'s (A, B, C) at each ``k`` in ``0..max_k`` (``plan_prefill``'s
    ``coefficients``; k = 0 is no instance: infinite)."""
    return [_coefficients(predict, k) for k in range(max_k + 1)]


def _coefficients(predict: Predictor, k: int) -> tuple[float, float, float]:
    """(A, B, C) of ``predict`` at ``k``, read back from three evaluations (it is affine in
    sum(l) and sum(l^2)), so the DP can vectorise over batch sizes."""
    if k == 0:
        return (math.inf, 0.0, 0.0)
    a = predict(k, 0.0, 0.0)
    return a, predict(k, 1.0, 0.0) - a, predict(k, 0.0, 1.0) - a
