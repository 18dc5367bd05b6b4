"""Agent.xpu's two baselines (arXiv:2506.24045 v2 abstract): an industrial iGPU-only serving
engine, and NPU-iGPU static inference with the best tensor partition.

Both serve requests first come, first served, with no notion of reactive or proactive: the
abstracts describe existing on-device engines as "designed for isolated inferences" (v1) that
"assume static, single-shot inference" (v2), so by default one request runs at a time, from
its whole-prompt prefill to its last token (``max_running = 1``, as llama.cpp's server with
one slot or OpenVINO GenAI's ``LLMPipeline``); ``max_running`` > 1 batches the decodes of the
earliest requests, continuous-batching style.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleetsim.hardware.soc import SoCSpec
from fleetsim.perf.soc import SPLIT_STEPS, ModelCost, OpCost, best_npu_share  # noqa: F401
from fleetsim.soc.engine import Job, Part, Request, SoCView

Placement = Callable[[str, OpCost], tuple[Part, ...]]
"""(stage, op cost) -> the parts that run it."""


def fcfs_order(r: Request) -> tuple:
    """First come, first served."""
    return (r.arrival_s, r.id)


def reactive_first_order(r: Request) -> tuple:
    """Reactive requests before proactive ones, each first come, first served, re-sorted at
    every job boundary: a proactive request stops between two of its steps (its KV kept)
    while a reactive one runs."""
    return (not r.reactive, r.arrival_s, r.id)


def reactive_next_order(r: Request) -> tuple:
    """A request once started runs to its end; the next one to start is the earliest
    reactive one, else the earliest proactive one (a priority queue, no preemption)."""
    return (r.num_prefilled == 0, not r.reactive, r.arrival_s, r.id)


ORDERS: dict[str, Callable[[Request], tuple]] = {
    "fcfs": fcfs_order, "reactive_first": reactive_first_order,
    "reactive_next": reactive_next_order}


def fcfs_job(view: SoCView, max_running: int, parts_of: Placement,
             order: Callable[[Request], tuple] = fcfs_order) -> Job | None:
    """The next job of FCFS serving: the earliest unfinished requests (at most
    ``max_running``) run; a waiting prefill (whole prompt) goes first, then one decode step of
    every running request past its prefill. ``order`` replaces "earliest" by another key
    (``ORDERS``)."""
    unfinished = sorted({*view.ready, *(r for j in view.running for r in j.requests)},
                        key=order)
    running = unfinished[:max_running]
    if any(r.busy for r in running):
        return None  # a job of the running set is still in flight
    for r in running:
        if r.needs_prefill:
            cost = view.cost.prefill(r.num_prompt_tokens - r.num_prefilled, r.num_prefilled)
            return Job(parts=parts_of("prefill", cost), prefill=r,
                       num_prefill_tokens=r.num_prompt_tokens - r.num_prefilled)
    batch = tuple(running)
    cost = view.cost.decode([r.context_tokens for r in batch])
    return Job(parts=parts_of("decode", cost), decode=batch)


@dataclass(slots=True)
class IgpuOnly:
    """Every job on the iGPU alone."""

    max_running: int = 1
    order: str = "fcfs"
    """fcfs (the baseline) | reactive_first | reactive_next (``ORDERS``): a priority rule
    for reactive requests on the same engine, the simplest share of Agent.xpu's idea."""

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")

    def plan(self, view: SoCView) -> list[Job]:
        if "igpu" not in view.idle:
            return []
        job = fcfs_job(view, self.max_running, lambda _stage, cost: (Part("igpu", cost),),
                       ORDERS[self.order])
        return [job] if job is not None else []


@dataclass(slots=True)
class StaticPartition:
    """Every job split over NPU and iGPU at a fixed share per stage, chosen offline for a
    representative prefill (``profile_prompt_tokens``) and decode step (one sequence at that
    context)."""

    soc: SoCSpec
    cost: ModelCost
    max_running: int = 1
    profile_prompt_tokens: int = 1024
    npu_share: dict[str, float] | None = None

    def __post_init__(self) -> None:
        n = self.profile_prompt_tokens
        self.npu_share = {
            "prefill": best_npu_share(self.soc, self.cost.prefill(n, 0)),
            "decode": best_npu_share(self.soc, self.cost.decode([n])),
        }

    def _parts(self, stage: str, cost: OpCost) -> tuple[Part, ...]:
        assert self.npu_share is not None
        share = self.npu_share[stage]
        return tuple(p for p in (Part("npu", cost.scaled(share)),
                                 Part("igpu", cost.scaled(1.0 - share))) if p.cost.flops > 0)

    def plan(self, view: SoCView) -> list[Job]:
        job = fcfs_job(view, self.max_running, self._parts)
        if job is None or not set(job.accelerators) <= view.idle:
            return []
        return [job]
