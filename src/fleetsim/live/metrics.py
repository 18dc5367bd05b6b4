"""Prometheus metrics of a live server, in a registry of its own (so several servers can
share a process): the server's own view under ``fleetsim:`` (as measured at its HTTP side),
and for an emulated engine also vLLM's ``vllm:`` series (``VllmMetrics``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

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


# vLLM's own series, as its Prometheus logger names them (vllm-project/vllm,
# vllm/v1/metrics/loggers.py, ``PrometheusStatLogger``, commit 005a810b), with its labels
# ``model_name`` and ``engine`` and its buckets, so dashboards and llm-d's endpoint picker read
# an emulated backend as they read vLLM.
VLLM_GAUGES = {
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    # vLLM's name before 0.9, which older llm-d schedulers still read.
    "vllm:gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage. "
    "DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
}
VLLM_TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
VLLM_REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                          50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def one_two_five_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's ``build_1_2_5_buckets``)."""
    out: list[int] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


class _VllmGauges(Collector):
    def __init__(self, read: Callable[[], dict[str, float]], labels: dict[str, str]) -> None:
        self.read = read
        self.labels = labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self.read()
        for name, doc in VLLM_GAUGES.items():
            g = GaugeMetricFamily(name, doc, labels=list(self.labels))
            g.add_metric(list(self.labels.values()), values.get(name, 0.0))
            yield g


class VllmMetrics:
    """vLLM's metric series of one emulated engine, in ``registry``; times in wall seconds
    (engine seconds divided by the emulation's speed)."""

    def __init__(self, registry: CollectorRegistry, gauges: Callable[[], dict[str, float]], *,
                 model_name: str, max_model_len: int) -> None:
        labels = {"model_name": model_name, "engine": "0"}
        registry.register(_VllmGauges(gauges, labels))
        names, values = list(labels), list(labels.values())

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, names, registry=registry).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, names, buckets=buckets, registry=registry
                             ).labels(*values)

        self.num_preemptions = counter("vllm:num_preemptions",
                                       "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens processed.")
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self._success = Counter("vllm:request_success", "Count of successfully processed "
                                "requests.", [*names, "finished_reason"], registry=registry)
        self._label_values = values
        tokens = one_two_five_buckets(max_model_len)
        self.request_prompt_tokens = histogram("vllm:request_prompt_tokens",
                                               "Number of prefill tokens processed.", tokens)
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.",
                              VLLM_TTFT_BUCKETS_S)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Histogram of time per output token in seconds.",
                              VLLM_TPOT_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             VLLM_REQUEST_BUCKETS_S)
        self.queue_time = histogram("vllm:request_queue_time_seconds",
                                    "Histogram of time spent in WAITING phase for request.",
                                    VLLM_REQUEST_BUCKETS_S)

    def finished(self, *, finished_reason: str, num_prompt_tokens: int,
                 num_output_tokens: int, num_prefix_hit_tokens: int, num_preemptions: int,
                 ttft_s: float, queue_s: float, e2e_s: float, tpot_s: float | None) -> None:
        """One request left the engine (vLLM counts per finished request)."""
        self._success.labels(*self._label_values, finished_reason).inc()
        self.num_preemptions.inc(num_preemptions)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_output_tokens)
        self.prefix_cache_queries.inc(num_prompt_tokens)
        self.prefix_cache_hits.inc(num_prefix_hit_tokens)
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)
        for hist, value in ((self.ttft, ttft_s), (self.queue_time, queue_s),
                            (self.e2e, e2e_s), (self.tpot, tpot_s)):
            if value is not None and math.isfinite(value):
                hist.observe(value)
