"""A step as a job on a shared resource: replicas whose steps draw on one capacity that other
replicas' steps draw on too (ExpertPlex's expert pool SMs; an SoC's DDR bandwidth).

A step has a *private* part (attention on the replica's own GPUs: seconds, whatever the others
do) and then *shared work* on the resource (expert GEMMs: units of the resource, done at the
rate the resource's max-min share gives it, ``resources.py``). Within a real step the two
alternate layer by layer; the fluid model puts the private part first: a step's length is the
same under a constant share, and the shared part draws on the resource only while it runs, so
another replica's work takes the capacity this one leaves (what ExpertPlex's persistent
kernels do at tile boundaries). ``overlap`` models a replica that overlaps the two (two
micro-batches in flight): the shared part starts with the private one and the step ends when
both are done.

Exact under fast-forward: a replica whose resource nobody else uses prices its steps (and its
decode windows) at the whole resource, as a plain step model, and *holds* the resource: the
moment another job or holder comes, the service tells it first (``SharedResources.hold``), it
cuts its window back to the step in progress (``Replica.interrupt``), and turns what is left of
that step into a job at the shared rates. A replica alone for a whole run therefore gives
exactly the results of a plain replica whose step model is ``private + work / capacity``.

The replicas on one resource may read what the others run (``ReplicaView.co_resident_steps``)
and price how much a step of theirs would slow those steps (``slowdowns``): a policy may then
decline to start work (``StepPlan.wait_for_co_resident``; Agent.xpu's bandwidth-aware
dispatch). Such a replica sleeps until another replica on the resource starts or ends a step
(``announce``): one more event, at a time stepping would also plan, so fast-forward stays
exact (reading the others cuts their windows back to the step in progress). A wait that says
why (``StepPlan.wait_rule``) is asked instead of woken: where the resource has one other
replica, a step of that replica the rule holds against leaves the waiting one asleep (it
would plan the same wait), and that replica's decode windows run as long as each of their
steps holds (``steps_held``), instead of one step at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from fleetsim.perf.soc import SocSplit
from fleetsim.serving.beside import JOB_ACTIVE, NOT_STARTED, BesideReplay, Successor
from fleetsim.serving.contract import RepeatRule, WaitRule, new_named_tuple
from fleetsim.serving.resources import (
    Hold,
    Job,
    ResourceKey,
    SharedResources,
    max_min_rates,
    one_job_rate,
    two_job_rates,
)

if TYPE_CHECKING:
    from fleetsim.serving.replica import Replica
    from fleetsim.serving.request import Request
    from fleetsim.serving.window import DecodeWindows, Step


class StepDemand(NamedTuple):
    """One step's parts: ``private_s`` on its own GPUs, ``work`` units of the shared resource,
    and its ``weight`` in the resource's max-min share while it runs."""

    private_s: float
    work: float
    weight: float = 1.0
    max_rate: float = math.inf
    """The most work/s this step can take (an SoC step's DDR demand: a compute-bound step
    draws only what feeds its arithmetic), besides the model's ``max_rate``."""


class StepSplit(Protocol):
    """Splits a step (the arguments of ``StepTimeModel.step_time_s``) into its parts: a
    ``StepDemand`` or a plain ``(private_s, work, weight)`` tuple (so a cost model outside
    ``serving/`` need not import it), optionally with the step's own ``max_rate``."""

    def split(self, chunks: Sequence[tuple[int, int]], num_decode: int,
              kv_tokens: int) -> tuple[float, ...]: ...


class SharedStepModel:
    """A step model whose shared part runs on ``resource`` (``capacity_per_s`` units/s in
    all, at most ``max_rate`` for one step): as a ``StepTimeModel`` it prices a step run alone
    (``private_s + work / alone rate``, or their max when ``overlap``); the cluster runs its
    steps as jobs when the resource is shared."""

    def __init__(self, split: StepSplit, resource: ResourceKey, capacity_per_s: float, *,
                 max_rate: float = math.inf, overlap: bool = False,
                 per_replica: bool = False) -> None:
        if not capacity_per_s > 0:
            raise ValueError(f"capacity_per_s must be > 0, got {capacity_per_s}")
        if not max_rate > 0:
            raise ValueError(f"max_rate must be > 0, got {max_rate}")
        self.splitter = split
        # The SoC's split, called directly (through the protocol, a compiled call is a
        # generic one: its arguments boxed, 1-2k instructions a step).
        self._soc_split = split if isinstance(split, SocSplit) else None
        self.resource = resource
        self.capacity_per_s = float(capacity_per_s)
        self.max_rate = float(max_rate)
        self.overlap = overlap
        # Each replica of the pool gets its own copy of the resource (an instance's own
        # expert shard) instead of all sharing one.
        self.per_replica = per_replica
        self.alone_rate = min(self.max_rate, self.capacity_per_s)
        # A short decode window may be priced step by step (``window.SCALAR_WINDOW_STEPS``)
        # when the split says its ``split`` has no side effect and its ``decode_private_s``
        # makes the same float operations (``scalar_windows``; ExpertPlex's decode split
        # updates the pool's allocation as it prices a step, so it does not).
        self.scalar_windows = bool(getattr(split, "scalar_windows", False))

    def demand(self, chunks: Sequence[tuple[int, int]], num_decode: int,
               kv_tokens: int) -> StepDemand:
        d = self.splitter.split(chunks, num_decode, kv_tokens)
        if isinstance(d, StepDemand):
            return d
        if len(d) == len(StepDemand._fields):
            # Every field given: the tuple as is, typed (``StepDemand(*d)`` runs the named
            # tuple's Python-level ``__new__``, 2.5k instructions a step when compiled).
            return new_named_tuple(StepDemand, d)
        return StepDemand(*d)

    def parts(self, chunks: Sequence[tuple[int, int]], num_decode: int,
              kv_tokens: int) -> tuple[float, float, float, float]:
        """``demand``'s (private seconds, work, weight, the step's most work/s) as plain
        floats: a compiled caller reads them without a named tuple."""
        soc = self._soc_split
        if soc is not None:
            return soc.split(chunks, num_decode, kv_tokens)
        d = self.splitter.split(chunks, num_decode, kv_tokens)
        n = len(d)
        return (float(d[0]), float(d[1]), float(d[2]) if n > 2 else 1.0,
                float(d[3]) if n > 3 else math.inf)

    def decode_parts(self, num_decode: int, kv_tokens: int
                     ) -> tuple[float, float, float, float]:
        """``parts`` of a decode-only step (the SoC's without its walk over prefill chunks)."""
        soc = self._soc_split
        if soc is not None:
            return soc.decode_split(num_decode, kv_tokens)
        return self.parts((), num_decode, kv_tokens)

    def step_time_s(self, chunks: Sequence[tuple[int, int]], num_decode: int,
                    kv_tokens: int) -> float:
        private_s, work, _, max_rate = self.parts(chunks, num_decode, kv_tokens)
        return self._alone_s(private_s, work, max_rate)

    def decode_step_s(self, num_decode: int, kv_tokens: int) -> float:
        """``step_time_s((), num_decode, kv_tokens)``: a decode window's step alone."""
        soc = self._soc_split
        if soc is not None:
            return soc.decode_alone_s(num_decode, kv_tokens, self.alone_rate, self.overlap)
        private_s, work, _, max_rate = self.decode_parts(num_decode, kv_tokens)
        return self._alone_s(private_s, work, max_rate)

    def _alone_s(self, private_s: float, work: float, max_rate: float) -> float:
        """A step's length with its shared work at the whole resource (capped by the step)."""
        rate = self.alone_rate
        shared_s = work / (rate if rate <= max_rate else max_rate)  # min(alone, step's)
        return max(private_s, shared_s) if self.overlap else private_s + shared_s

    def decode_step_times_s(self, num_decode: int, kv_tokens: np.ndarray) -> np.ndarray:
        """Decode-only steps alone, for each ``kv``: vectorized when the split offers
        ``decode_private_s(num_decode, kv) -> (private_s array, work[, max_rate array])``
        (with the same float operations as ``split``), else one ``step_time_s`` each."""
        vec = getattr(self.splitter, "decode_private_s", None)
        if vec is None:
            return np.array([self.step_time_s((), num_decode, int(kv)) for kv in kv_tokens])
        parts = vec(num_decode, kv_tokens)  # (private_s, work[, each step's max_rate])
        private_s, work = parts[0], parts[1]
        rate = self.alone_rate if len(parts) < 3 else np.minimum(self.alone_rate, parts[2])
        shared_s = work / rate
        return np.maximum(private_s, shared_s) if self.overlap else private_s + shared_s


class SharedSteps:
    """One replica's port onto the shared resource (built by the cluster): decides whether a
    step runs alone (priced by the model, holding the resource) or as a job, and turns a
    held step into a job when someone else comes."""

    def __init__(self, service: SharedResources, model: SharedStepModel, client: str,
                 resource: ResourceKey) -> None:
        self.service = service
        self.model = model
        self.key = resource
        self.uses = {resource: 1.0}
        self.client = client
        self.replica: Replica | None = None
        self._hold: Hold | None = None
        self._job: Job | None = None
        self._used_blocks = 0  # KV blocks in use during the job's step
        self._job_private_end_s = 0.0  # overlap: when the step's private part ends
        self._job_step: Step | None = None
        self.num_alone_steps = 0
        self.num_shared_steps = 0
        self.peers: list[SharedSteps] = []  # every port onto the resource, this one included
        self.waiting = False  # the replica sleeps until another one's step starts or ends
        self.wait_rule: WaitRule | None = None  # why it waits, if its plan said
        self.num_waits = 0
        # A decode window run beside the one other job on the resource (``beside.py``).
        self._beside: BesideReplay | None = None
        self._beside_step: Step | None = None
        self.num_windows_beside = 0
        self.num_links = 0  # chain links its windows beside ran through (``beside.py``)

    def co_residents(self) -> list[SharedSteps]:
        """The other replicas' ports onto this port's resource."""
        return [p for p in self.peers if p is not self and p.replica is not None]

    def wait(self, rule: WaitRule | None = None) -> bool:
        """The replica sleeps until another replica on the resource starts or ends a step
        (one its ``rule`` holds against leaves it asleep: ``announce``); False (and no
        sleep) when none is stepping or about to, as nothing would wake it."""
        others = self.co_residents()
        if not any(p.replica is not None and p.replica.busy for p in others):
            return False
        self.waiting = True
        self.wait_rule = rule
        self.num_waits += 1
        if rule is not None:
            # A window the others opened before (without this rule, or under an earlier
            # one) ends with its step in progress: from here their steps are asked of this
            # rule (a no-op where the plan read their steps, which cut them already).
            _cut_windows(others)
        return True

    def stop_waiting(self) -> None:
        self.waiting = False
        self.wait_rule = None

    def drop_wait_rule(self) -> None:
        """The sleeping replica's state is read or changed from outside (an abort, a
        request taken away, a re-sort: each cuts windows first, ``Replica.interrupt``): its
        rule may no longer give its plan, so it sleeps as a wait without one, woken at the
        other's next step start or end; the other's window, opened through steps the rule
        held against, ends with its step in progress (exact either way)."""
        self.wait_rule = None
        _cut_windows(self.co_residents())

    def others_waiting(self) -> bool:
        """Whether another replica on the resource sleeps until this one starts a step: woken
        then, it reads this one's step or starts one of its own, either of which cuts a window
        back to its first step (so one is not worth opening; speed only)."""
        return any(p.waiting for p in self.peers if p is not self)

    def rule_waiter(self) -> SharedSteps | None:
        """The resource's one other port, if it sleeps under a wait rule (``announce`` asks
        the rule rather than waking it; a decode window runs while its steps hold)."""
        peers = self.peers
        if len(peers) != 2:
            return None
        other = peers[0] if peers[1] is self else peers[1]
        return other if other.waiting and other.wait_rule is not None else None

    def announce(self) -> None:
        """This replica started a step, ended one or stopped: the others waiting plan again
        (after every input of this instant), but for one whose wait rule holds against the
        step this one has just started (it would plan the same wait: ``StepPlan.wait_rule``)."""
        kept = self.rule_waiter()
        if kept is not None and self._held_by(kept):
            return  # (with two ports, the only one that could be waiting)
        for p in self.peers:
            if p.waiting and p is not self:
                p.stop_waiting()
                replica = p.replica
                assert replica is not None
                replica.wake()

    def _held_by(self, waiter: SharedSteps) -> bool:
        """Whether ``waiter``'s rule holds against the step this replica has just started (as
        its plan would read it: ``ReplicaView.co_resident_steps``, ``slowdowns``)."""
        replica = self.replica
        assert replica is not None
        step = replica.current_step
        if step is None or step.end_s <= replica.sim.now_s:
            return False  # no step (stopped, waiting) or one that ends now: it plans
        rule = waiter.wait_rule
        assert rule is not None
        bound = rule.max_slowdown(step.decodes)
        if bound == math.inf:
            return False
        return waiter.slowdowns([(self, step)], rule.prefill_chunks, rule.num_decode,
                                rule.decode_kv_tokens)[0] > bound

    def steps_held(self, decodes: list[Request], num_decode: int, kv_tokens: int,
                   k: int) -> int:
        """Of a decode window's first ``k`` steps (``decodes``, ``num_decode`` of them with
        ``kv_tokens`` computed at its first step and one more each a step), how many leading
        ones the waiting port's rule holds against (``rule_waiter``; at least 1: the first
        is asked when it starts, ``announce``). Each step's slowdown as ``slowdowns`` prices
        it: the waiting step's job built once, the step's own parts and rates per step."""
        waiter = self.rule_waiter()
        assert waiter is not None
        rule = waiter.wait_rule
        assert rule is not None
        bound = rule.max_slowdown(decodes)  # (one batch throughout)
        if bound == math.inf:
            return 1
        w_model = waiter.model
        w_private_s, w_work, w_weight, w_max_rate = w_model.parts(
            rule.prefill_chunks, rule.num_decode, rule.decode_kv_tokens)
        waiting_job = Job(w_work, waiter.uses, w_weight, min(w_model.max_rate, w_max_rate),
                          _ignore, None, "")
        model = self.model
        # The step's job, its fields set per step (the allocation reads its weight and most
        # rate, not its work: one job for the window, not two jobs a step).
        job = Job(0.0, self.uses, 1.0, math.inf, _ignore, None, "")
        # Both on this one resource (the waiter's port is onto it): ``max_min_rates``' one-
        # and two-job rounds, called directly (the same floats, without a list a call).
        capacity = waiter.service.capacity[self.key]
        for j in range(k):
            # (``decode_parts``: ``parts`` of a step without chunks, the same float operations)
            private_s, work, weight, max_rate = model.decode_parts(num_decode,
                                                                   kv_tokens + num_decode * j)
            job.weight = weight
            job.max_rate = min(model.max_rate, max_rate)
            slowdown = _slowdown(model.overlap, private_s, work,
                                 one_job_rate(job, capacity),
                                 two_job_rates(job, waiting_job, capacity)[0])
            if not slowdown > bound:
                return j if j > 0 else 1
        return k

    def slowdowns(self, steps: Sequence[tuple[SharedSteps, Step]],
                  chunks: Sequence[tuple[int, int]], num_decode: int,
                  kv_tokens: int) -> list[float]:
        """How many times longer each of ``steps`` (other ports' steps in progress) would take
        with a step of this shape beside them: their whole demands at the max-min shares with
        and without it, as if each ran throughout (1.0: not slowed)."""
        # (Their parts as plain floats and the jobs built once, in loops: the demands as
        # named tuples, a closure and star-args calls were ~20k instructions a call, and
        # Agent.xpu's dispatch asks at every co-resident step while a proactive step waits.)
        # ``max_min_rates`` is pure: the same jobs serve both allocations.
        others: list[tuple[SharedStepModel, float, float]] = []  # (model, private_s, work)
        jobs: list[Job] = []
        for p, step in steps:
            s_chunks, s_decode, s_kv = _step_args(step)
            model = p.model
            private_s, work, weight, max_rate = model.parts(s_chunks, s_decode, s_kv)
            others.append((model, private_s, work))
            jobs.append(Job(work, p.uses, weight, min(model.max_rate, max_rate), _ignore, None,
                            ""))
        capacity = self.service.capacity
        without = max_min_rates(jobs, capacity)
        private_s, work, weight, max_rate = self.model.parts(chunks, num_decode, kv_tokens)
        jobs.append(Job(work, self.uses, weight, min(self.model.max_rate, max_rate), _ignore,
                        None, ""))
        beside = max_min_rates(jobs, capacity)
        out: list[float] = []
        for i in range(len(others)):
            model, private_s, work = others[i]
            out.append(_slowdown(model.overlap, private_s, work, without[i], beside[i]))
        return out

    def alone(self) -> bool:
        """Whether nobody else draws on (or holds) the resource now."""
        return not self.service.busy_on_one(self.key)

    def hold(self) -> None:
        """The step (or window) just started was priced alone: hold the resource until it
        ends or until someone else comes (then ``_share`` re-times what is left of it)."""
        assert self._hold is None
        self.num_alone_steps += 1
        self._hold = self.service.hold(self.uses, self._share)

    def release(self) -> None:
        """The held step (or window) ended as priced: give the resource back (a window
        beside another job: the service's state as stepping leaves it at its end)."""
        if self._hold is not None:
            self.service.release(self._hold)
            self._hold = None
        elif self._beside is not None:
            step = self._beside_step
            assert step is not None
            self._end_beside(step, step.num_steps, math.inf)

    # ---- decode windows beside another job (``beside.py``) ------------------------------
    def can_window_beside(self) -> bool:
        """Whether a decode window may run beside the resource's one other job, replayed:
        the steps overlap their parts (their jobs start with them), their split has no side
        effect (the replay prices the window's steps before stepping would), nobody waits on
        this replica's steps, and the service has exactly one job it can be run beside."""
        model = self.model
        return (model.overlap and model.scalar_windows and not self.others_waiting()
                and self.service.job_beside(self.uses, self.client) is not None)

    def open_beside(self, windows: DecodeWindows, step: Step, until_s: float,
                    through: bool = False, rule: RepeatRule | None = None) -> float | None:
        """Open ``step`` (a plan that decodes every running request and repeats, or some
        under a ``rule`` that reads no step's figures: ``RepeatRule.per_step``) as a window
        beside the one other job (``can_window_beside``), its end times those stepping would
        give; its end, or None (nothing changed) when the first step's blocks are not free.
        (A rule that ends the window before the other job does leaves the check scheduled at
        that job's end to the version the window's end invalidates.)"""
        service = self.service
        other = service.job_beside(self.uses, self.client)
        assert other is not None
        key = self.key
        # (its successors, if the other replica's step is one chunk of a prompt: a chain)
        other_port = self._port_of(other)
        successor = None
        other_private_end_s = math.inf
        if other_port is not None:
            successor = other_port.chunk_successors()
            other_private_end_s = other_port._job_private_end_s
        replay = BesideReplay(self.model, key, service.capacity[key], self.client, other,
                              service.updated_s, service.work_by_client,
                              service.used_by_resource[key], other_private_end_s, successor)
        windows.ends_beside = replay.ends
        try:
            end_s = windows.open(step, until_s, through, rule=rule)
        finally:
            windows.ends_beside = None
        if end_s is None:
            return None
        self._beside = replay
        self._beside_step = step
        chain = None
        if replay.num_links:
            assert other_port is not None
            chain = _Chain(replay, other_port)
        service.claim_beside(self._on_service_change, chain)
        if replay.done_s:
            # The other job ends inside: its replica plans then, so the window is cut there
            # (or runs on to the successor, a link of the chain: ``_Chain.takes_done``).
            service.check_at(replay.done_s[0])
        self.num_windows_beside += 1
        return end_s

    def _port_of(self, job: Job) -> SharedSteps | None:
        """The port whose step in progress runs as ``job``."""
        for p in self.peers:
            if p._job is job:
                return p
        return None

    def chunk_successors(self) -> Successor | None:
        """The jobs this replica would run next if it went on prefilling the one prompt its
        step in progress computes a chunk of, chunk after chunk of the same size, to the
        prompt's end (``beside.py``, *Chains*: a guess, checked job by job); None where its
        step is not one such chunk or its parts do not overlap (a delayed start)."""
        step = self._job_step
        if step is None or step.decodes or len(step.chunks) != 1 or not self.model.overlap:
            return None
        req, n = step.chunks[0]
        return _ChunkSuccessors(self.model, n, req.num_computed_tokens, req.num_tokens)

    def in_window_beside(self) -> bool:
        return self._beside is not None

    def _on_service_change(self) -> None:
        """The service is read or changed: cut the window (``Replica.interrupt`` calls
        ``end_beside`` once it has)."""
        replica = self.replica
        assert replica is not None
        replica.interrupt()

    def end_beside(self, step: Step) -> None:
        """The window beside another job was cut back to ``step``, the step in progress:
        leave the service as stepping has it now, that step's job included."""
        replay = self._beside
        assert replay is not None
        replica = self.replica
        assert replica is not None
        self._end_beside(step, replay.num_steps, replica.sim.now_s)

    def _end_beside(self, step: Step, num_steps: int, stop_s: float) -> None:
        replay = self._beside
        assert replay is not None
        self._beside = None
        self._beside_step = None
        replay.run(num_steps, stop_s)
        self.num_links += replay.starts_done
        # The other job stepping has active now: the chain's one the replay stopped beside
        # (the service's own Job: the replay prices its successors with Jobs of their own),
        # or none in a gap.
        other = replay.jobs[replay.cur] if replay.other_on else None
        works = {replay.first.client: replay.other_work, self.client: replay.own_work}
        service = self.service
        self.num_shared_steps += replay.num_jobs
        if replay.state == NOT_STARTED:  # (it opened at this instant: nothing ran)
            # (its first job's start comes at once, as stepping's: that makes the check pending
            # stale, whichever it is)
            service.resume_beside(replay.updated_s, other, replay.left, replay.other_rate,
                                  works, replay.used, self.key, replay.num_changes,
                                  replay.num_jobs, None, math.inf, False)
            self.run_as_job(step)
            return
        job = None
        if replay.state == JOB_ACTIVE:
            replica = self.replica
            assert replica is not None and replay.step_start_s == step.start_s
            job = Job(replay.work, dict(self.uses), replay.weight, replay.max_rate,
                      self._on_done, None, self.client)
            job.work_left = replay.work_left
            job.rate = replay.rate
            job.active = True
            job.started_s = replay.step_start_s
            self._job = job
            self._job_step = step
            self._job_private_end_s = replay.private_end_s
            self._used_blocks = replica.kv.num_used_blocks
            step.end_s = math.inf  # (its end comes with the job's; the old event is stale)
            step.end_gen += 1
        else:  # its work done: it ends as its arithmetic does (the window's end time)
            assert step.end_s == replay.end_s, (step.end_s, replay.end_s)
        service.resume_beside(replay.updated_s, other, replay.left, replay.other_rate, works,
                              replay.used, self.key, replay.num_changes, replay.num_jobs, job,
                              replay.check_s, True, replay.mine_first and other is not None)

    def run_as_job(self, step: Step, delay_s: float | None = None,
                   work: float | None = None) -> None:
        """Run ``step`` (one ordinary step) as a job; its ``STEP_END`` comes when it is done."""
        replica = self.replica
        assert replica is not None
        chunks, num_decode, kv_tokens = _step_args(step)  # (a starred call is generic compiled)
        d_private_s, d_work, d_weight, d_max_rate = self.model.parts(chunks, num_decode,
                                                                     kv_tokens)
        self.num_shared_steps += 1
        self._used_blocks = replica.kv.num_used_blocks
        step.end_s = math.inf  # unknown until the job is done
        step.end_gen += 1  # (a held step's end, scheduled as priced alone, is stale)
        if self.model.overlap:
            private_s = d_private_s if delay_s is None else max(0.0, delay_s)
            delay = 0.0
        else:
            private_s = 0.0
            delay = d_private_s if delay_s is None else delay_s
        self._job = self.service.start(
            d_work if work is None else max(0.0, work), self.uses, self._on_done,
            weight=d_weight, max_rate=min(self.model.max_rate, d_max_rate), delay_s=delay,
            client=self.client)
        self._job_private_end_s = replica.sim.now_s + private_s
        self._job_step = step

    def _on_done(self, job: Job) -> None:
        replica = self.replica
        assert replica is not None
        self._job = None
        step = self._job_step
        assert step is not None
        now_s = replica.sim.now_s
        end_s = max(now_s, self._job_private_end_s)  # overlap: the private part may be longer
        step.end_s = end_s
        replica.set_pending_kv_seconds(self._used_blocks * (end_s - step.start_s))
        replica.schedule_step_end(step)

    def _share(self) -> None:
        """Someone else came: the held step in progress becomes a job for what is left."""
        replica = self.replica
        assert replica is not None
        self._hold = None
        replica.interrupt()  # a window is cut back to the step in progress, settled before it
        step = replica.current_step
        now_s = replica.sim.now_s
        if step is None or step.end_s <= now_s:
            return  # it ends now: it was priced exactly
        chunks, num_decode, kv_tokens = _step_args(step)
        d = self.model.demand(chunks, num_decode, kv_tokens)
        rate = min(self.model.alone_rate, d.max_rate)
        elapsed = now_s - step.start_s
        if self.model.overlap:
            done = min(d.work, elapsed * rate)
            private_left = max(0.0, d.private_s - elapsed)
        else:
            done = min(d.work, max(0.0, elapsed - d.private_s) * rate)
            private_left = max(0.0, d.private_s - elapsed)
        self.num_alone_steps -= 1
        self.run_as_job(step, delay_s=private_left, work=d.work - done)


def _ignore(job: Job) -> None:
    pass


class _ChunkSuccessors:
    """``SharedSteps.chunk_successors``: the i-th next chunk's parts, as ``run_as_job``
    would start its job (the step's most rate capped by the model's)."""

    __slots__ = ("computed", "model", "size", "total")

    def __init__(self, model: SharedStepModel, size: int, computed: int, total: int) -> None:
        self.model = model
        self.size = size
        self.computed = computed  # before the chunk in progress
        self.total = total

    def __call__(self, i: int) -> tuple[float, float, float, float] | None:
        start = self.computed + (i + 1) * self.size
        if start >= self.total:
            return None  # the prompt is done: the request moves on (a hand-off, a decode)
        n = self.total - start
        if n > self.size:
            n = self.size
        model = self.model
        private_s, work, weight, max_rate = model.parts([(n, start)], 0, 0)
        return private_s, work, weight, min(model.max_rate, max_rate)


class _Chain:
    """One window's chain (``BesideChain``): answers the service from its replay's
    findings, checking each successor the other port starts against the one priced."""

    __slots__ = ("other_port", "replay")

    def __init__(self, replay: BesideReplay, other_port: SharedSteps) -> None:
        self.replay = replay
        self.other_port = other_port

    def takes_done(self, now_s: float) -> float:
        r = self.replay
        m = r.links_done
        if m < r.num_links and r.done_s[m] == now_s and r.starts_done == m:
            r.links_done = m + 1
            return r.start_s_of[m]
        return -1.0

    def _priced(self, work: float, weight: float, max_rate: float, delay_s: float,
                client: str, now_s: float) -> bool:
        r = self.replay
        m = r.starts_done
        if not (m < r.links_done and r.start_s_of[m] == now_s and delay_s == 0.0
                and client == r.first.client):
            return False
        nxt = r.successors[m]
        return nxt.work == work and nxt.weight == weight and nxt.max_rate == max_rate

    def expects(self, work: float, uses: Mapping[ResourceKey, float], weight: float,
                max_rate: float, delay_s: float, client: str, now_s: float) -> bool:
        key = self.replay.key
        if len(uses) != 1 or uses.get(key) != 1.0:
            return False
        return self._priced(float(work), float(weight), float(max_rate), float(delay_s),
                            client, now_s)

    def adopt(self, job: Job, now_s: float) -> float:
        r = self.replay
        port = self.other_port
        m = r.starts_done
        if not (port._job is job and job.single == r.key and job.single_use == 1.0
                and self._priced(job.work, job.weight, job.max_rate, 0.0, job.client, now_s)
                and port._job_private_end_s == now_s + r.successor_private_s[m]):
            return -1.0
        r.starts_done = m + 1
        r.jobs.append(job)
        return r.done_s[m + 1] if m + 1 < len(r.done_s) else math.inf

    def started(self, index: int) -> bool:
        return self.replay.starts_done > index


def _time_s(overlap: bool, private_s: float, work: float, rate: float) -> float:
    """A step's length at a constant ``rate`` of its shared work (its parts overlapped or
    one after the other)."""
    shared_s = work / rate if work > 0 else 0.0
    return max(private_s, shared_s) if overlap else private_s + shared_s


def _slowdown(overlap: bool, private_s: float, work: float, alone_rate: float,
              beside_rate: float) -> float:
    """How many times longer a step of these parts takes at ``beside_rate`` than at
    ``alone_rate`` (1.0 for a step of no length): ``slowdowns``' and ``steps_held``' one
    formula, so the engine's answer is the planner's float for float."""
    alone_s = _time_s(overlap, private_s, work, alone_rate)
    return _time_s(overlap, private_s, work, beside_rate) / alone_s if alone_s > 0 else 1.0


def _cut_windows(ports: list[SharedSteps]) -> None:
    """Cut the replicas' windows on ``ports`` back to their steps in progress."""
    for p in ports:
        replica = p.replica
        assert replica is not None
        replica.interrupt()


def _step_args(step: Step) -> tuple[list[tuple[int, int]], int, int]:
    chunks = [(n, r.num_computed_tokens) for r, n in step.chunks]
    kv_tokens = 0
    for r in step.decodes:
        kv_tokens += r.num_computed_tokens
    return chunks, len(step.decodes), kv_tokens



def shared_port(service: SharedResources, model: SharedStepModel, client: str,
                replica_id: int) -> SharedSteps:
    """Replica ``replica_id``'s port onto ``model``'s resource (its own copy when
    ``per_replica``), declared on ``service`` by its first user (every user must give it the
    same capacity)."""
    key = (model.resource, replica_id) if model.per_replica else model.resource
    have = service.capacity.get(key)
    if have is None:
        service.add(key, model.capacity_per_s)
    elif have != model.capacity_per_s:
        raise ValueError(f"shared resource {model.resource!r}: one pool gives it "
                         f"{have} units/s, another {model.capacity_per_s}; give one capacity")
    port = SharedSteps(service, model, client, key)
    peers = service.ports.setdefault(key, [])
    peers.append(port)
    port.peers = peers  # one list, seen by every port onto the resource
    return port
