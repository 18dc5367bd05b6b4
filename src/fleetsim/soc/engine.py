"""The SoC engine: one node, two accelerators, one DDR; a scheduler places jobs, the engine
runs them with fluid DDR sharing.

A job is one prefill chunk of one request, or one decode step of a batch, given to one
accelerator (or split over both, as a static tensor partition does: the job ends when its
last part does, and holds both accelerators until then). While jobs run, the DDR is shared
max-min fairly (``contention.share_bandwidth``), so a job's speed changes whenever another
starts or ends. The loop therefore advances from one change to the next (a job's end, an
arrival) instead of scheduling completion events that a later start would invalidate; with
two accelerators that is a handful of floats per step.

Jobs are never interrupted: a reactive request preempts proactive work at the next job
boundary, so the chunk size bounds how long it waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from fleetsim.hardware.soc import SoCSpec
from fleetsim.perf.soc import _DONE, ModelCost, Part, part_rates
from fleetsim.perf.soc import concurrent_s as concurrent_s  # re-exported
from fleetsim.workloads.agent_traffic import (
    AgentTraffic,
    LengthSampler,
    reactive_arrivals,
    streams,
)


@dataclass(slots=True, eq=False)
class Request:
    id: int
    reactive: bool
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    flow: int | None = None
    """Proactive flow that issued it (None for reactive requests)."""
    num_prefilled: int = 0
    num_generated: int = 0
    busy: bool = False
    """A job of this request is running."""
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def needs_prefill(self) -> bool:
        return self.num_prefilled < self.num_prompt_tokens

    @property
    def context_tokens(self) -> int:
        return self.num_prefilled + self.num_generated

    @property
    def done(self) -> bool:
        return self.finish_s is not None


@dataclass(frozen=True, slots=True, eq=False)
class Job:
    parts: tuple[Part, ...]
    prefill: Request | None = None
    num_prefill_tokens: int = 0
    decode: tuple[Request, ...] = ()

    @property
    def requests(self) -> tuple[Request, ...]:
        return (self.prefill,) if self.prefill is not None else self.decode

    @property
    def reactive(self) -> bool:
        return any(r.reactive for r in self.requests)

    @property
    def accelerators(self) -> tuple[str, ...]:
        return tuple(p.accelerator for p in self.parts)


@dataclass(frozen=True, slots=True)
class SoCView:
    """What a scheduler sees: read it, never change it."""

    now_s: float
    soc: SoCSpec
    cost: ModelCost
    idle: frozenset[str]
    running: tuple[Job, ...]
    ready: tuple[Request, ...]
    """Arrived, unfinished requests with no job running, in arrival order."""


class Scheduler(Protocol):
    def plan(self, view: SoCView) -> list[Job]:
        """Jobs to start now, on idle accelerators only, for ready requests only."""
        ...


@dataclass(slots=True)
class JobRecord:
    start_s: float
    end_s: float
    accelerators: tuple[str, ...]
    kind: str
    """``"prefill"`` or ``"decode"``."""
    request_ids: tuple[int, ...]
    reactive: bool


@dataclass(slots=True)
class SoCResult:
    requests: list[Request]
    jobs: list[JobRecord]
    duration_s: float
    end_s: float
    busy_s: dict[str, float] = field(default_factory=dict)


class SoCEngine:
    """Runs one traffic mix under one scheduler to completion."""

    def __init__(self, soc: SoCSpec, cost: ModelCost, traffic: AgentTraffic,
                 scheduler: Scheduler) -> None:
        self.soc, self.cost, self.traffic, self.scheduler = soc, cost, traffic, scheduler
        arrivals_rng, reactive_rng, proactive_rng = streams(traffic.seed)
        self._reactive_lengths = LengthSampler(reactive_rng, traffic.max_prompt_tokens,
                                               traffic.reactive_lengths)
        self._proactive_lengths = LengthSampler(proactive_rng, traffic.max_prompt_tokens,
                                                traffic.proactive_lengths)
        self._arrivals = reactive_arrivals(traffic, arrivals_rng)
        self.now_s = 0.0
        self.requests: list[Request] = []
        self._live: list[Request] = []  # issued and unfinished, in arrival order
        self._running: list[tuple[Job, list[float]]] = []  # job, work left per part
        self._started: dict[int, float] = {}  # id(job) -> start time
        self.jobs: list[JobRecord] = []
        self.busy_s = {acc.name: 0.0 for acc in soc.accelerators}

    def _issue(self, reactive: bool, flow: int | None) -> None:
        sampler = self._reactive_lengths if reactive else self._proactive_lengths
        prompt, output = sampler.draw()
        request = Request(id=len(self.requests), reactive=reactive, arrival_s=self.now_s,
                          num_prompt_tokens=prompt, num_output_tokens=output, flow=flow)
        self.requests.append(request)
        self._live.append(request)

    def run(self) -> SoCResult:
        for flow in range(self.traffic.num_proactive_flows):
            self._issue(False, flow)
        next_arrival = 0
        while True:
            while (next_arrival < len(self._arrivals)
                   and self._arrivals[next_arrival] <= self.now_s):
                self._issue(True, None)
                next_arrival += 1
            self._dispatch()
            arrival_s = (self._arrivals[next_arrival] if next_arrival < len(self._arrivals)
                         else math.inf)
            if not self._running:
                if math.isinf(arrival_s):
                    break
                self.now_s = arrival_s
                continue
            self._advance(arrival_s)
        stuck = [r.id for r in self.requests if not r.done]
        if stuck:
            raise RuntimeError(f"scheduler {type(self.scheduler).__name__} left requests "
                               f"{stuck[:5]} unfinished with every accelerator idle")
        return SoCResult(requests=self.requests, jobs=self.jobs,
                         duration_s=self.traffic.duration_s, end_s=self.now_s,
                         busy_s=dict(self.busy_s))

    def _dispatch(self) -> None:
        busy = {a for job, _ in self._running for a in job.accelerators}
        idle = frozenset(a.name for a in self.soc.accelerators) - busy
        if not idle:
            return
        ready = tuple(r for r in self._live if not r.busy)
        if not ready:
            return
        view = SoCView(now_s=self.now_s, soc=self.soc, cost=self.cost, idle=idle,
                       running=tuple(job for job, _ in self._running), ready=ready)
        for job in self.scheduler.plan(view):
            self._start(job, idle)
            idle = idle - set(job.accelerators)

    def _start(self, job: Job, idle: frozenset[str]) -> None:
        if not set(job.accelerators) <= idle or len(set(job.accelerators)) != len(job.parts):
            raise RuntimeError(f"job on {job.accelerators} but idle are {sorted(idle)}")
        for r in job.requests:
            if r.busy or r.done:
                raise RuntimeError(f"request {r.id} is busy or done; it cannot join a job")
            r.busy = True
        if job.prefill is not None and not 0 < job.num_prefill_tokens <= (
                job.prefill.num_prompt_tokens - job.prefill.num_prefilled):
            raise RuntimeError(f"prefill of {job.num_prefill_tokens} tokens for request "
                               f"{job.prefill.id} does not fit its prompt")
        self._running.append((job, [1.0] * len(job.parts)))
        self._started[id(job)] = self.now_s

    def _advance(self, arrival_s: float) -> None:
        # parts still working, as (running index, part index); a finished part of a split
        # job waits for its sibling without drawing DDR
        live = [(j, i) for j, (_, lefts) in enumerate(self._running)
                for i, left in enumerate(lefts) if left > _DONE]
        parts = [self._running[j][0].parts[i] for j, i in live]
        rates = part_rates(self.soc, parts)
        dt = min(self._running[j][1][i] / r for (j, i), r in zip(live, rates, strict=True))
        dt = min(dt, arrival_s - self.now_s)
        self.now_s += dt
        for (j, i), part, rate in zip(live, parts, rates, strict=True):
            self.busy_s[part.accelerator] += dt
            lefts = self._running[j][1]
            lefts[i] = lefts[i] - rate * dt
            if lefts[i] <= _DONE:
                lefts[i] = 0.0
        finished = [job for job, lefts in self._running if max(lefts) <= _DONE]
        self._running = [(j, le) for j, le in self._running if max(le) > _DONE]
        for job in finished:
            self._finish(job)

    def _finish(self, job: Job) -> None:
        now = self.now_s
        for r in job.requests:
            r.busy = False
        if job.prefill is not None:
            r = job.prefill
            r.num_prefilled += job.num_prefill_tokens
            if not r.needs_prefill:
                r.num_generated = 1  # the last prefill chunk yields the first token
                r.first_token_s = now
        for r in job.decode:
            r.num_generated += 1
        kind = "prefill" if job.prefill is not None else "decode"
        self.jobs.append(JobRecord(self._started.pop(id(job)), now, job.accelerators, kind,
                                   tuple(r.id for r in job.requests), job.reactive))
        for r in job.requests:
            if r.num_generated >= r.num_output_tokens and not r.needs_prefill:
                r.finish_s = now
                self._live.remove(r)
                if r.flow is not None and now < self.traffic.duration_s:
                    self._issue(False, r.flow)
