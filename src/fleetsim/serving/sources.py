"""Request sources: where a simulation's requests come from, and who hears of finishes.

A source schedules arrivals through the cluster (``SourceContext.submit_at``) and is told
when each arrives and, if it asks, when each finishes; it may then create new requests (the
next call of an agentic program, the next rollout of an RL step). Request ids belong to the
simulation (``SourceContext.new_request_id``), so they are unique and deterministic.
"""

from __future__ import annotations

from fleetsim.serving.contract import RequestSource as RequestSource  # re-exported
from fleetsim.serving.contract import SourceContext as SourceContext  # re-exported
from fleetsim.serving.request import Request
from fleetsim.workloads.workload import Workload

CHUNK_ROWS = 4096


class WorkloadSource:
    """A fixed workload, one arrival scheduled at a time (the next when one arrives), so the
    event heap stays small however long the trace. Ids are row indices. Rows are read from
    the workload's arrays ``CHUNK_ROWS`` at a time (a million rows as Python lists would take
    about 100 MB)."""

    wants_finishes = False

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.hash_ids = workload.hash_ids
        self._num_rows = len(workload.arrival_s)
        self._next = 0
        # The rows [_chunk_start, _chunk_start + len(_arrival_s)) as Python numbers.
        self._chunk_start = 0
        self._arrival_s: list[float] = []
        self._prompt: list[int] = []
        self._output: list[int] = []
        self._priority: list[int] | None = None

    @property
    def num_requests(self) -> int | None:
        return self._num_rows

    def start(self, ctx: SourceContext) -> None:
        self._submit_next(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        self._submit_next(ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        return None

    def _submit_next(self, ctx: SourceContext) -> None:
        i = self._next
        if i < self._num_rows:
            self._next = i + 1
            req = self.request(ctx.new_request_id(), i)
            ctx.submit_at(req.arrival_s, req)

    def request(self, rid: int, i: int) -> Request:
        """Row ``i`` as a fresh request with id ``rid``."""
        j = i - self._chunk_start
        if not 0 <= j < len(self._arrival_s):
            self._load_chunk(i)
            j = i - self._chunk_start
        priority = self._priority
        return Request(
            id=rid, arrival_s=self._arrival_s[j], num_prompt_tokens=self._prompt[j],
            max_output_tokens=self._output[j],
            hash_ids=self.hash_ids[i] if self.hash_ids is not None else (),
            priority=priority[j] if priority is not None else 0)

    def _load_chunk(self, i: int) -> None:
        """Make the chunk holding row ``i`` the current one."""
        start = i - i % CHUNK_ROWS
        end = start + CHUNK_ROWS
        w = self.workload
        self._chunk_start = start
        self._arrival_s = w.arrival_s[start:end].tolist()
        self._prompt = w.num_prompt_tokens[start:end].tolist()
        self._output = w.num_output_tokens[start:end].tolist()
        self._priority = w.priority[start:end].tolist() if w.priority is not None else None


class ClosedLoopSource(WorkloadSource):
    """At most ``max_concurrency`` requests in flight (``vllm bench serve
    --max-concurrency``): row i is sent at its arrival time or, when every slot is busy then,
    the moment one frees, in row order. A request's ``arrival_s`` is when it is sent, so its
    latencies are measured from there, as the benchmark client measures them."""

    wants_finishes = True

    def __init__(self, workload: Workload, max_concurrency: int) -> None:
        super().__init__(workload)
        self.max_concurrency = max_concurrency

    def start(self, ctx: SourceContext) -> None:
        for _ in range(min(self.max_concurrency, self._num_rows)):
            self._send_next(ctx, 0.0)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        return None

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        self._send_next(ctx, ctx.now_s)

    def _send_next(self, ctx: SourceContext, free_s: float) -> None:
        i = self._next
        if i < self._num_rows:
            self._next = i + 1
            req = self.request(ctx.new_request_id(), i)
            at_s = max(req.arrival_s, free_s)
            req.arrival_s = at_s
            ctx.submit_at(at_s, req)


class TrackingSource:
    """Wraps a source and keeps the requests that arrived and have not finished (a run cut
    at ``until_s`` reports them), by id."""

    wants_finishes = True

    def __init__(self, inner: RequestSource) -> None:
        self.inner = inner
        self.in_flight: dict[int, Request] = {}  # request id -> request
        self.num_arrived = 0

    @property
    def num_requests(self) -> int | None:
        return self.inner.num_requests

    def start(self, ctx: SourceContext) -> None:
        self.inner.start(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        self.in_flight[req.id] = req
        self.num_arrived += 1
        self.inner.on_arrival(req, ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        del self.in_flight[req.id]
        if self.inner.wants_finishes:
            self.inner.on_finish(req, ctx)
