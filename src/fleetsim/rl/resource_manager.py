"""Heddle's trajectory-adaptive resource manager (arXiv 2603.28101, "how"): split the rollout's
GPU budget into workers of different model parallelism (high TP for the long-tail
trajectories, whose per-token time it lowers; low TP for the short ones, whose throughput it
raises), searched by simulated annealing initialised from the sorted assignment
(from secondary summaries of the paper, whose body could not be read; the move set, the
schedule and the score below are our reconstruction).

A *split* is the workers' TPs, highest first; every TP is a power of two within a node
(``NODE_GPUS``) that the model fits at, and they sum to the budget. Its GPUs are handed out
in that order, consecutively, so every worker sits inside one node (sizes that are powers of
two taken largest first never straddle a node boundary) and every GPU is used exactly once
(``gpu_ids``). The trajectories, sorted by predicted length, are grouped onto the workers in
that order by the placement's DP (``rl.trajectory_placement``): the longest groups go to the
highest-TP workers. A split's score is that DP's cost, the predicted time of the slowest
worker under the engine's own step model per TP: the same cost the placement uses, never a
simulation.

The search starts at the sorted assignment at the entry's homogeneous TP (the fixed-MP
system) and walks by two moves that keep the budget: split a worker of TP ``t`` into two of
``t/2``, or merge two workers of TP ``t`` into one of ``2t``. A worse neighbour is accepted
with probability ``exp(-(worse - now) / temperature)``, the temperature falling geometrically
from ``INITIAL_TEMPERATURE`` of the start's cost to a thousandth of it; the best split seen
is returned, so it is never worse than the start. The random stream is the caller's (seeded):
same seed, same split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.rl.trajectory_placement import (
    dp_last_cost,
    dp_min_max,
    dp_start,
    group_cost_matrix,
)

NODE_GPUS = 8
"""GPUs per node (H100 HGX): the largest TP a worker may have (TP stays on NVLink)."""
TP_CHOICES = (1, 2, 4, 8)
INITIAL_TEMPERATURE = 0.05
"""Start temperature as a share of the start's cost (ours: a 5% worse split is taken with
probability 1/e at first)."""
FINAL_TEMPERATURE_SHARE = 1e-3
"""Last temperature as a share of the first."""


@dataclass(frozen=True, slots=True)
class WorkerKind:
    """What the DP needs of a worker of one TP: seconds per token at ``b`` decoding
    trajectories and the most it decodes at once."""

    tp: int
    per_token_s: Callable[[int], float]
    max_live: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """The resource manager's answer."""

    split: tuple[int, ...]
    """Each worker's TP, highest first."""
    cost_s: float
    """The split's DP cost (predicted slowest worker, seconds)."""
    start: tuple[int, ...]
    start_cost_s: float
    num_evaluated: int
    """Distinct splits scored."""
    num_accepted: int
    """Moves the annealing took (better or worse)."""
    ranked: tuple[tuple[tuple[int, ...], float], ...] = ()
    """Every split scored, with its DP cost, best first (the replay's shortlist)."""


def gpu_ids(split: Sequence[int]) -> list[list[int]]:
    """The GPUs of each worker of ``split`` (highest TP first: consecutive, node-aligned)."""
    out, start = [], 0
    for tp in split:
        out.append(list(range(start, start + tp)))
        start += tp
    return out


def check_split(split: Sequence[int], budget: int, allowed: Sequence[int]) -> None:
    """Raise ValueError unless ``split`` uses ``budget`` GPUs in workers of ``allowed`` TPs,
    highest first."""
    if sum(split) != budget:
        raise ValueError(f"split {list(split)} uses {sum(split)} GPUs, not the budget {budget}")
    if any(tp not in allowed for tp in split):
        raise ValueError(f"split {list(split)} has a TP outside {list(allowed)}")
    if list(split) != sorted(split, reverse=True):
        raise ValueError(f"split {list(split)} is not ordered highest TP first")


class SplitScorer:
    """Scores splits by the placement DP on the sorted predictions (cached per split). The
    DP goes worker by worker in split order, so its row after a split's first workers is
    kept per prefix and shared by every split that starts with them."""

    def __init__(self, lengths_desc: Sequence[float], kinds: dict[int, WorkerKind]) -> None:
        self.kinds = kinds
        self._matrices = {tp: group_cost_matrix(lengths_desc, k.per_token_s, k.max_live)
                          for tp, k in kinds.items()}
        self._cache: dict[tuple[int, ...], float] = {}
        self._rows: dict[tuple[int, ...], NDArray[np.float64]] = {
            (): dp_start(len(lengths_desc))}  # split prefix -> the DP's row after it

    def ranked(self) -> tuple[tuple[tuple[int, ...], float], ...]:
        """Every split scored so far with its cost, cheapest first (ties: highest TPs)."""
        return tuple(sorted(self._cache.items(), key=lambda kv: (kv[1], [-t for t in kv[0]])))

    def __call__(self, split: tuple[int, ...]) -> float:
        cost = self._cache.get(split)
        if cost is None:
            cost = dp_last_cost(self._matrices[split[-1]], self._row(split[:-1]))
            self._cache[split] = cost
        return cost

    def _row(self, prefix: tuple[int, ...]) -> NDArray[np.float64]:
        row = self._rows.get(prefix)
        if row is None:
            row = dp_min_max(self._matrices[prefix[-1]], self._row(prefix[:-1]))[1]
            self._rows[prefix] = row
        return row

    @property
    def num_evaluated(self) -> int:
        return len(self._cache)


def neighbours(split: tuple[int, ...], allowed: Sequence[int]) -> list[tuple[int, ...]]:
    """Every split one move away: one worker halved into two, or two equal ones merged."""
    out: set[tuple[int, ...]] = set()
    tps = sorted(set(split))
    for tp in tps:
        rest = list(split)
        rest.remove(tp)
        if tp // 2 in allowed and tp % 2 == 0:
            out.add(tuple(sorted([*rest, tp // 2, tp // 2], reverse=True)))
        if split.count(tp) >= 2 and 2 * tp in allowed:
            rest.remove(tp)
            out.add(tuple(sorted([*rest, 2 * tp], reverse=True)))
    return sorted(out, reverse=True)


def anneal(start: tuple[int, ...], allowed: Sequence[int], score: Callable[[tuple[int, ...]],
           float], rng: np.random.Generator, num_steps: int) -> tuple[tuple[int, ...], float,
                                                                      int]:
    """Simulated annealing over splits from ``start`` (module docstring): the best split
    seen, its score and the number of moves taken."""
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    current, now = start, score(start)
    best, best_cost = current, now
    temperature = INITIAL_TEMPERATURE * now
    cooling = FINAL_TEMPERATURE_SHARE ** (1.0 / max(1, num_steps - 1))
    accepted = 0
    for _ in range(num_steps):
        options = neighbours(current, allowed)
        if not options:
            break
        candidate = options[int(rng.integers(len(options)))]
        cost = score(candidate)
        if cost <= now or (temperature > 0
                           and rng.random() < math.exp(-(cost - now) / temperature)):
            current, now = candidate, cost
            accepted += 1
            if cost < best_cost:
                best, best_cost = candidate, cost
        temperature *= cooling
    return best, best_cost, accepted


def allocate(lengths_desc: Sequence[float], kinds: dict[int, WorkerKind], budget: int,
             start_tp: int, rng: np.random.Generator, num_steps: int) -> Allocation:
    """Heddle's resource manager: the split of ``budget`` GPUs into workers of the TPs in
    ``kinds`` (those the model fits at) found by annealing from the homogeneous split at
    ``start_tp``, scored by the placement DP on ``lengths_desc`` (sorted predictions)."""
    allowed = sorted(kinds)
    if start_tp not in kinds or budget % start_tp:
        raise ValueError(f"start_tp {start_tp} must be one of {allowed} and divide the "
                         f"budget {budget}")
    start = (start_tp,) * (budget // start_tp)
    scorer = SplitScorer(lengths_desc, kinds)
    best, cost, accepted = anneal(start, allowed, scorer, rng, num_steps)
    check_split(best, budget, allowed)
    return Allocation(split=best, cost_s=cost, start=start, start_cost_s=scorer(start),
                      num_evaluated=scorer.num_evaluated, num_accepted=accepted,
                      ranked=scorer.ranked())


def fitting_tps(budget: int, fits: Callable[[int], bool]) -> list[int]:
    """The TPs of ``TP_CHOICES`` within a node and the budget at which ``fits(tp)``."""
    return [tp for tp in TP_CHOICES if tp <= min(NODE_GPUS, budget) and fits(tp)]
