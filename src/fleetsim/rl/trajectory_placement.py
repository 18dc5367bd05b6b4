"""Heddle's trajectory-aware placement: sort trajectories by predicted length, then group
them onto workers by dynamic programming so that the slowest worker finishes first
(arXiv 2603.28101, "presorted dynamic programming"; the recurrence is our reconstruction
from secondary summaries of the paper, whose body could not be read).

With trajectories sorted longest first (``L[0] >= L[1] >= ...``) and contiguous groups,
``f[k][i] = min over j <= i of max(f[k-1][j], C(j, i))`` places the first ``i`` on ``k``
workers (``j == i``: worker ``k`` gets none). The reconstructed group cost is ``L[j] * T(size)``:
the group's longest trajectory's tokens times the per-token time at that batch size
(interference: a bigger batch decodes each token slower). A worker decodes at most ``B``
trajectories at once (its KV, its ``max_running``), so fleetsim's cost adds the group's
total work: ``C(j, i) = T(b) * max(L[j], S(j, i) / b)`` with ``b = min(size, B)`` and ``S``
the group's summed tokens (the makespan bound of a machine with ``b`` slots; for
``size <= B`` it is the reconstructed cost, since a mean never exceeds the maximum). Without it a
group of many short trajectories looks as cheap as its longest one and the DP piles them
onto one worker. With the reconstructed cost alone, contiguous groups of the sorted order lose
nothing (a longer trajectory swapped into a shorter group never lowers either cost); with
the work term the problem holds a partition problem and contiguity is a restriction, the
one Heddle's presorted DP makes: the DP is then optimal among contiguous groupings (tests
check both against brute force). Among the groupings of least cost (only the bottleneck
group sets it) the most even one is taken (least sum of squared sizes). O(N^2 W) in numpy,
over the lower triangle of the cost matrix in row blocks that stay in cache (``CostBlocks``;
the whole matrix, 2,049 x 2,049 for Heddle's batch, cost a 33 MB temporary per worker).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

BLOCK_CELLS = 1 << 16
"""Cells in one row block of a group-cost matrix (ours: 512 KiB of float64, so a block and
its temporaries stay in cache; any size gives the same results)."""

# A group-cost matrix, stored by group end: blocks ``(a, c)`` in order of ``a``, where
# ``c[r, j]`` is the cost of the group ``j..a+r-1`` for ``j < a + len(c)`` (inf for ``j``
# past the end: an empty-or-reversed group). The columns past a block's last end hold only
# inf, so they are not stored: a DP over them never takes an inf where a finite cost exists,
# and the first least entry of a row is the same with or without them.
CostBlocks = list[tuple[int, NDArray[np.float64]]]


def dp_group_sizes(lengths_desc: Sequence[float], num_workers: int,
                   per_token_s: Callable[[int], float], max_live: int | None = None
                   ) -> tuple[list[int], float]:
    """Group sizes per worker (contiguous, longest first; some may be 0) minimising the
    largest group cost (module docstring), and that cost. ``per_token_s(b)``: seconds per
    token with ``b`` trajectories decoding (non-decreasing in ``b``); ``max_live``: most
    trajectories a worker decodes at once (None: no limit)."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    cost = group_cost_matrix(lengths_desc, per_token_s, max_live)
    if not len(lengths_desc):
        return [0] * num_workers, 0.0
    return dp_over_matrices([cost] * num_workers)


def dp_group_sizes_per_worker(lengths_desc: Sequence[float],
                              workers: Sequence[tuple[Callable[[int], float], int | None]]
                              ) -> tuple[list[int], float]:
    """``dp_group_sizes`` with worker ``k``'s own ``(per_token_s, max_live)``: group sizes
    in worker order (the longest trajectories on worker 0) and the largest group cost."""
    if not workers:
        raise ValueError("workers must not be empty")
    if not len(lengths_desc):
        return [0] * len(workers), 0.0
    # One matrix per worker kind: its (per_token_s, max_live), the function by identity (the
    # workers hold them alive for the call).
    matrices: dict[tuple[int, int | None], CostBlocks] = {}
    for per_token_s, max_live in workers:
        if (id(per_token_s), max_live) not in matrices:
            matrices[id(per_token_s), max_live] = group_cost_matrix(lengths_desc, per_token_s,
                                                                    max_live)
    return dp_over_matrices([matrices[id(t), live] for t, live in workers])


def group_cost_matrix(lengths_desc: Sequence[float], per_token_s: Callable[[int], float],
                      max_live: int | None) -> CostBlocks:
    """The cost of every group ``j..i-1`` of the sorted trajectories on a worker of
    ``per_token_s`` and ``max_live`` (module docstring), as ``CostBlocks``."""
    lengths = np.asarray(lengths_desc, dtype=np.float64)
    n = len(lengths)
    if max_live is not None and max_live < 1:
        raise ValueError(f"max_live must be >= 1 or None, got {max_live}")
    if n and np.any(np.diff(lengths) > 0):
        raise ValueError("lengths must be sorted longest first")
    live = max(1, n if max_live is None else min(n, max_live))
    t = np.array([0.0] + [per_token_s(b) for b in range(1, live + 1)], dtype=np.float64)
    return _group_costs(lengths, t, live)


def dp_start(n: int) -> NDArray[np.float64]:
    """The DP's row before any worker: ``f[i]``, the cost of the first ``i`` trajectories
    on no workers (0 for none, inf otherwise)."""
    f = np.full(n + 1, math.inf)
    f[0] = 0.0
    return f


def dp_min_max(cost: CostBlocks, f: NDArray[np.float64]
               ) -> tuple[NDArray[np.intp], NDArray[np.float64]]:
    """One more worker of group costs ``cost`` after ``f``: where its group starts for each
    end (the first best start) and the least largest cost of the first ``i`` trajectories."""
    return _step(cost, f, np.maximum)


def dp_last_cost(cost: CostBlocks, f: NDArray[np.float64]) -> float:
    """The least largest cost of all trajectories when the last worker has ``cost``
    (``dp_min_max``'s last entry, from the last group end alone)."""
    return float(_step(cost, f, np.maximum, last_only=True)[1][-1])


def dp_over_matrices(costs: Sequence[CostBlocks], tie_break: bool = True
                     ) -> tuple[list[int], float]:
    """Group sizes and the least largest cost with worker ``k``'s group costs
    ``costs[k]``; ``tie_break=False`` skips choosing the most even of the optimal groupings
    (the resource manager's search needs only the cost)."""
    n = costs[0][-1][0] + len(costs[0][-1][1]) - 1
    f = dp_start(n)
    choices: list[NDArray[np.intp]] = []
    for k, cost in enumerate(costs):
        arg, f = _step(cost, f, np.maximum, last_only=k == len(costs) - 1)
        choices.append(arg)
    best = float(f[n])
    if not tie_break:
        return _sizes(choices, n), best
    # Among the groupings of least cost, the most even: least sum of squared sizes over
    # groups no costlier than the best.
    limit = best * (1 + 1e-12)
    squares: dict[int, CostBlocks] = {}
    f = dp_start(n)
    choices = []
    for k, cost in enumerate(costs):
        if id(cost) not in squares:
            squares[id(cost)] = [(a, np.where(c <= limit, _squared_sizes(a, c.shape), math.inf))
                                 for a, c in cost]
        arg, f = _step(squares[id(cost)], f, np.add, last_only=k == len(costs) - 1)
        choices.append(arg)
    return _sizes(choices, n), best


def group_cost(lengths: Sequence[float], per_token_s: Callable[[int], float],
               max_live: int | None = None) -> float:
    """One group's cost in any order (0 when empty): ``T(b) * max(longest, total / b)``."""
    if not lengths:
        return 0.0
    b = len(lengths) if max_live is None else min(len(lengths), max_live)
    return per_token_s(b) * max(max(lengths), sum(lengths) / b)


def _step(cost: CostBlocks, f: NDArray[np.float64], combine: np.ufunc, last_only: bool = False
          ) -> tuple[NDArray[np.intp], NDArray[np.float64]]:
    """``g[i] = min over j of combine(f[j], cost[j, i])`` and its first ``j``, block by block
    (``last_only``: for the last end alone; the other entries are left 0)."""
    n1 = len(f)
    arg = np.zeros(n1, dtype=np.intp)
    g = np.zeros(n1, dtype=np.float64)
    for a, c in cost[-1:] if last_only else cost:
        if last_only:
            a, c = n1 - 1, c[-1:]
        m = combine(f[:c.shape[1]], c)
        at = m.argmin(axis=1)
        arg[a:a + len(c)] = at
        g[a:a + len(c)] = m[np.arange(len(c)), at]
    return arg, g


def _squared_sizes(a: int, shape: tuple[int, ...]) -> NDArray[np.float64]:
    """``(i - j)^2`` over a block of ends ``a..`` and starts ``0..``."""
    size = np.arange(a, a + shape[0])[:, None] - np.arange(shape[1])[None, :]
    return (size ** 2).astype(np.float64)


def _sizes(choices: list[NDArray[np.intp]], n: int) -> list[int]:
    """Group sizes from the DP's choices (worker k's group starts at ``choices[k][end]``)."""
    sizes = []
    i = n
    for arg in reversed(choices):
        j = int(arg[i])
        sizes.append(i - j)
        i = j
    assert i == 0
    return sizes[::-1]


def _group_costs(lengths: NDArray[np.float64], t: NDArray[np.float64], live: int
                 ) -> CostBlocks:
    """The group costs ``c[j, i]`` of group ``j..i-1`` (0 when empty, inf when ``i < j``) as
    ``CostBlocks``."""
    n = len(lengths)
    prefix = np.concatenate(([0.0], np.cumsum(lengths)))
    first = np.append(lengths, 0.0)  # the group's longest: its first trajectory's length
    rows = max(1, BLOCK_CELLS // (n + 1))
    blocks: CostBlocks = []
    for a in range(0, n + 1, rows):
        i = np.arange(a, min(n + 1, a + rows))[:, None]
        j = np.arange(i[-1, 0] + 1)[None, :]
        size = i - j
        b = np.clip(size, 1, live)
        total = prefix[i] - prefix[j]
        c = np.where(size > 0, t[b] * np.maximum(first[j], total / b), 0.0)
        blocks.append((a, np.where(size < 0, math.inf, c)))
    return blocks


class Placement:
    """Which worker each trajectory is on, and the predicted-length band each worker covers
    (used to re-place a trajectory whose prediction changed)."""

    def __init__(self, predicted: Sequence[float], num_workers: int,
                 per_token_s: Callable[[int], float], max_live: int | None = None,
                 workers: Sequence[tuple[Callable[[int], float], int | None]] | None = None
                 ) -> None:
        """``workers``: each worker's own ``(per_token_s, max_live)``, fastest first
        (heterogeneous model parallelism); None: all ``num_workers`` share ``per_token_s``
        and ``max_live``."""
        order = sorted(range(len(predicted)), key=lambda x: (-predicted[x], x))
        if workers is None:
            sizes, self.cost = dp_group_sizes([predicted[x] for x in order], num_workers,
                                              per_token_s, max_live)
            workers = [(per_token_s, max_live)] * num_workers
        else:
            if len(workers) != num_workers:
                raise ValueError(f"workers must list {num_workers} workers, got "
                                 f"{len(workers)}")
            sizes, self.cost = dp_group_sizes_per_worker([predicted[x] for x in order],
                                                         workers)
        self.workers = list(workers)
        self.worker_of: list[int] = [0] * len(predicted)
        self.members: list[set[int]] = [set() for _ in range(num_workers)]
        """Unfinished trajectories placed on each worker (moves and finishes update it)."""
        # (shortest predicted length in the group, worker), longest groups first
        self.bands: list[tuple[float, int]] = []
        start = 0
        for w, size in enumerate(sizes):
            group = order[start:start + size]
            for x in group:
                self.worker_of[x] = w
                self.members[w].add(x)
            if group:
                self.bands.append((predicted[group[-1]], w))
            start += size
        self.sizes = sizes
        self.rank_of_worker = {w: r for r, (_, w) in enumerate(self.bands)}
        """worker -> its band's rank (0: the longest trajectories)."""

    def worker_for(self, predicted: float) -> int:
        """The worker whose band holds a trajectory predicted at ``predicted`` tokens: the
        first (longest) band whose shortest member is not longer."""
        for low, w in self.bands:
            if predicted >= low:
                return w
        return self.bands[-1][1]

    def move_for(self, trajectory: int, predicted: float,
                 remaining: Callable[[int], float]) -> int | None:
        """Where ``trajectory`` should move now that it is predicted at ``predicted`` tokens
        (``remaining(x)``: predicted tokens trajectory ``x`` has left), or None.

        Only a trajectory that was underestimated moves (its band is now a longer one than
        its worker's: a long-tail trajectory in a crowded group), to the worker of that band,
        and only if that shortens the two workers' predicted finish, the DP's cost applied
        locally: ``max(r_x T(n_src), r_y T(n_dst))`` before against ``max(r_x, r_y)
        T(n_dst + 1)`` after, with ``r_y`` the most any trajectory on the destination has
        left. Otherwise a migrant would refill a long-tail worker and slow the long
        trajectories already there. An overestimated trajectory stays: it finishes soon."""
        src = self.worker_of[trajectory]
        dst = self.worker_for(predicted)
        if self.rank_of_worker[dst] >= self.rank_of_worker.get(src, len(self.bands)):
            return None
        r_x = remaining(trajectory)
        r_y = max(map(remaining, self.members[dst]), default=0.0)
        t = self._per_token_s
        before = max(r_x * t(src, len(self.members[src])),
                     r_y * t(dst, len(self.members[dst])))
        after = max(r_x, r_y) * t(dst, len(self.members[dst]) + 1)
        return dst if after < before else None

    def _per_token_s(self, worker: int, n: int) -> float:
        if n <= 0:
            return 0.0
        per_token_s, max_live = self.workers[worker]
        live = n if max_live is None else min(n, max_live)
        return per_token_s(live) * max(1.0, n / live)

    def moved(self, trajectory: int, dst: int) -> None:
        self.members[self.worker_of[trajectory]].discard(trajectory)
        self.members[dst].add(trajectory)
        self.worker_of[trajectory] = dst

    def finished(self, trajectory: int) -> None:
        self.members[self.worker_of[trajectory]].discard(trajectory)
