"""RLHFuse's intra-stage fusion: the actor's and the critic's training pipelines share the same
pipeline stages, laid out in opposite directions (the actor's stage ``s`` and the critic's stage
``P - 1 - s`` on GPU group ``s``, as Chimera does for one model), so that the fill and drain
bubbles of one model are filled with the other's micro-batches. Which task each GPU group runs
next is a schedule; RLHFuse searches it by simulated annealing (arXiv:2409.13221 section 5;
the released solver is FlexFusion's ``DualEgoSolver.h``, read for the problem's shape only).

A schedule is, per GPU group, the order of its tasks: each task is one model's forward or
backward pass of its next micro-batch on that group (the k-th forward of a model on a group
is micro-batch k). ``evaluate`` times a schedule by the dependency recurrence: a task starts
when its group is free and its micro-batch's previous pass (the forward on the stage before,
or the backward on the stage after, or its own forward on the last stage) has ended. A
schedule is invalid when it deadlocks or when a model would hold more micro-batches in flight
(forward done, backward not) on a stage than 1F1B does there (``P - stage``): each model keeps
within its own 1F1B activation memory, so a group holds at most the two models' 1F1B peaks of
its two stages (``P - s`` and ``s + 1``, balanced across groups as in Chimera). RLHFuse's
second pass, which lowers peak memory further, is not modelled.

The search starts from the better of the plain schedule (the actor's 1F1B, then the
critic's, on every group) and a greedy list schedule (the paper starts from a greedy one), and
moves by swapping two tasks of one group (adjacent ones as the paper describes,
or any two, as FlexFusion's solver does), accepting a worse schedule with probability
``exp(-delta / T)``; it returns the best schedule seen, so never one worse than the start,
and the plain schedule is never slower than the two pipelines run one after the other
(the same order per group without the barrier between the models: times only move earlier).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PipelineWork:
    """One model's training pass: per micro-batch, the seconds of one stage's forward and
    backward (recomputation included)."""

    name: str
    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.fwd_s) != len(self.bwd_s) or not self.fwd_s:
            raise ValueError("fwd_s and bwd_s need one entry per micro-batch (at least one)")

    @property
    def num_micro_batches(self) -> int:
        return len(self.fwd_s)


# A task code on a group: model index * 2 + (1 for backward, 0 for forward).
Schedule = list[list[int]]


def one_f_one_b(num_stages: int, stage: int, num_micro_batches: int, model: int) -> list[int]:
    """Megatron's non-interleaved 1F1B order on pipeline stage ``stage``: warm-up forwards,
    one forward one backward, cool-down backwards."""
    warmup = min(num_stages - 1 - stage, num_micro_batches)
    f, b = 2 * model, 2 * model + 1
    return [f] * warmup + [f, b] * (num_micro_batches - warmup) + [b] * warmup


def stage_on_group(model: int, group: int, num_stages: int) -> int:
    """Model 0 runs stage s on group s; model 1 runs its stages the other way round."""
    return group if model == 0 else num_stages - 1 - group


def plain_schedule(num_stages: int, models: Sequence[PipelineWork]) -> Schedule:
    """Each group runs the first model's 1F1B order, then the second's."""
    return [[t for i, m in enumerate(models)
             for t in one_f_one_b(num_stages, stage_on_group(i, g, num_stages),
                                  m.num_micro_batches, i)]
            for g in range(num_stages)]


@dataclass(frozen=True, slots=True)
class TaskTime:
    """One pass of a timed schedule (``timeline``)."""

    group: int
    model: int
    micro_batch: int
    backward: bool
    stage: int
    start_s: float
    end_s: float


class _Timeline:
    """The dependency recurrence shared by ``evaluate`` and ``greedy_schedule``: when each
    micro-batch's pass at each chain position (forward on stages 0..P-1, then backward on
    stages P-1..0) ends, when each group is free, and what each group holds in flight."""

    def __init__(self, num_stages: int, models: Sequence[PipelineWork]) -> None:
        self.num_stages = num_stages
        self.models = models
        self.ends = [[[-1.0] * (2 * num_stages) for _ in range(m.num_micro_batches)]
                     for m in models]
        self.free = [0.0] * num_stages
        self.counts = [[0] * (2 * len(models)) for _ in range(num_stages)]
        self.in_flight = [[0] * len(models) for _ in range(num_stages)]
        # 1F1B's in-flight bound of each model's stage on each group: P - stage.
        self.caps = [[num_stages - stage_on_group(i, g, num_stages) for i in range(len(models))]
                     for g in range(num_stages)]

    def start_of(self, g: int, code: int) -> float | None:
        """When task ``code`` (its next micro-batch) could start on group ``g``; None if it
        has no micro-batch left, waits on a pass not yet placed, or exceeds the memory cap."""
        model, bwd = code >> 1, code & 1
        mb = self.counts[g][code]
        if mb >= self.models[model].num_micro_batches:
            return None
        if not bwd and self.in_flight[g][model] >= self.caps[g][model]:
            return None
        stage = g if model == 0 else self.num_stages - 1 - g
        chain = 2 * self.num_stages - 1 - stage if bwd else stage
        prev = self.ends[model][mb][chain - 1] if chain else 0.0
        if prev < 0.0:
            return None
        return prev if prev > self.free[g] else self.free[g]

    def place(self, g: int, code: int, start: float) -> float:
        model, bwd = code >> 1, code & 1
        mb = self.counts[g][code]
        stage = g if model == 0 else self.num_stages - 1 - g
        chain = 2 * self.num_stages - 1 - stage if bwd else stage
        work = self.models[model]
        end = start + (work.bwd_s if bwd else work.fwd_s)[mb]
        self.ends[model][mb][chain] = end
        self.free[g] = end
        self.counts[g][code] = mb + 1
        self.in_flight[g][model] += -1 if bwd else 1
        return end


def evaluate(schedule: Schedule, models: Sequence[PipelineWork],
             record: list[TaskTime] | None = None) -> tuple[float, float] | None:
    """(makespan, sum of task end times) of ``schedule``, or None if it deadlocks or a model
    exceeds its 1F1B in-flight bound on some stage. The second value breaks ties in the search
    (earlier tasks leave room for later ones), as FlexFusion's solver does. ``record``: a list
    that gets every pass with its times, in the order placed (``timeline``).

    ``_Timeline``'s recurrence (``start_of`` then ``place``) written out in one loop, with
    each (group, task)'s constants looked up once: the annealing calls this thousands of
    times per search (a test holds the two equal, bit for bit). A group whose next task
    has no micro-batch left or is over the memory bound gives up at once: only its own
    passes could change either. (Letting a group that waits on another's pass sleep until
    that pass is placed, instead of sweeping over it, measured slower: a heap and a dict.)"""
    num_stages = len(schedule)
    tasks = _task_constants(num_stages, models)
    ends = [[[-1.0] * (2 * num_stages) for _ in range(m.num_micro_batches)] for m in models]
    free = [0.0] * num_stages
    counts = [[0] * (2 * len(models)) for _ in range(num_stages)]
    in_flight = [[0] * len(models) for _ in range(num_stages)]
    ptr = [0] * num_stages
    remaining = sum(len(s) for s in schedule)
    sum_end = 0.0
    while remaining:
        progress = False
        for g, order in enumerate(schedule):
            p, n = ptr[g], len(order)
            if p == n:
                continue
            count, held, consts, at = counts[g], in_flight[g], tasks[g], free[g]
            while p < n:
                code = order[p]
                model, bwd, chain, durations, cap = consts[code]
                mb = count[code]
                if mb >= len(durations) or (not bwd and held[model] >= cap):
                    return None  # only this group's own passes move these: it waits for ever
                passes = ends[model][mb]
                prev = passes[chain - 1] if chain else 0.0
                if prev < 0.0:
                    break
                start = prev if prev > at else at
                at = start + durations[mb]
                passes[chain] = at
                if record is not None:
                    record.append(TaskTime(g, model, mb, bool(bwd), stage_on_group(
                        model, g, num_stages), start, at))
                count[code] = mb + 1
                held[model] += -1 if bwd else 1
                sum_end += at
                p += 1
            if p != ptr[g]:
                remaining -= p - ptr[g]
                ptr[g], free[g] = p, at
                progress = True
        if not progress:
            return None  # every group waits on another's pass: no valid timing
    return max(free), sum_end


def _task_constants(num_stages: int, models: Sequence[PipelineWork]
                    ) -> list[list[tuple[int, int, int, tuple[float, ...], int]]]:
    """Per group, per task code: (model, backward, chain position, each micro-batch's
    seconds, the model's in-flight cap on that group), as ``_Timeline`` derives them."""
    out = []
    for g in range(num_stages):
        row = []
        for code in range(2 * len(models)):
            model, bwd = code >> 1, code & 1
            stage = stage_on_group(model, g, num_stages)
            chain = 2 * num_stages - 1 - stage if bwd else stage
            work = models[model]
            row.append((model, bwd, chain, work.bwd_s if bwd else work.fwd_s,
                        num_stages - stage))
        out.append(row)
    return out


def merged_schedule(num_stages: int, models: Sequence[PipelineWork]) -> Schedule | None:
    """Both models' 1F1B orders merged on each group by when each task starts in its own
    model's 1F1B pipeline run alone (the bidirectional layout's bubbles are complementary, so
    this lines one model's work up with the other's idle time); None if that deadlocks."""
    keyed: list[list[tuple[float, int, int]]] = [[] for _ in range(num_stages)]
    for i, m in enumerate(models):
        tl = _Timeline(num_stages, [m])
        orders = [one_f_one_b(num_stages, stage_on_group(i, g, num_stages),
                              m.num_micro_batches, 0) for g in range(num_stages)]
        if i == 1:  # its timeline sees it as model 0: mirror the groups
            orders = orders[::-1]
        ptr = [0] * num_stages
        left = sum(len(o) for o in orders)
        while left:
            for g, order in enumerate(orders):
                while ptr[g] < len(order):
                    start = tl.start_of(g, order[ptr[g]])
                    if start is None:
                        break
                    tl.place(g, order[ptr[g]], start)
                    group = g if i == 0 else num_stages - 1 - g
                    keyed[group].append((start, -(order[ptr[g]] & 1), 2 * i + order[ptr[g]]))
                    ptr[g] += 1
                    left -= 1
    schedule = [[code for _, _, code in sorted(k)] for k in keyed]
    return schedule if evaluate(schedule, models) is not None else None


def timeline(schedule: Schedule, models: Sequence[PipelineWork]) -> list[TaskTime] | None:
    """Every pass of ``schedule`` with its times, in the order placed (None if invalid)."""
    out: list[TaskTime] = []
    return out if evaluate(schedule, models, out) is not None else None


def greedy_schedule(num_stages: int, models: Sequence[PipelineWork]) -> Schedule | None:
    """List scheduling: repeatedly place the task that can start earliest on any group
    (backwards before forwards on ties, as 1F1B does, then the first model). None if it
    would deadlock."""
    tl = _Timeline(num_stages, models)
    schedule: Schedule = [[] for _ in range(num_stages)]
    codes = range(2 * len(models))
    for _ in range(2 * num_stages * sum(m.num_micro_batches for m in models)):
        best: tuple[float, int, int, int] | None = None
        for g in range(num_stages):
            for code in codes:
                start = tl.start_of(g, code)
                if start is not None:
                    cand = (start, -(code & 1), code, g)
                    if best is None or cand < best:
                        best = cand
        if best is None:
            return None
        start, _, code, g = best
        tl.place(g, code, start)
        schedule[g].append(code)
    return schedule


@dataclass(frozen=True, slots=True)
class FusedResult:
    """The search's outcome: the schedule and its makespan, against the plain ways."""

    schedule: Schedule
    makespan_s: float
    sequential_s: float
    """The two models' 1F1B pipelines one after the other (what an unfused system runs)."""
    plain_fused_s: float
    """The search's start: both 1F1B orders on one timeline without a barrier between them."""
    lower_bound_s: float
    """No schedule is shorter (``lower_bound_s``)."""
    iterations: int


def sequential_s(num_stages: int, models: Sequence[PipelineWork]) -> float:
    """Each model's own 1F1B makespan, summed."""
    total = 0.0
    for m in models:
        alone = [one_f_one_b(num_stages, g, m.num_micro_batches, 0) for g in range(num_stages)]
        res = evaluate(alone, [m])
        assert res is not None
        total += res[0]
    return total


def lower_bound_s(num_stages: int, models: Sequence[PipelineWork]) -> float:
    """The larger of two bounds (two of FlexFusion's four): no bubble at all (every group
    does both models' work on its stages, the same on every group), and the longest chain of
    one micro-batch (its forward and backward through every stage)."""
    work = sum(sum(m.fwd_s) + sum(m.bwd_s) for m in models)
    chain = max(num_stages * (f + b) for m in models for f, b in zip(m.fwd_s, m.bwd_s,
                                                                       strict=True))
    return max(work, chain)


def anneal(num_stages: int, models: Sequence[PipelineWork], *, iterations: int = 2000,
           seed: int = 0, start: Schedule | None = None) -> FusedResult:
    """Simulated annealing over fused schedules of two models on ``num_stages`` shared stages
    (deterministic for a given seed). ``start`` (a valid schedule) replaces the plain one."""
    if len(models) != 2:
        raise ValueError(f"fusion pairs two models, got {len(models)}")
    if num_stages < 1 or iterations < 0:
        raise ValueError("num_stages must be >= 1 and iterations >= 0")
    plain = plain_schedule(num_stages, models)
    plain_cost = evaluate(plain, models)
    assert plain_cost is not None, "the plain schedule is always valid"
    cur, cur_cost = plain, plain_cost
    starts = [start] if start is not None else [merged_schedule(num_stages, models),
                                                 greedy_schedule(num_stages, models)]
    for cand in starts:
        if cand is None:
            continue
        cand_cost = evaluate(cand, models)
        if cand_cost is None:
            raise ValueError("the start schedule deadlocks or exceeds 1F1B's memory bound")
        if cand_cost < cur_cost:
            cur, cur_cost = [list(s) for s in cand], cand_cost
    best, best_cost = [list(s) for s in cur], cur_cost
    rng = np.random.default_rng(seed)
    # Temperatures relative to the schedule's length: accept a 2% worse schedule with
    # probability 1/e at the start, cool geometrically to 1e-4 of that.
    t0 = 0.02 * cur_cost[0]
    cooling = (1e-4) ** (1.0 / max(1, iterations))
    temp = t0
    n = len(cur[0])
    draws = rng.random((iterations, 5))
    for it in range(iterations):
        g = int(draws[it, 0] * num_stages)
        i = int(draws[it, 1] * (n - 1))
        j = i + 1 if draws[it, 2] < 0.5 else int(draws[it, 3] * n)
        order = cur[g]
        if order[i] == order[j]:
            temp *= cooling
            continue
        order[i], order[j] = order[j], order[i]
        cost = evaluate(cur, models)
        accept = cost is not None and (cost < cur_cost or draws[it, 4] < math.exp(
            (cur_cost[0] - cost[0]) / temp))
        if accept:
            assert cost is not None
            cur_cost = cost
            if cost < best_cost:
                best, best_cost = [list(s) for s in cur], cost
        else:
            order[i], order[j] = order[j], order[i]
        temp *= cooling
    return FusedResult(best, best_cost[0], sequential_s(num_stages, models), plain_cost[0],
                       lower_bound_s(num_stages, models), iterations)
