"""Personal-agent traffic as a request source (Agent.xpu, arXiv:2506.24045): reactive requests
(user-triggered: an open Poisson stream, ``WorkloadSource``'s kind) and proactive flows
(background agents, each issuing its next request the moment its last one finishes: a closed
loop, ``ClosedLoopSource``'s kind) over one arrival window.

Reactive requests have priority 0 and proactive ones 1, so the ``priority`` ordering puts
reactive work first. Lengths are drawn as ``workloads/agent_traffic.py`` draws them: each kind
from its own generator, in the order its requests are issued, so a run gets the same lengths
as any other engine fed the same ``AgentTraffic``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fleetsim.serving.contract import SourceContext
from fleetsim.serving.request import Request
from fleetsim.workloads.agent_traffic import (
    AgentTraffic,
    LengthSampler,
    reactive_arrivals,
    streams,
)
from fleetsim.workloads.workload import Workload

REACTIVE_PRIORITY = 0
PROACTIVE_PRIORITY = 1


class AgentTrafficSource:
    """Reactive arrivals within ``[0, duration_s)`` plus ``num_proactive_flows`` flows, each
    with one request outstanding, issuing the next while the window is open."""

    wants_finishes = True

    def __init__(self, traffic: AgentTraffic) -> None:
        self.traffic = traffic
        arrivals_rng, reactive_rng, proactive_rng = streams(traffic.seed)
        self._reactive = LengthSampler(reactive_rng, traffic.max_prompt_tokens,
                                       traffic.reactive_lengths)
        self._proactive = LengthSampler(proactive_rng, traffic.max_prompt_tokens,
                                        traffic.proactive_lengths)
        self._times = reactive_arrivals(traffic, arrivals_rng)
        self._next = 0
        self._flow_of: dict[int, int] = {}  # request id -> its proactive flow (in flight)
        self.reactive_ids: set[int] = set()

    @property
    def num_requests(self) -> int | None:
        return None  # the flows issue as long as the window is open

    def start(self, ctx: SourceContext) -> None:
        for flow in range(self.traffic.num_proactive_flows):
            self._issue_proactive(ctx, flow, 0.0)
        self._submit_next_reactive(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        if req.id in self.reactive_ids:
            self._submit_next_reactive(ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        flow = self._flow_of.pop(req.id, None)
        if flow is not None and ctx.now_s < self.traffic.duration_s:
            self._issue_proactive(ctx, flow, ctx.now_s)

    def _submit_next_reactive(self, ctx: SourceContext) -> None:
        i = self._next
        if i < len(self._times):
            self._next = i + 1
            prompt, output = self._reactive.draw()
            rid = ctx.new_request_id()
            self.reactive_ids.add(rid)
            ctx.submit_at(self._times[i], Request(
                id=rid, arrival_s=self._times[i], num_prompt_tokens=prompt,
                max_output_tokens=output, priority=REACTIVE_PRIORITY))

    def _issue_proactive(self, ctx: SourceContext, flow: int, at_s: float) -> None:
        prompt, output = self._proactive.draw()
        rid = ctx.new_request_id()
        self._flow_of[rid] = flow
        ctx.submit_at(at_s, Request(id=rid, arrival_s=at_s, num_prompt_tokens=prompt,
                                    max_output_tokens=output, priority=PROACTIVE_PRIORITY))


def agent_frame(traffic: AgentTraffic) -> Workload:
    """The window's two ends as a stand-in workload (the source makes the requests): what a run
    reads for its timeline and first arrival."""
    return Workload(arrival_s=np.array([0.0, traffic.duration_s]),
                    num_prompt_tokens=np.ones(2, dtype=np.int64),
                    num_output_tokens=np.ones(2, dtype=np.int64),
                    priority=np.array([REACTIVE_PRIORITY, PROACTIVE_PRIORITY]),
                    name="agent_traffic")


def agent_summary(requests: Mapping[str, np.ndarray], source: AgentTrafficSource
                  ) -> dict[str, float | int | None]:
    """Agent.xpu's metrics of one run: reactive latency (arrival to last token, mean and P99)
    and proactive requests finished per minute within the window."""
    reactive = np.isin(requests["request_id"], np.array(sorted(source.reactive_ids),
                                                        dtype=np.int64))
    latency = (requests["finish_s"] - requests["arrival_s"])[reactive]
    latency = latency[~np.isnan(latency)]
    window_s = source.traffic.duration_s
    done = ~reactive & (requests["finish_s"] <= window_s)
    return {"num_reactive": int(reactive.sum()), "num_proactive": int((~reactive).sum()),
            "reactive_latency_mean_s": float(latency.mean()) if latency.size else None,
            "reactive_latency_p99_s": float(np.percentile(latency, 99)) if latency.size
            else None,
            "proactive_per_min": int(done.sum()) / (window_s / 60.0)}
