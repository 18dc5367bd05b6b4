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
there the other replica plans again, unless it is a *link* of a chain.

**Chains.** The other replica often plans, at that end, the very next job the replay could
have priced: an NPU prefilling one prompt in chunks starts the prompt's next chunk. The port
predicts such successors (``successor``: their parts, from the other replica's step in
progress), and the replay runs on through them: at the other job's end it makes the service's
reallocation (this window's step's job alone), waits out the other replica's step end (the
gap, ``max(done, its private end)``) and starts the successor as ``_on_start`` would (this
step's job now *before* it in the service's list: its advances come first). A link is taken
only where this window's step has its job active then and through the gap (its check falls
after it), so the successor starts as a job beside it, as in stepping (on a free resource it
would be priced alone and held), and the order of same-time events never needs guessing.
The prediction is only a guess: the service tells the port of the other job's end
(``takes_done``), asks it at the successor's start whether that job is the one priced
(``expects``, ``adopt``: every float of the job and the other replica's private end) and
checks after the other replica's step end that it started one (``BESIDE_VERIFY``); anything
else cuts the window there, with the state stepping has (a replay stops inside the gap as
well as anywhere else). The other replica's own steps stay events: only this window's
stepping is saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from fleetsim.serving.resources import DONE_S, Job, ResourceKey, one_job_rate, two_job_rates

if TYPE_CHECKING:
    from fleetsim.serving.shared_steps import SharedStepModel

# Where the replay stopped: the state of the step in progress at the stop.
NOT_STARTED: Final = 0  # its job's start is still to come (at the stop itself)
JOB_ACTIVE: Final = 1  # its job draws on the resource
STEP_GAP: Final = 2  # its work is done; its arithmetic (the private part) ends at ``end_s``
COMPLETE: Final = 3  # every step asked for is done


Successor = Callable[[int], "tuple[float, float, float, float] | None"]
"""The other job's i-th predicted successor (``SharedSteps.chunk_successors``): its step's
parts as its job would start (private seconds, work, weight, most work/s), or None."""


def _ignore(job: Job) -> None:
    pass


class BesideReplay:
    """The service's events over a window's decode steps, each step a job beside the one
    other job ``other``: run once when the window opens (its end times, and when ``other``
    ends) and again, from the same snapshot, when it is cut or ends (the state then)."""

    def __init__(self, model: SharedStepModel, key: ResourceKey, capacity: float, client: str,
                 other: Job, updated_s: float, work_by_client: dict[str, float],
                 used: float, other_private_end_s: float = math.inf,
                 successor: Successor | None = None) -> None:
        self.model = model
        self.client = client
        self.other = other
        self.first = other  # (``other`` moves along a chain; each replay starts from this one)
        # The snapshot every replay starts from (the service's state as the window opens).
        self.left0 = other.work_left
        self.rate0 = other.rate
        self.updated0 = updated_s
        self.other_work0 = work_by_client.get(other.client, 0.0)
        self.own_work0 = work_by_client.get(client, 0.0)
        self.used0 = used
        self.other_use0 = other.single_use
        self.other_use = other.single_use
        self.use = 1.0
        # The chain (module note): the other job's private end, its predicted successors
        # (``successor(i)``: the i-th one's parts, or None), as Jobs only the allocation
        # reads, and what the first replay found at each of the other jobs' ends: when it
        # was done, whether the chain went on there and, if so, when the successor started.
        self.pe0 = other_private_end_s
        self._successor = successor
        self.key = key
        self.successors: list[Job] = []
        self.successor_private_s: list[float] = []
        self.done_s: list[float] = []  # each other job's end, in chain order
        self.start_s_of: list[float] = []  # each link's successor start
        self.num_links = 0  # links the first replay took (the chain's other jobs - 1)
        # The service's progress along the chain (the port counts what it was told): links
        # it has been told of, successors it has started (``adopt``), those jobs.
        self.links_done = 0
        self.starts_done = 0
        self.jobs: list[Job] = [other]
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
        self.other = self.first
        self.other_use = self.other_use0
        self.cur = 0  # which of the chain's jobs ``other`` is
        self.other_on = True  # False in a gap: the other job done, its successor to come
        self.other_pe = self.pe0  # the other job's private end (its replica's step end)
        self.mine_first = False  # this step's job is before the other in the service's list
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
        unknown: the other job's end stands for it, where the window is cut) or, along a
        chain, the last of its successors priced does."""
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
        ``stop_s`` (and the links and successor starts at it that the service has run:
        ``links_done``, ``starts_done``), or until the chain's last job is done, leaving
        the state at the stop; ``ends`` gets each completed step's end."""
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
        """``SharedResources._advance`` over the other job (and this step's, if active), in
        the service's list order."""
        dt = now_s - self.updated_s
        if dt > 0:
            if mine and self.mine_first:
                self._advance_mine(dt)
            if self.other_on:
                x = self.other_rate * dt
                step = x if x < self.left else self.left  # min(rate * dt, work_left)
                self.left -= step
                self.other_work = self.other_work + step
                self.used += self.other_use * step
            if mine and not self.mine_first:
                self._advance_mine(dt)
        self.updated_s = now_s

    def _advance_mine(self, dt: float) -> None:
        x = self.rate * dt
        step = x if x < self.work_left else self.work_left
        self.work_left -= step
        self.own_work = self.own_work + step
        self.used += self.use * step

    def _step(self, t: float, private_s: float, stop_s: float) -> bool:
        """One step from ``t``: its job's start, its checks, its end. False: stopped inside
        (at ``stop_s`` or where the other job is done and the chain ends)."""
        if not t < stop_s:
            self.state = NOT_STARTED
            return False
        # RESOURCE_START: advance, then the shares of the two (``_reallocate``).
        self._advance(t, False)
        self.mine_first = False  # (appended after the other job)
        self.num_jobs += 1
        self.private_end_s = t + private_s
        self.work_left = self.work
        mine = self._mine
        mine.weight = self.weight
        mine.max_rate = self.max_rate
        assert self.other_on  # (a chain's gap ends inside the step it falls in: ``_gap_end``)
        self.other_rate, self.rate = two_job_rates(self.other, mine, self._capacity)
        self.num_changes += 1
        check_s = self._next_check(t, True)
        while True:
            self.check_s = check_s
            if not check_s < stop_s and not self._link_ran(check_s, stop_s):
                self.state = JOB_ACTIVE
                return False
            self._advance(check_s, True)
            if self.other_on and self.left <= self.other_rate * DONE_S:
                self.state = JOB_ACTIVE
                if not self._link(check_s, True, stop_s):
                    return False
                check_s = self._next_check(self.updated_s, True)
                continue
            self.num_changes += 1
            if self.work_left <= self.rate * DONE_S:
                break
            check_s = self._next_check(check_s, True)  # (the same shares again)
        # Its work is done: the other job alone until the step's arithmetic ends.
        self.work_left = 0.0
        self.rate = 0.0
        done_s = check_s
        self.other_rate = one_job_rate(self.other, self._capacity)  # (no gap past its job)
        pe = self.private_end_s
        self.end_s = pe if pe > done_s else done_s  # max(now, private end)
        check_s = self._next_check(done_s, False)
        while check_s <= self.end_s:  # (a check at the step's end comes before it)
            self.check_s = check_s
            if not check_s < stop_s and not self._link_ran(check_s, stop_s):
                self.state = STEP_GAP
                return False
            self._advance(check_s, False)
            if self.other_on and self.left <= self.other_rate * DONE_S:
                self.state = STEP_GAP
                if not self._link(check_s, False, stop_s):
                    return False
                check_s = self._next_check(self.updated_s, False)
                continue
            self.num_changes += 1
            check_s = self._next_check(check_s, False)
        self.check_s = check_s
        if not self.end_s < stop_s:
            self.state = STEP_GAP
            return False
        return True

    def _link_ran(self, check_s: float, stop_s: float) -> bool:
        """Whether the check at ``check_s == stop_s`` is the other job's end that the service
        has already run as a link (the stop comes after it: ``takes_done``)."""
        return (check_s == stop_s and self.cur < self.links_done
                and self.done_s[self.cur] == check_s)

    def _link(self, t_d: float, mine_active: bool, stop_s: float) -> bool:
        """The other job is done at ``t_d`` (advanced to it; ``state`` set as stepping
        stands if the window stops here): go on to its successor if the chain has one and
        this step's job runs on beside it (decided by the first replay, as it prices the
        window, and followed by every later one), else stop here (``other_done_s``).
        False: stopped (here, or inside the gap, at ``stop_s``)."""
        i = self.cur
        if i == len(self.done_s):  # (the first replay: decide)
            self.done_s.append(t_d)
            self.start_s_of.append(self._gap_end(t_d, mine_active))
        t_e = self.start_s_of[i]
        if not t_e < math.inf:
            self.other_done_s = t_d
            return False
        if i == self.num_links:
            self.num_links += 1
        # ``_on_check``: the other job leaves; ``_reallocate`` gives this step's job the
        # resource alone, with a check at its end (after the gap: ``_gap_end``).
        self.num_changes += 1
        self.other_on = False
        self.left = 0.0
        self.other_rate = 0.0
        self.rate = one_job_rate(self._mine, self._capacity)
        self.check_s = self._next_check(t_d, True)
        if not t_e < stop_s and not (t_e == stop_s and i < self.starts_done):
            return False  # stopped in the gap (``state`` as the caller set it)
        # ``_on_start`` of the successor: advance (this step's job alone), then the shares.
        self._advance(t_e, True)
        nxt = self.successors[i]
        self.cur = i + 1
        self.other = nxt
        self.other_use = nxt.single_use
        self.other_on = True
        self.left = nxt.work
        self.other_pe = t_e + self.successor_private_s[i]
        self.mine_first = True  # (the successor is appended after it)
        self.num_changes += 1
        self.other_rate, self.rate = two_job_rates(nxt, self._mine, self._capacity)
        return True

    def _gap_end(self, t_d: float, mine_active: bool) -> float:
        """When the other job's successor would start after it is done at ``t_d`` (its
        replica's step end), or inf where the chain ends here: no successor, or this
        window's step would be done at or before it (the order of same-time events of two
        replicas' steps is not the replay's to know; once done, its step holds no job, and
        the successor would start alone), or its job is not active (the same)."""
        i = self.cur
        successor = self._successor
        # Only while this step's job is active and not done with the other: in its step's
        # gap (work done, arithmetic going on) the resource would be free at the
        # successor's start, which its replica would then price alone and hold.
        if (successor is None or not mine_active
                or self.work_left <= self.rate * DONE_S):
            return math.inf
        pe = self.other_pe
        t_e = pe if pe > t_d else t_d
        if not t_e < math.inf:
            return math.inf
        rate = one_job_rate(self._mine, self._capacity)
        x = self.work_left / rate if rate > 0 else math.inf
        if not t_d + (x if x > 0.0 else 0.0) > t_e:
            return math.inf  # (its job done in the gap: it would check, then step alone)
        if i == len(self.successors):
            parts = successor(i)
            if parts is None:
                return math.inf
            private_s, work, weight, max_rate = parts
            self.successors.append(Job(work, {self.key: 1.0}, weight, max_rate, _ignore,
                                       None, self.other.client))
            self.successor_private_s.append(private_s)
        return t_e

    def _next_check(self, now_s: float, mine: bool) -> float:
        """When ``_reallocate`` schedules its check: the first job's end at the shares."""
        next_s = math.inf
        if self.other_on:
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
