"""Request sources: where a simulation's requests come from, and who hears of finishes.

A source schedules arrivals through the cluster (``SourceContext.submit_at``) and is told
when each arrives and, if it asks, when each finishes; it may then create new requests (the
next call of an agentic program, the next rollout of an RL step). Request ids belong to the
simulation (``SourceContext.new_request_id``), so they are unique and deterministic.
"""

from __future__ import annotations

from typing import Protocol

from fleetsim.serving.request import Request
from fleetsim.workloads.workload import Workload


class SourceContext(Protocol):
    """What a source may do with the simulation (the cluster implements it)."""

    @property
    def now_s(self) -> float: ...
    def new_request_id(self) -> int: ...
    def submit_at(self, at_s: float, req: Request) -> None: ...


class RequestSource(Protocol):
    """Feeds requests to a cluster. ``wants_finishes``: call ``on_finish`` (else it is
    never called, which keeps plain trace replays fast)."""

    wants_finishes: bool

    def start(self, ctx: SourceContext) -> None:
        """Schedule the first arrival(s)."""

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        """``req`` arrives now (before it is routed): schedule what comes next."""

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        """``req`` finished now."""

    @property
    def num_requests(self) -> int | None:
        """Requests it will submit, when known in advance (progress bars)."""


class WorkloadSource:
    """A fixed workload, one arrival scheduled at a time (the next when one arrives), so the
    event heap stays small however long the trace. Ids are row indices."""

    wants_finishes = False

    def __init__(self, workload: Workload) -> None:
        self.arrival_s: list[float] = workload.arrival_s.tolist()
        self.prompt: list[int] = workload.num_prompt_tokens.tolist()
        self.output: list[int] = workload.num_output_tokens.tolist()
        self.hash_ids = workload.hash_ids
        self.priority: list[int] | None = (
            workload.priority.tolist() if workload.priority is not None else None)
        self._next = 0

    @property
    def num_requests(self) -> int | None:
        return len(self.arrival_s)

    def start(self, ctx: SourceContext) -> None:
        self._submit_next(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        self._submit_next(ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        return None

    def _submit_next(self, ctx: SourceContext) -> None:
        i = self._next
        if i < len(self.arrival_s):
            self._next = i + 1
            ctx.submit_at(self.arrival_s[i], self.request(ctx.new_request_id(), i))

    def request(self, rid: int, i: int) -> Request:
        """Row ``i`` as a fresh request with id ``rid``."""
        return Request(
            id=rid, arrival_s=self.arrival_s[i], num_prompt_tokens=self.prompt[i],
            max_output_tokens=self.output[i],
            hash_ids=self.hash_ids[i] if self.hash_ids is not None else (),
            priority=self.priority[i] if self.priority is not None else 0)
