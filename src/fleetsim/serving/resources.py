"""Shared fluid resources: capacity (bytes/s of a link or a DDR bus, SMs of an expert pool)
shared weighted max-min among the jobs using it, each job told once when its work is done.

The transfer service (``transfers.py``) is the special case of bytes on links; here a resource
is any capacity and a job any amount of work. A job does ``work`` units; while active it uses
``uses[r]`` units of resource ``r``'s capacity per unit of work per second (1 by default), so
at rate ``x`` (work/s) it draws ``x * uses[r]`` of ``r``. Rates are the weighted max-min fair
allocation (progressive filling): every active job's rate grows in proportion to its
``weight`` until it reaches its own ``max_rate`` or a resource it uses is full; then the others
go on growing. So no capacity is left idle that an unsatisfied job could use (work
conserving), and no job can be given more without taking from one whose rate per weight is
no larger (max-min fair). Fair shares of a resource's *capacity* (as a DDR controller hands out
bandwidth) follow from ``weight = uses[r]``; fair shares of jobs' speeds from equal weights.

A job first waits ``delay_s`` (a transfer's setup, a step's private part), then becomes
active. Rates change only when the set of active jobs (or a weight) changes: each change is
one event. A client alone on its resources may skip the jobs and price its work at the whole
capacity (a replica's steps and decode windows) by *holding* them: when a job comes, it hears
of it first (``hold``) and cuts its window there, as an arrival does.

Event kinds (same-time order, ``core.simulator``): ``RESOURCE_START`` (25) after transfer
starts, ``RESOURCE_CHECK`` (33) after transfer checks, before step ends, ``BESIDE_VERIFY``
(41) after step ends (a chained window beside a job checks that the job's replica started
the successor it priced, ``beside.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from fleetsim.core.simulator import Simulator

if TYPE_CHECKING:
    from fleetsim.serving.shared_steps import SharedSteps

RESOURCE_START: Final = 25  # a job's delay has passed: it starts drawing on its resources
RESOURCE_CHECK: Final = 33  # a job may have finished
BESIDE_VERIFY: Final = 41  # after step ends: did the other replica start the job priced?

DONE_S: Final = 1e-9  # a job with less than this many seconds of work left at its rate is done

ResourceKey = Hashable
ChangeFn = Callable[[], None]


class Hold:
    """A client's claim to run alone on resources (``SharedResources.hold``)."""

    __slots__ = ("on_change", "uses")

    def __init__(self, uses: dict[ResourceKey, float], on_change: ChangeFn) -> None:
        self.uses = uses
        self.on_change = on_change


class BesideChain(Protocol):
    """What a client running a window beside the one active job (``claim_beside``) says of
    that job's successors (``beside.py``, *Chains*): the service asks it instead of ending
    the window at the job's end and at its successor's start."""

    def takes_done(self, now_s: float) -> float:
        """The active job is done now: the successor's start if the window runs on through
        it (its replica's step end), else -1.0 (the window ends here)."""
        ...

    def expects(self, work: float, uses: Mapping[ResourceKey, float], weight: float,
                max_rate: float, delay_s: float, client: str, now_s: float) -> bool:
        """Whether a job so started now may be the successor priced (``adopt`` decides)."""
        ...

    def adopt(self, job: Job, now_s: float) -> float:
        """``job`` becomes active now: if it is the successor priced, its end (inf: not
        within the window) and the window runs on beside it; else -1.0."""
        ...

    def started(self, index: int) -> bool:
        """Whether the successor after the ``index``-th link has been adopted."""
        ...


# ``Job.single`` of a job on more than one resource (or none).
_ONE_OF_MANY: Final = object()  # (Final: a native static when compiled, not a lookup)


class Job:
    """One job on shared resources. Read-only for clients except through the service:
    ``work_left`` (units, exact at the last change), ``rate`` (work/s now; 0 before it is
    active), ``active``, ``done``."""

    __slots__ = ("active", "client", "done", "max_rate", "on_done", "on_rate", "rate",
                 "single", "single_use", "started_s", "uses", "weight", "work", "work_left")

    def __init__(self, work: float, uses: dict[ResourceKey, float], weight: float,
                 max_rate: float, on_done: Callable[[Job], None],
                 on_rate: Callable[[Job], None] | None, client: str) -> None:
        self.work = float(work)
        self.work_left = float(work)
        self.uses = uses
        # The one resource it uses and how much, when it uses exactly one (``_ONE_OF_MANY``
        # otherwise): the allocation's single-resource path reads them without a dict.
        self.single: ResourceKey = _ONE_OF_MANY
        self.single_use = 0.0
        if len(uses) == 1:
            for r, a in uses.items():
                self.single = r
                self.single_use = a
        self.weight = weight
        self.max_rate = max_rate
        self.on_done = on_done
        self.on_rate = on_rate
        self.client = client
        self.rate = 0.0
        self.active = False
        self.done = False
        self.started_s = math.nan  # when it became active

    def seconds_left(self) -> float:
        """Seconds to its end at its current rate (inf while inactive or starved)."""
        return self.work_left / self.rate if self.rate > 0 else math.inf


def max_min_rates(jobs: list[Job], capacity: Mapping[ResourceKey, float]) -> list[float]:
    """Weighted max-min fair rates (work/s) of ``jobs`` on resources of ``capacity`` (units/s):
    progressive filling. Pure: the service and the property tests both call it.

    Each round raises every unfrozen job's rate to ``weight x level`` for the largest level
    that breaks no capacity and no ``max_rate``, then freezes the jobs that hit a bound. A job
    using no finite resource and having no ``max_rate`` gets ``inf`` (it finishes at once)."""
    if jobs:
        key = jobs[0].single
        if key is not _ONE_OF_MANY:
            for j in jobs:
                k = j.single
                if k is not key and (k is _ONE_OF_MANY or k != key):
                    break
            else:
                return _one_resource_rates(jobs, key, capacity[key])
    return _progressive_filling(jobs, capacity)


def _progressive_filling(jobs: list[Job], capacity: Mapping[ResourceKey, float]) -> list[float]:
    """``max_min_rates`` over any resources (a dict per round)."""
    n = len(jobs)
    rates = [0.0] * n
    frozen = [False] * n
    left = {r: capacity[r] for j in jobs for r in j.uses}
    while not all(frozen):
        # Level at which each resource fills (given the frozen jobs' draw) and each job caps.
        demand: dict[ResourceKey, float] = {}
        for i, j in enumerate(jobs):
            if not frozen[i]:
                for r, a in j.uses.items():
                    if a > 0:
                        demand[r] = demand.get(r, 0.0) + a * j.weight
        level = math.inf
        for r, d in demand.items():
            if left[r] < math.inf:
                level = min(level, max(left[r], 0.0) / d)
        for i, j in enumerate(jobs):
            if not frozen[i]:
                level = min(level, j.max_rate / j.weight)
        full = {r for r, d in demand.items()
                if left[r] < math.inf and max(left[r], 0.0) / d <= level}
        for i, j in enumerate(jobs):
            if frozen[i]:
                continue
            capped = j.max_rate / j.weight <= level
            if capped or any(r in full for r, a in j.uses.items() if a > 0) or level == math.inf:
                x = j.max_rate if capped else j.weight * level
                rates[i] = x
                frozen[i] = True
                for r, a in j.uses.items():
                    if a > 0 and left[r] < math.inf:
                        left[r] -= a * x
    return rates


def _one_resource_rates(jobs: list[Job], key: ResourceKey, capacity: float) -> list[float]:
    """``max_min_rates`` when every job uses the one resource ``key`` (an SoC's DDR): the
    same rounds and the same float operations in the same order (so the same rates, bit for
    bit; ``tests/property`` checks it), on plain lists instead of a dict per round (the
    dicts were 16% of an Agent.xpu run, compiled). Python's ``min(a, b)`` and ``max(a, b)``
    are written out as the comparisons they make."""
    n = len(jobs)
    if n == 1:
        return [one_job_rate(jobs[0], capacity)]
    if n == 2:
        x, y = two_job_rates(jobs[0], jobs[1], capacity)
        return [x, y]
    uses = [j.single_use for j in jobs]  # (each job's ``uses[key]``, its one entry)
    rates = [0.0] * n
    frozen = [False] * n
    num_frozen = 0
    left = capacity
    while num_frozen < n:
        demand = 0.0
        drawn = False  # an unfrozen job draws on the resource (its demand is defined)
        for i in range(n):
            if not frozen[i] and uses[i] > 0:
                demand = demand + uses[i] * jobs[i].weight
                drawn = True
        level = math.inf
        fill = math.inf
        if drawn and left < math.inf:
            fill = (0.0 if left < 0.0 else left) / demand  # max(left, 0.0) / demand
            if fill < level:
                level = fill
        for i in range(n):
            if not frozen[i]:
                j = jobs[i]
                cap = j.max_rate / j.weight
                if cap < level:
                    level = cap
        full = drawn and left < math.inf and fill <= level
        for i in range(n):
            if frozen[i]:
                continue
            j = jobs[i]
            capped = j.max_rate / j.weight <= level
            if capped or (full and uses[i] > 0) or level == math.inf:
                x = j.max_rate if capped else j.weight * level
                rates[i] = x
                frozen[i] = True
                num_frozen += 1
                if uses[i] > 0 and left < math.inf:
                    left -= uses[i] * x
    return rates


def two_job_rates(a: Job, b: Job, capacity: float) -> tuple[float, float]:
    """``_one_resource_rates`` of two jobs: its rounds unrolled on locals, the same float
    operations in the same order (an SoC's NPU and iGPU both on the DDR, the common case:
    no lists a round; a window beside another job prices each of its steps so)."""
    ua, ub = a.single_use, b.single_use
    wa, wb = a.weight, b.weight
    ma, mb = a.max_rate, b.max_rate
    xa = xb = 0.0
    frozen_a = frozen_b = False
    left = capacity
    while not (frozen_a and frozen_b):  # (each round freezes at least one)
        demand = 0.0
        drawn = False
        if not frozen_a and ua > 0:
            demand = demand + ua * wa
            drawn = True
        if not frozen_b and ub > 0:
            demand = demand + ub * wb
            drawn = True
        level = math.inf
        fill = math.inf
        if drawn and left < math.inf:
            fill = (0.0 if left < 0.0 else left) / demand
            if fill < level:
                level = fill
        if not frozen_a:
            cap = ma / wa
            if cap < level:
                level = cap
        if not frozen_b:
            cap = mb / wb
            if cap < level:
                level = cap
        full = drawn and left < math.inf and fill <= level
        if not frozen_a:
            capped = ma / wa <= level
            if capped or (full and ua > 0) or level == math.inf:
                xa = ma if capped else wa * level
                frozen_a = True
                if ua > 0 and left < math.inf:
                    left -= ua * xa
        if not frozen_b:
            capped = mb / wb <= level
            if capped or (full and ub > 0) or level == math.inf:
                xb = mb if capped else wb * level
                frozen_b = True
                if ub > 0 and left < math.inf:
                    left -= ub * xb
    return xa, xb


def one_job_rate(j: Job, capacity: float) -> float:
    """``_one_resource_rates`` of one job: its one round (a lone job is frozen in the first:
    it reaches its cap or fills the resource, or the level is infinite), the same float
    operations without the round's lists (an SoC's NPU or iGPU alone on the DDR)."""
    use = j.single_use
    fill = math.inf  # the level at which it fills the resource
    if use > 0 and capacity < math.inf:
        fill = (0.0 if capacity < 0.0 else capacity) / (0.0 + use * j.weight)
    # The round's level is min(fill, cap): capped when cap <= fill, else it fills it.
    return j.max_rate if j.max_rate / j.weight <= fill else j.weight * fill


class SharedResources:
    """Resources of fixed capacity and the jobs sharing them (weighted max-min, fluid)."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.capacity: dict[ResourceKey, float] = {}  # resource -> units/s
        self._active: list[Job] = []
        self._holds: list[Hold] = []
        self._updated_s = 0.0
        self._version = 0  # invalidates completion checks scheduled before the last change
        self._check_times: list[float] = []  # the checks scheduled since (times)
        self.num_jobs = 0
        self.num_changes = 0  # allocations computed (each one an event that cuts windows)
        self.used_by_resource: dict[ResourceKey, float] = {}  # resource -> units drawn so far
        self.work_by_client: dict[str, float] = {}  # client -> work units done so far
        # resource -> the replicas' ports onto it (``shared_steps.py``): what a replica may
        # read of the others' steps, and whom it wakes when its own steps start or end.
        self.ports: dict[ResourceKey, list[SharedSteps]] = {}
        self._num_waiting = 0  # jobs started whose delay has not passed
        # A client running work beside the active jobs without telling the service
        # (``beside.py``): told first, once, before anything reads or changes the shares.
        self._beside: ChangeFn | None = None
        self._chain: BesideChain | None = None  # what it says of the job's successors
        self._num_links = 0  # links the window has run through (``BESIDE_VERIFY``'s index)
        sim.on(RESOURCE_START, self._on_start, "resource_start")
        sim.on(RESOURCE_CHECK, self._on_check, "resource_check")
        sim.on(BESIDE_VERIFY, self._on_verify, "beside_verify")

    def add(self, resource: ResourceKey, capacity_per_s: float) -> None:
        """Declare a resource and its capacity (units/s: bytes/s, SMs, ...; > 0, may be inf)."""
        if resource in self.capacity:
            raise ValueError(f"resource {resource!r} declared twice")
        if not capacity_per_s > 0:
            raise ValueError(f"resource {resource!r} capacity must be > 0, got "
                             f"{capacity_per_s}")
        self.capacity[resource] = float(capacity_per_s)
        self.used_by_resource[resource] = 0.0

    def hold(self, uses: Mapping[ResourceKey, float], on_change: ChangeFn) -> Hold:
        """A client that runs alone on ``uses``' resources priced its work at their whole
        capacity (a replica's step or decode window) instead of starting a job: the moment a
        job becomes active on one of them, ``on_change()`` is called once, first, and the hold
        is gone (the client turns what is left into a job). Only while nobody else is there
        (``busy_on`` is False)."""
        if self.busy_on(uses):
            raise ValueError("hold: the resources are in use; start a job instead")
        h = Hold(dict(uses), on_change)
        self._holds.append(h)
        return h

    def release(self, h: Hold) -> None:
        """The held work ended as priced."""
        self._holds = [x for x in self._holds if x is not h]

    def busy_on(self, uses: Mapping[ResourceKey, float]) -> bool:
        """Whether an active job or a hold draws on one of ``uses``' resources (or a window
        runs beside the jobs: in a chain's gap, its step's job is the one active)."""
        if self._beside is not None:
            return True
        if not self._active and not self._holds:
            return False
        keys = [r for r, a in uses.items() if a > 0]
        for j in self._active:
            job_uses = j.uses
            for r in keys:
                if job_uses.get(r, 0.0) > 0:
                    return True
        for h in self._holds:
            hold_uses = h.uses
            for r in keys:
                if hold_uses.get(r, 0.0) > 0:
                    return True
        return False

    def busy_on_one(self, resource: ResourceKey) -> bool:
        """``busy_on({resource: 1.0})`` without building its list (a replica's port asks at
        every step)."""
        if self._beside is not None:
            return True
        for j in self._active:
            single = j.single
            if single is _ONE_OF_MANY:
                if j.uses.get(resource, 0.0) > 0:
                    return True
            elif j.single_use > 0 and (single is resource or single == resource):
                return True
        for h in self._holds:  # noqa: SIM110 (a native loop compiled; ``any`` is generic)
            if h.uses.get(resource, 0.0) > 0:
                return True
        return False

    def start(self, work: float, uses: Mapping[ResourceKey, float],
              on_done: Callable[[Job], None], *, weight: float = 1.0,
              max_rate: float = math.inf, delay_s: float = 0.0,
              on_rate: Callable[[Job], None] | None = None, client: str = "") -> Job:
        """A job of ``work`` units drawing ``uses[r]`` of each resource per unit, active after
        ``delay_s``; ``on_done(job)`` once its work is done, ``on_rate(job)`` whenever its rate
        changes while active, its first rate included (after all new rates are set).
        ``client`` names who runs it (work is counted per client)."""
        for r, a in uses.items():
            if r not in self.capacity:
                raise ValueError(f"job on undeclared resource {r!r}")
            if not a >= 0:
                raise ValueError(f"job uses {a} of resource {r!r} per unit; must be >= 0")
        if not work >= 0:
            raise ValueError(f"job work must be >= 0, got {work}")
        if not weight > 0:
            raise ValueError(f"job weight must be > 0, got {weight}")
        if not max_rate > 0:
            raise ValueError(f"job max_rate must be > 0, got {max_rate}")
        if not delay_s >= 0:
            raise ValueError(f"job delay_s must be >= 0, got {delay_s}")
        # A window beside the jobs ends first: its step in progress, if it starts at this
        # instant, starts before this job, as stepping schedules them (unless the job may
        # be the successor it priced: ``_on_start`` decides).
        chain = self._chain
        if self._beside is not None and (chain is None or not chain.expects(
                work, uses, weight, max_rate, delay_s, client, self.sim.now_s)):
            self._end_beside()
        job = Job(work, dict(uses), float(weight), float(max_rate), on_done, on_rate, client)
        self.num_jobs += 1
        self._num_waiting += 1
        self.sim.schedule(self.sim.now_s + delay_s, RESOURCE_START, job)
        return job

    def set_weight(self, job: Job, weight: float) -> None:
        """Change an active (or waiting) job's weight now: the shares are recomputed."""
        if not weight > 0:
            raise ValueError(f"job weight must be > 0, got {weight}")
        if not job.active:
            job.weight = float(weight)
            return
        self._end_beside()
        self._advance()
        job.weight = float(weight)
        self._reallocate()

    @property
    def active(self) -> tuple[Job, ...]:
        self._end_beside()
        return tuple(self._active)

    def draw_now(self, resource: ResourceKey) -> float:
        """Units/s of ``resource`` the active jobs draw now."""
        self._end_beside()
        return sum(j.rate * j.uses.get(resource, 0.0) for j in self._active)

    def share_if_alone(self, uses: Mapping[ResourceKey, float],
                       max_rate: float = math.inf) -> float:
        """The rate a job of ``uses`` would get with no other job active."""
        rate = max_rate
        for r, a in uses.items():
            if a > 0:
                rate = min(rate, self.capacity[r] / a)
        return rate

    # ---- events ------------------------------------------------------------------------
    # ---- work beside the jobs (``beside.py``) ------------------------------------------
    def job_beside(self, uses: Mapping[ResourceKey, float], client: str) -> Job | None:
        """The one job a client on ``uses`` (one resource) could run a window beside: the
        only job active, on that one resource alone, with no rate listener, another
        client's, and nothing else pending (no job waiting to start, no hold, no other
        window beside); None otherwise."""
        if (len(self._active) != 1 or self._holds or self._num_waiting
                or self._beside is not None or len(uses) != 1):
            return None
        job = self._active[0]
        for r in uses:
            if job.single is _ONE_OF_MANY or job.single != r:
                return None
        if job.on_rate is not None or job.client == client:
            return None
        return job

    def claim_beside(self, on_change: ChangeFn, chain: BesideChain | None = None) -> None:
        """A client runs work beside the one active job (``job_beside``) without jobs of
        its own: before the next event or read of the shares, ``on_change()`` is called
        once, and it must leave the service as if its work had run as jobs
        (``resume_beside``). With a ``chain``, the job's end and its successor's start are
        asked of it first (``BesideChain``).

        The checks pending go stale, as its first job's start (at this instant) makes them in
        stepping, but one at this very instant: it may come before that start (an event of
        an earlier kind, as the claim may be made in), so it stays."""
        assert self._beside is None
        self._beside = on_change
        self._chain = chain
        self._num_links = 0
        now_s = self.sim.now_s
        now_too = now_s in self._check_times
        self._bump()
        if now_too:
            self._schedule_check(now_s)

    def resume_beside(self, updated_s: float, other: Job | None, other_left: float,
                      other_rate: float, work_by_client: Mapping[str, float], used: float,
                      resource: ResourceKey, num_changes: int, num_jobs: int,
                      job: Job | None, check_s: float, reschedule: bool,
                      job_first: bool = False) -> None:
        """The state stepping would have at this instant after a window beside ``other``
        (None: in a chain's gap, the last one done and its successor not started): its work
        left and rate, the clients' work and the resource's use so far, the window's jobs
        and allocations counted, the step in progress's ``job`` (if still active; before
        ``other`` in the list when ``job_first``) and, when ``reschedule``, the check
        stepping has pending (``check_s``; the ones scheduled before stand invalidated)."""
        self._beside = None
        self._chain = None
        self._updated_s = updated_s
        if other is not None:
            other.work_left = other_left
            other.rate = other_rate
        by_client = self.work_by_client
        for client, work in work_by_client.items():
            by_client[client] = work
        self.used_by_resource[resource] = used
        self.num_changes += num_changes
        self.num_jobs += num_jobs
        if job is not None:
            if job_first:
                self._active.insert(0, job)
            else:
                self._active.append(job)
        if reschedule:
            self._bump()
            if check_s < math.inf:
                self._schedule_check(check_s)

    @property
    def updated_s(self) -> float:
        """When the jobs' work left was last brought up to date."""
        return self._updated_s

    def check_at(self, t: float) -> None:
        """A check at ``t`` (valid until the next change of the shares)."""
        self._schedule_check(t)

    def _schedule_check(self, t: float) -> None:
        self.sim.schedule(t, RESOURCE_CHECK, self._version)
        self._check_times.append(t)

    def _bump(self) -> None:
        """Invalidate the checks scheduled so far."""
        self._version += 1
        self._check_times.clear()

    def _end_beside(self) -> None:
        on_change = self._beside
        if on_change is not None:
            self._beside = None
            self._chain = None
            on_change()

    def _on_start(self, job: Job) -> None:
        if self._beside is not None:
            chain = self._chain
            done_s = chain.adopt(job, self.sim.now_s) if chain is not None else -1.0
            if done_s >= 0.0:
                # The successor the window priced: active beside it (no advance and no
                # allocation: the window's replay makes them).
                self._num_waiting -= 1
                job.active = True
                job.started_s = self.sim.now_s
                self._active.append(job)
                if done_s < math.inf:
                    self._schedule_check(done_s)
                return
            self._end_beside()
        self._num_waiting -= 1
        self._notify(job)
        self._advance()
        job.active = True
        job.started_s = self.sim.now_s
        self._active.append(job)
        self._reallocate()

    def _on_check(self, version: int) -> None:
        if version != self._version:
            return
        if self._beside is not None:
            chain = self._chain
            start_s = chain.takes_done(self.sim.now_s) if chain is not None else -1.0
            if start_s >= 0.0:
                # A link of the window's chain: the job is done (its work and the shares as
                # the replay has them); its replica plans, and should start the successor at
                # ``start_s``: checked then, after same-time step ends.
                assert len(self._active) == 1
                j = self._active.pop()
                j.active = False
                j.done = True
                j.work_left = 0.0
                self.sim.schedule(start_s, BESIDE_VERIFY, (chain, self._num_links))
                self._num_links += 1
                j.on_done(j)
                return
            # A window runs beside the job: it leaves the state stepping has now, with the
            # check stepping has pending rescheduled. If it had not started its first step
            # (it opened at this instant), that step's start comes first, as stepping orders
            # them: this check goes behind it.
            self._end_beside()
            if version == self._version:
                self._schedule_check(self.sim.now_s)
            return
        self._advance()
        done = [j for j in self._active if j.work_left <= j.rate * DONE_S]
        if done:
            self._active = [j for j in self._active if not any(j is d for d in done)]
            for j in done:
                j.active = False
                j.done = True
                j.work_left = 0.0
        self._reallocate()
        for j in done:
            j.on_done(j)

    def _on_verify(self, payload: tuple[BesideChain, int]) -> None:
        """After the other replica's step end at a link: the window ends here unless that
        replica started the successor it priced (a plan of another step cut it already)."""
        chain, index = payload
        if self._beside is not None and self._chain is chain and not chain.started(index):
            self._end_beside()

    def _notify(self, job: Job) -> None:
        if not self._holds:
            return
        hit = [h for h in self._holds
               if any(a > 0 and h.uses.get(r, 0.0) > 0 for r, a in job.uses.items())]
        if hit:
            self._holds = [h for h in self._holds if not any(h is x for x in hit)]
            for h in hit:
                h.on_change()

    def _advance(self) -> None:
        now = self.sim.now_s
        dt = now - self._updated_s
        if dt > 0:
            used, by_client = self.used_by_resource, self.work_by_client
            for j in self._active:
                step = min(j.rate * dt, j.work_left)
                j.work_left -= step
                by_client[j.client] = by_client.get(j.client, 0.0) + step
                for r, a in j.uses.items():
                    used[r] += a * step
        self._updated_s = now

    def _reallocate(self) -> None:
        self._bump()
        self.num_changes += 1
        active = self._active
        if not active:
            return
        rates = max_min_rates(active, self.capacity)
        changed: list[Job] = []
        next_s = math.inf
        for i in range(len(active)):  # (by index: ``zip(..., strict=True)`` is a generic call
            j, x = active[i], rates[i]  # when compiled)
            if x != j.rate:
                changed.append(j)
            j.rate = x
            next_s = min(next_s, j.work_left / x if x > 0 else math.inf)
        if next_s < math.inf:
            self._schedule_check(self.sim.now_s + max(next_s, 0.0))
        for j in changed:
            if j.on_rate is not None:
                j.on_rate(j)
