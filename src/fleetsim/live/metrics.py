"""Prometheus metrics of a live server, in a registry of its own (so several servers can
share a process), named after vLLM's (``fleetsim:`` instead of ``vllm:``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class _Gauges(Collector):
    """Gauges read at scrape time from ``read()`` (name -> value)."""

    def __init__(self, read: Callable[[], dict[str, float]], docs: dict[str, str]) -> None:
        self.read = read
        self.docs = docs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self.read()
        for name, doc in self.docs.items():
            yield GaugeMetricFamily(f"fleetsim:{name}", doc, value=values.get(name, 0.0))


class LiveMetrics:
    """Counters and latency histograms of one server."""

    def __init__(self, gauges: Callable[[], dict[str, float]], gauge_docs: dict[str, str],
                 *, labels: tuple[str, ...] = ()) -> None:
        self.registry = r = CollectorRegistry()
        r.register(_Gauges(gauges, gauge_docs))
        self.requests = Counter("fleetsim:requests", "Requests by outcome (ok, error, "
                                "cancelled, rejected) and HTTP status",
                                ("outcome", "status", *labels), registry=r)
        self.prompt_tokens = Counter("fleetsim:prompt_tokens", "Prompt tokens of served "
                                     "requests", labels, registry=r)
        self.generation_tokens = Counter("fleetsim:generation_tokens", "Output tokens sent",
                                         labels, registry=r)
        self.retries = Counter("fleetsim:retries", "Requests sent again to another backend",
                               labels, registry=r)
        self.ttft = Histogram("fleetsim:time_to_first_token_seconds", "TTFT as measured by "
                              "this server", labels, buckets=LATENCY_BUCKETS_S, registry=r)
        self.tpot = Histogram("fleetsim:time_per_output_token_seconds", "TPOT as measured by "
                              "this server", labels, buckets=LATENCY_BUCKETS_S, registry=r)
        self.e2e = Histogram("fleetsim:e2e_request_latency_seconds", "End-to-end latency as "
                             "measured by this server", labels, buckets=LATENCY_BUCKETS_S,
                             registry=r)

    async def endpoint(self, request: HttpRequest) -> Response:
        return Response(generate_latest(self.registry),
                        media_type="text/plain; version=0.0.4; charset=utf-8")
