"""RLHFuse's fused actor/critic pipeline search: valid schedules (dependencies, one pass each,
no overlap on a group, 1F1B's memory bound), never worse than the plain ways, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.rl.fused_pipeline import (
    PipelineWork,
    _Timeline,
    anneal,
    evaluate,
    one_f_one_b,
    plain_schedule,
    sequential_s,
    timeline,
)


def work(rng: np.random.Generator, name: str, m: int) -> PipelineWork:
    fwd = rng.uniform(0.5, 2.0, m)
    return PipelineWork(name, tuple(fwd), tuple(fwd * rng.uniform(2.0, 3.0, m)))


def check_valid(schedule, models) -> None:
    tasks = timeline(schedule, models)
    assert tasks is not None
    p = len(schedule)
    seen = {(t.model, t.micro_batch, t.backward, t.stage) for t in tasks}
    # Every micro-batch's forward and backward on every stage, exactly once.
    assert len(seen) == len(tasks) == 2 * p * sum(m.num_micro_batches for m in models)
    end = {(t.model, t.micro_batch, t.backward, t.stage): t.end_s for t in tasks}
    for t in tasks:
        if not t.backward:
            prev = end.get((t.model, t.micro_batch, False, t.stage - 1)) if t.stage else 0.0
        elif t.stage == p - 1:
            prev = end[(t.model, t.micro_batch, False, t.stage)]
        else:
            prev = end[(t.model, t.micro_batch, True, t.stage + 1)]
        assert prev is not None and prev <= t.start_s + 1e-12, t
        # A model's stage s lives on group s (actor) or P - 1 - s (critic).
        assert t.group == (t.stage if t.model == 0 else p - 1 - t.stage)
    for g in range(p):
        mine = sorted((t for t in tasks if t.group == g), key=lambda t: t.start_s)
        for a, b in zip(mine, mine[1:], strict=False):
            assert a.end_s <= b.start_s + 1e-12  # one pass at a time on a group
        for model in (0, 1):  # in flight never above 1F1B's bound on that stage
            stage = g if model == 0 else p - 1 - g
            level, peak = 0, 0
            for t in sorted((t for t in mine if t.model == model), key=lambda t: t.start_s):
                level += -1 if t.backward else 1
                peak = max(peak, level)
            assert peak <= p - stage


@pytest.mark.parametrize("seed", range(6))
def test_anneal_never_worse_than_sequential_and_respects_dependencies(seed):
    rng = np.random.default_rng(seed)
    p = int(rng.integers(2, 7))
    models = [work(rng, "actor", int(rng.integers(1, 10))),
              work(rng, "critic", int(rng.integers(1, 10)))]
    res = anneal(p, models, iterations=300, seed=seed)
    assert res.makespan_s <= res.plain_fused_s + 1e-9
    assert res.plain_fused_s <= res.sequential_s + 1e-9
    assert res.sequential_s == pytest.approx(sequential_s(p, models))
    assert res.makespan_s >= res.lower_bound_s - 1e-9
    assert evaluate(res.schedule, models)[0] == pytest.approx(res.makespan_s)
    check_valid(res.schedule, models)
    check_valid(plain_schedule(p, models), models)


def test_anneal_finds_a_shorter_schedule_where_bubbles_are_large():
    # Few micro-batches on many stages: 1F1B idles most of the time; the reversed critic
    # fills the actor's fill and drain.
    models = [PipelineWork("actor", (1.0,) * 4, (2.0,) * 4),
              PipelineWork("critic", (0.6,) * 4, (1.2,) * 4)]
    res = anneal(8, models, iterations=2000, seed=1)
    assert res.makespan_s < 0.8 * res.sequential_s
    check_valid(res.schedule, models)


def test_anneal_is_deterministic_for_a_seed():
    rng = np.random.default_rng(3)
    models = [work(rng, "actor", 6), work(rng, "critic", 5)]
    a = anneal(4, models, iterations=400, seed=7)
    b = anneal(4, models, iterations=400, seed=7)
    assert a.schedule == b.schedule and a.makespan_s == b.makespan_s


def test_1f1b_alone_takes_m_plus_p_minus_1_stage_times():
    p, m, f, b = 4, 6, 1.0, 2.0
    model = PipelineWork("actor", (f,) * m, (b,) * m)
    alone = [one_f_one_b(p, g, m, 0) for g in range(p)]
    assert evaluate(alone, [model])[0] == pytest.approx((m + p - 1) * (f + b))


def test_invalid_schedules_are_rejected():
    models = [PipelineWork("a", (1.0,) * 6, (2.0,) * 6),
              PipelineWork("c", (1.0,) * 2, (2.0,) * 2)]
    plain = plain_schedule(3, models)
    backward_first = [list(s) for s in plain]
    backward_first[0].remove(1)
    backward_first[0].insert(0, 1)  # the actor's backward before any forward: deadlock
    assert evaluate(backward_first, models) is None
    all_forwards = [list(s) for s in plain]
    all_forwards[0] = sorted(all_forwards[0], key=lambda c: (c & 1, c))  # 6 forwards in flight
    assert evaluate(all_forwards, models) is None  # above 1F1B's 3 on the first stage
    with pytest.raises(ValueError, match="start schedule"):
        anneal(3, models, iterations=10, start=backward_first)


def _evaluate_by_timeline(schedule, models):
    """``evaluate`` as ``_Timeline`` gives it (the incremental recurrence the constructive
    schedulers use): each group places its next pass while ``start_of`` allows; the makespan
    and the end times summed in the order the passes were placed, and the passes (group,
    model, micro-batch, backward, start, end) in that order."""
    tl = _Timeline(len(schedule), models)
    ptr = [0] * len(schedule)
    remaining = sum(len(s) for s in schedule)
    ends, passes = [], []
    while remaining:
        progress = False
        for g, order in enumerate(schedule):
            while ptr[g] < len(order):
                start = tl.start_of(g, order[ptr[g]])
                if start is None:
                    break
                code = order[ptr[g]]
                mb = tl.counts[g][code]
                ends.append(tl.place(g, code, start))
                passes.append((g, code >> 1, mb, bool(code & 1), start, ends[-1]))
                ptr[g] += 1
                remaining -= 1
                progress = True
        if not progress:
            return None
    sum_end = 0.0
    for end in ends:
        sum_end += end
    return (max(ends, default=0.0), sum_end), passes


@pytest.mark.parametrize("seed", range(8))
def test_evaluate_is_the_timeline_recurrence_bit_for_bit(seed):
    """The written-out ``evaluate`` gives the makespan and tie-break sum of ``_Timeline``'s
    recurrence exactly (and ``timeline``, built on it, the same passes), and rejects the same
    schedules (deadlocks, over 1F1B's bound), on random shuffles of the plain schedule as the
    annealing makes them, one model or two."""
    rng = np.random.default_rng(seed)
    p = int(rng.integers(1, 7))
    models = [work(rng, "actor", int(rng.integers(1, 9))),
              work(rng, "critic", int(rng.integers(1, 9)))][:1 + seed % 2]
    schedule = plain_schedule(p, models)
    num_valid = 0
    for _ in range(60):
        order = schedule[int(rng.integers(p))]
        i, j = rng.integers(len(order), size=2)
        order[i], order[j] = order[j], order[i]
        replay = _evaluate_by_timeline(schedule, models)
        want = None if replay is None else replay[0]
        assert evaluate(schedule, models) == want
        tasks = timeline(schedule, models)
        assert (tasks is None) == (want is None)
        if tasks is not None:  # ``timeline`` records the same passes, in the same order
            assert [(t.group, t.model, t.micro_batch, t.backward, t.start_s, t.end_s)
                    for t in tasks] == replay[1]
        num_valid += want is not None
        if want is None:  # the search undoes a move it cannot time
            order[i], order[j] = order[j], order[i]
    assert 0 < num_valid < 60  # both kinds were compared
