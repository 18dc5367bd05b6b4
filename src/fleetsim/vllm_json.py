"""A run's result as ``vllm bench serve --save-result`` writes it: its keys, its units (ms)
and its statistics, so that fleetsim's numbers line up with a benchmark's.

Definitions follow vLLM's ``benchmarks/serve.py`` (``calculate_metrics``): TTFT and E2E
latency per request; TPOT = (latency - TTFT) / (output tokens - 1) over requests with more
than one output; ITL = every gap between consecutive output tokens, pooled over requests;
``std`` is the population standard deviation (``np.std``); ``median`` is ``np.median``;
percentile keys are ``p{P}_{metric}_ms`` with P as an integer when it is one (``p99``,
``p99.9``). ``duration`` runs from the first request sent to the last finish.
``request_goodput`` counts requests meeting the run's SLO (TTFT and TPOT, as
``--goodput ttft:MS tpot:MS``) per second.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.metrics.summary import per_request_latencies, weighted_percentiles

METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_percentiles(text: str) -> list[float]:
    """``"50,90,99"`` as floats in (0, 100] (vLLM's ``--metric-percentiles``)."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FleetsimInputError("--percentiles", text, "give comma-separated numbers, "
                                 "e.g. 50,90,99") from None
    if not values or any(not (0 < v <= 100) or not math.isfinite(v) for v in values):
        raise FleetsimInputError("--percentiles", text, "give percentiles in (0, 100], "
                                 "e.g. 50,90,99")
    return values


def _pword(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def _stats(name: str, ms: np.ndarray, percentiles: list[float]) -> dict[str, float]:
    v = ms[np.isfinite(ms)]
    if v.size == 0:
        out = {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0}
        out.update({f"p{_pword(p)}_{name}_ms": 0.0 for p in percentiles})
        return out
    out = {f"mean_{name}_ms": float(np.mean(v)), f"median_{name}_ms": float(np.median(v)),
           f"std_{name}_ms": float(np.std(v))}
    for p, x in zip(percentiles, np.percentile(v, percentiles), strict=True):
        out[f"p{_pword(p)}_{name}_ms"] = float(x)
    return out


def vllm_result(result: Any, percentiles: list[float]) -> dict[str, Any]:
    """The ``vllm bench serve`` result dict of a fleetsim ``RunResult``."""
    s = result.summary
    req = result.records.requests
    lat = per_request_latencies(req)
    completed = int(req["request_id"].size)
    first_sent = float(req["arrival_s"].min()) if completed else 0.0
    if result.unfinished:
        first_sent = min(first_sent, min(r.arrival_s for r in result.unfinished))
    duration = float(req["finish_s"].max()) - first_sent if completed else 0.0
    total_in = int(req["num_prompt_tokens"].sum())
    total_out = int(req["num_output_tokens"].sum())
    slo = s["slo"]
    ttft, tpot = lat["ttft_s"], lat["tpot_s"]
    good = int(((ttft <= slo["ttft_s"]) & (np.isnan(tpot) | (tpot <= slo["tpot_s"]))).sum())
    cfg = result.config
    wl = cfg["workload"]
    out: dict[str, Any] = {
        "backend": "fleetsim",
        "model_id": s["model"],
        "num_prompts": s["num_requests"],
        "request_rate": wl.get("rate_per_s") if wl.get("trace") is None else None,
        "burstiness": (1.0 / wl["cv"] ** 2) if wl.get("arrival") == "gamma" else 1.0,
        "max_concurrency": wl.get("max_concurrency"),
        "duration": duration,
        "completed": completed,
        "failed": s["num_requests"] - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration if duration > 0 else 0.0,
        "request_goodput": good / duration if duration > 0 else 0.0,
        "output_throughput": total_out / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration > 0 else 0.0,
        "goodput_slo_ms": {"ttft": slo["ttft_s"] * 1e3, "tpot": slo["tpot_s"] * 1e3},
    }
    out.update(_stats("ttft", ttft * 1e3, percentiles))
    tpot_ms = tpot[req["num_output_tokens"] > 1] * 1e3
    out.update(_stats("tpot", tpot_ms, percentiles))
    g, c = result.records.itl_gaps_s, result.records.itl_counts
    if g is not None and g.size:
        n = int(c.sum())
        mean = float((g * c).sum() / n)
        itl = {"mean_itl_ms": mean * 1e3,
               "median_itl_ms": weighted_percentiles(g, c, [50])[0] * 1e3,
               "std_itl_ms": math.sqrt(float((c * (g - mean) ** 2).sum()) / n) * 1e3}
        for p, x in zip(percentiles, weighted_percentiles(g, c, percentiles), strict=True):
            itl[f"p{_pword(p)}_itl_ms"] = x * 1e3
        out.update(itl)
    else:
        out.update(_stats("itl", np.array([]), percentiles))
    out.update(_stats("e2el", lat["e2e_s"] * 1e3, percentiles))
    out["engine_build"] = s.get("engine_build")
    return out
