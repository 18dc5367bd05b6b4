"""A decode window beside another job: fast-forward for a replica whose decode steps would run
as jobs on a shared resource because one other job draws on it (an SoC's iGPU decoding while
the NPU prefills on the same DDR).

Stepping runs each such step as a job (``shared_steps.py``): its start, the check at which the
first of the two jobs is done and the one after it are events, and each one advances both
jobs' work and reallocates the resource's max-min shares (``resources.py``). With a single
other job, nothing but the window's own steps changes those shares until that job ends, so
the events can be replayed in a loop: ``BesideReplay`` makes the service's float operations
in the service's order (the same two-job max-min rounds, ``two_job_rates``, the same advances
and the same tolerances), so the window's end times are the ones stepping would give, bit for
bit.

Nothing of the service is touched while the window runs: the service only knows that a
client runs work *beside* its jobs (``SharedResources.claim_beside``) and tells it before
anything reads or changes the shares; the replica then cuts its window back to the step in
progress (``Replica.interrupt``) and the port writes the service's state as stepping would
have left it before this instant (``SharedSteps.end_beside``): the other job's work left and
rate, the step in progress as a job (or, once its work is done, as a step whose end is known),
the check stepping would have pending, the counters. The other job's end is such a moment
too: the window never runs past it (a check scheduled there, ``other_done_s``), because
there the other replica plans again.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from fleetsim.serving.resources import DONE_S, Job, ResourceKey, one_job_rate, two_job_rates

if TYPE_CHECKING:
    from fleetsim.serving.shared_steps import SharedStepModel

# Where the replay stopped: the state of the step in progress at the stop.
NOT_STARTED: Final = 0  # its job's start is still to come (at the stop itself)
JOB_ACTIVE: Final = 1  # its job draws on the resource
STEP_GAP: Final = 2  # its work is done; its arithmetic (the private part) ends at ``end_s``
COMPLETE: Final = 3  # every step asked for is done


def _ignore(job: Job) -> None:
    pass


class BesideReplay:
    """The service's events over a window's decode steps, each step a job beside the one
    other job ``other``: run once when the window opens (its end times, and when ``other``
    ends) and again, from the same snapshot, when it is cut or ends (the state then)."""

    def __init__(self, model: SharedStepModel, key: ResourceKey, capacity: float, client: str,
                 other: Job, updated_s: float, work_by_client: dict[str, float],
                 used: float) -> None:
        self.model = model
        self.client = client
        self.other = other
        # The snapshot every replay starts from (the service's state as the window opens).
        self.left0 = other.work_left
        self.rate0 = other.rate
        self.updated0 = updated_s
        self.other_work0 = work_by_client.get(other.client, 0.0)
        self.own_work0 = work_by_client.get(client, 0.0)
        self.used0 = used
        self.other_use = other.single_use
        self.use = 1.0
        # The window's decoders as it opens (``DecodeWindows.open``'s arguments).
        self.start_s = 0.0
        self.n0 = 0
        self.kv0 = 0
        self.finishes: list[tuple[int, int]] = []
        # When ``other`` is done, found by the first replay (inf: not within its steps).
        self.other_done_s = math.inf
        self.num_steps = 0  # the most steps the window may have
        # A job as the service would hold for the step: only its weight, cap and use are read.
        self._mine = Job(0.0, {key: 1.0}, 1.0, math.inf, _ignore, None, client)
        self._capacity = capacity  # (the resource's, units/s)
        # Each step's parts (private seconds, work, weight, cap) as the first replay priced
        # them: a later replay covers the same steps, so it reads them instead.
        self._private_s: list[float] = []
        self._work: list[float] = []
        self._weight: list[float] = []
        self._max_rate: list[float] = []
        self._reset()

    def _reset(self) -> None:
        self.left = self.left0  # the other job's work left, at ``updated_s``
        self.other_rate = self.rate0
        self.updated_s = self.updated0
        self.other_work = self.other_work0
        self.own_work = self.own_work0
        self.used = self.used0
        self.num_changes = 0
        self.num_jobs = 0
        # The step in progress where the replay stopped.
        self.state = COMPLETE
        self.step_start_s = 0.0
        self.private_end_s = 0.0
        self.work = 0.0  # its job's work, weight and cap
        self.weight = 1.0
        self.max_rate = math.inf
        self.work_left = 0.0
        self.rate = 0.0
        self.end_s = 0.0
        self.check_s = math.inf  # the check stepping has pending at the stop

    def ends(self, start_s: float, n: int, kv_tokens: int, k: int,
             finishes: list[tuple[int, int]]) -> list[float]:
        """``DecodeWindows.open``'s end times for a window of at most k steps from
        ``start_s`` (n decoders holding ``kv_tokens``; ``finishes`` those leaving inside):
        stepping's, through the step in which the other job ends (that step's end is then
        unknown: the other job's end stands for it, where the window is cut)."""
        self.start_s, self.n0, self.kv0, self.finishes = start_s, n, kv_tokens, finishes
        out: list[float] = []
        self.run(k, math.inf, out)
        self.num_steps = k
        if self.other_done_s < math.inf and self.state != COMPLETE:
            # (STEP_GAP: the step's end is its arithmetic's, known; JOB_ACTIVE: not known)
            out.append(self.end_s if self.state == STEP_GAP else self.other_done_s)
        return out

    def run(self, k: int, stop_s: float, ends: list[float] | None = None) -> None:
        """Replay the window's first k steps from the snapshot, through every event before
        ``stop_s`` (or until the other job is done), leaving the state at the stop;
        ``ends`` gets each completed step's end."""
        self._reset()
        finishes = self.finishes
        num_finishes = len(finishes)
        n, kv_tokens = self.n0, self.kv0
        t = self.start_s
        j = 0
        f = 0
        model = self.model
        while j < k:
            while f < num_finishes and finishes[f][0] <= j:  # (decoders whose last step is
                n -= 1  # before step j have left; as ``_stretches`` counts)
                kv_tokens -= finishes[f][1]
                f += 1
            if j == len(self._work):
                # (step j's KV: each decoder left holds its computed tokens plus j)
                private_s, work, weight, mr = model.decode_parts(n, kv_tokens + n * j)
                self._private_s.append(private_s)
                self._work.append(work)
                self._weight.append(weight)
                self._max_rate.append(model.max_rate if model.max_rate < mr else mr)
            self.step_start_s = t
            self.work = self._work[j]
            self.weight = self._weight[j]
            self.max_rate = self._max_rate[j]
            if not self._step(t, self._private_s[j], stop_s):
                return
            if ends is not None:
                ends.append(self.end_s)
            t = self.end_s
            j += 1
        self.state = COMPLETE

    def _advance(self, now_s: float, mine: bool) -> None:
        """``SharedResources._advance`` over the other job (and this step's, if active)."""
        dt = now_s - self.updated_s
        if dt > 0:
            x = self.other_rate * dt
            step = x if x < self.left else self.left  # min(rate * dt, work_left)
            self.left -= step
            self.other_work = self.other_work + step
            self.used += self.other_use * step
            if mine:
                x = self.rate * dt
                step = x if x < self.work_left else self.work_left
                self.work_left -= step
                self.own_work = self.own_work + step
                self.used += self.use * step
        self.updated_s = now_s

    def _step(self, t: float, private_s: float, stop_s: float) -> bool:
        """One step from ``t``: its job's start, its checks, its end. False: stopped inside
        (at ``stop_s`` or where the other job is done)."""
        if not t < stop_s:
            self.state = NOT_STARTED
            return False
        # RESOURCE_START: advance, then the shares of the two (``_reallocate``).
        self._advance(t, False)
        self.num_jobs += 1
        self.private_end_s = t + private_s
        self.work_left = self.work
        mine = self._mine
        mine.weight = self.weight
        mine.max_rate = self.max_rate
        self.other_rate, self.rate = two_job_rates(self.other, mine, self._capacity)
        self.num_changes += 1
        check_s = self._next_check(t, True)
        while True:
            self.check_s = check_s
            if not check_s < stop_s:
                self.state = JOB_ACTIVE
                return False
            self._advance(check_s, True)
            other_done = self.left <= self.other_rate * DONE_S
            if other_done:
                self.other_done_s = check_s
                self.state = JOB_ACTIVE
                return False
            self.num_changes += 1
            if self.work_left <= self.rate * DONE_S:
                break
            check_s = self._next_check(check_s, True)  # (the same shares again)
        # Its work is done: the other job alone until the step's arithmetic ends.
        self.work_left = 0.0
        self.rate = 0.0
        done_s = check_s
        self.other_rate = one_job_rate(self.other, self._capacity)
        pe = self.private_end_s
        self.end_s = pe if pe > done_s else done_s  # max(now, private end)
        check_s = self._next_check(done_s, False)
        while check_s <= self.end_s:  # (a check at the step's end comes before it)
            self.check_s = check_s
            if not check_s < stop_s:
                self.state = STEP_GAP
                return False
            self._advance(check_s, False)
            if self.left <= self.other_rate * DONE_S:
                self.other_done_s = check_s
                self.state = STEP_GAP
                return False
            self.num_changes += 1
            check_s = self._next_check(check_s, False)
        self.check_s = check_s
        if not self.end_s < stop_s:
            self.state = STEP_GAP
            return False
        return True

    def _next_check(self, now_s: float, mine: bool) -> float:
        """When ``_reallocate`` schedules its check: the first job's end at the shares."""
        b = self.other_rate
        next_s = self.left / b if b > 0 else math.inf
        if mine:
            a = self.rate
            x = self.work_left / a if a > 0 else math.inf
            if x < next_s:
                next_s = x
        if next_s < math.inf:
            return now_s + (next_s if next_s > 0.0 else 0.0)
        return math.inf
