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

The key list is that of ``vllm bench serve --save-result`` (``--save-detailed`` adds the
per-request arrays) in vllm-project/vllm ``vllm/benchmarks/serve.py`` at commit def9ce85
(``main_async`` and ``benchmark``): ``SETUP_KEYS``, ``RESULT_KEYS``, ``DETAILED_KEYS``, then
``mean/median/std/p{P}_{metric}_ms`` for each selected metric. ``max_output_tokens_per_s`` and
``max_concurrent_requests`` follow its ``calculate_metrics``: output tokens and requests in
flight per one-second bucket from the first send, their maxima. The simulator keeps no
per-token times, so for ``fleetsim run`` a request's tokens are placed evenly between its
first token and its finish (exact for the pooled count, approximate within a second).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.metrics.summary import per_request_latencies, weighted_percentiles

METRICS = ("ttft", "tpot", "itl", "e2el")
SETUP_KEYS = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
              "num_prompts", "request_rate", "burstiness", "max_concurrency")
RESULT_KEYS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_throughput", "request_goodput", "output_throughput",
               "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests")
DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def add_vllm_json_flags(p: Any) -> None:
    """``vllm bench serve``'s flags that shape its result file (``run`` and ``load``)."""
    p.add_argument("--label", default=None, help="the result's label (vLLM's --label)")
    p.add_argument("--percentile-metrics", default=",".join(METRICS), metavar="M,M,...",
                   help="metrics whose statistics the result carries (default "
                   "ttft,tpot,itl,e2el; vLLM's default leaves out e2el)")
    p.add_argument("--save-detailed", action="store_true",
                   help="also write the per-request arrays (input_lens, output_lens, ttfts, "
                   "itls, generated_texts, errors)")


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:200", "tpot:50"]`` (vLLM's ``--goodput``, milliseconds) as a dict."""
    out: dict[str, float] = {}
    for item in items or ():
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if name not in GOODPUT_METRICS or not math.isfinite(ms) or ms < 0:
            raise FleetsimInputError("--goodput", item, "give METRIC:MS pairs with METRIC one "
                                     "of ttft, tpot, e2el and MS >= 0, e.g. ttft:200 tpot:50")
        out[name] = ms
    return out


def parse_metrics(text: str) -> list[str]:
    """``"ttft,tpot,itl"`` (vLLM's ``--percentile-metrics``)."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names or any(n not in METRICS for n in names):
        raise FleetsimInputError("--percentile-metrics", text, "give a comma-separated subset "
                                 "of ttft,tpot,itl,e2el")
    return names


def peak_output_and_concurrency(start_s: np.ndarray, e2e_s: np.ndarray,
                                token_times_s: list[np.ndarray]) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests`` over successful
    requests: ``start_s``/``e2e_s`` per request, ``token_times_s`` its output tokens' times
    (same clock as ``start_s``)."""
    if start_s.size == 0:
        return 0.0, 0
    t0 = float(start_s.min())
    num_seconds = int(np.ceil(float((start_s + e2e_s).max()) - t0)) + 1
    tokens = np.zeros(num_seconds)
    concurrent = np.zeros(num_seconds)
    for times in token_times_s:
        b = (times - t0).astype(np.int64)
        b = b[(b >= 0) & (b < num_seconds)]
        np.add.at(tokens, b, 1)
    first = (start_s - t0).astype(np.int64)
    last = (start_s + e2e_s - t0).astype(np.int64)
    for a, z in zip(first, last, strict=True):
        concurrent[a:z + 1] += 1
    return float(tokens.max()), int(concurrent.max())


def bench_result(*, setup: dict[str, Any], duration: float, ok: np.ndarray,
                 start_s: np.ndarray, ttft_s: np.ndarray, e2e_s: np.ndarray,
                 input_lens: np.ndarray, output_lens: np.ndarray,
                 itls: list[list[float]] | None, percentiles: list[float],
                 percentile_metrics: tuple[str, ...] | list[str] = METRICS,
                 goodput: dict[str, float] | None = None, detailed: bool = False,
                 errors: list[str] | None = None, generated_texts: list[str] | None = None,
                 itl_pooled: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """The result file of ``vllm bench serve`` from per-request arrays (all requests, the
    failed ones with ``ok`` False; seconds). ``itls``: each request's gaps between output
    tokens, or None with ``itl_pooled`` = (sorted gaps, their counts) instead."""
    n_out = np.where(ok, output_lens, 0)
    total_in, total_out = int(input_lens[ok].sum()), int(n_out.sum())
    completed = int(ok.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (n_out > 1), (e2e_s - ttft_s) / (n_out - 1), np.nan)
    r: dict[str, Any] = {k: setup.get(k) for k in SETUP_KEYS}
    good = None
    if goodput:
        checks = {"ttft": ttft_s, "tpot": np.nan_to_num(tpot, nan=0.0), "e2el": e2e_s}
        mask = ok.copy()
        for name, ms in goodput.items():
            mask &= checks[name] <= ms / 1e3
        good = int(mask.sum())
    if itls is not None:
        token_times = [float(start_s[i]) + float(ttft_s[i]) + np.concatenate(
            [[0.0], np.cumsum(itls[i])]) for i in np.flatnonzero(ok)]
    else:  # evenly between the first token and the finish (see the module docstring)
        token_times = [float(start_s[i]) + np.linspace(float(ttft_s[i]), float(e2e_s[i]),
                                                       int(n_out[i]))
                       for i in np.flatnonzero(ok)]
    peak_tokens, peak_requests = peak_output_and_concurrency(start_s[ok], e2e_s[ok],
                                                             token_times)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    r.update({
        "duration": duration, "completed": completed, "failed": int(ok.size - completed),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(completed),
        "request_goodput": per_s(good) if good is not None else None,
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
    })
    if goodput:
        r["goodput_slo_ms"] = dict(goodput)
    if detailed:
        r.update({"input_lens": [int(x) for x in input_lens],
                  "output_lens": [int(x) for x in n_out],
                  "ttfts": [float(x) if k else 0.0 for x, k in zip(ttft_s, ok, strict=True)],
                  "itls": ([list(map(float, x)) for x in itls] if itls is not None
                           else [[] for _ in range(ok.size)]),
                  "generated_texts": generated_texts or ["" for _ in range(ok.size)],
                  "errors": errors or ["" for _ in range(ok.size)]})
    series = {"ttft": ttft_s[ok] * 1e3, "tpot": tpot[ok & (n_out > 1)] * 1e3,
              "e2el": e2e_s[ok] * 1e3}
    for name in percentile_metrics:
        if name == "itl" and itls is None:
            r.update(_pooled_itl(itl_pooled, percentiles))
        elif name == "itl":
            assert itls is not None
            gaps = [g for i in np.flatnonzero(ok) for g in itls[i]]
            r.update(_stats("itl", np.array(gaps, dtype=np.float64) * 1e3, percentiles))
        else:
            r.update(_stats(name, series[name], percentiles))
    return r


def _pooled_itl(pooled: tuple[np.ndarray, np.ndarray] | None,
                percentiles: list[float]) -> dict[str, float]:
    if pooled is None or pooled[0].size == 0:
        return _stats("itl", np.array([]), percentiles)
    g, c = pooled
    n = int(c.sum())
    mean = float((g * c).sum() / n)
    out = {"mean_itl_ms": mean * 1e3,
           "median_itl_ms": weighted_percentiles(g, c, [50])[0] * 1e3,
           "std_itl_ms": math.sqrt(float((c * (g - mean) ** 2).sum()) / n) * 1e3}
    for p, x in zip(percentiles, weighted_percentiles(g, c, percentiles), strict=True):
        out[f"p{_pword(p)}_itl_ms"] = x * 1e3
    return out


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


def vllm_result(result: Any, percentiles: list[float], *, date: str | None = None,
                label: str | None = None, detailed: bool = False,
                percentile_metrics: tuple[str, ...] | list[str] = METRICS) -> dict[str, Any]:
    """The ``vllm bench serve`` result dict of a fleetsim ``RunResult`` (``date``: the
    caller's, as vLLM's ``%Y%m%d-%H%M%S``; requests cut off unfinished count as failed)."""
    s = result.summary
    req = result.records.requests
    lat = per_request_latencies(req)
    completed = int(req["request_id"].size)
    first_sent = float(req["arrival_s"].min()) if completed else 0.0
    if result.unfinished:
        first_sent = min(first_sent, min(r.arrival_s for r in result.unfinished))
    duration = float(req["finish_s"].max()) - first_sent if completed else 0.0
    unfinished = list(result.unfinished)
    nan = np.full(len(unfinished), np.nan)
    ok = np.concatenate([np.ones(completed, bool), np.zeros(len(unfinished), bool)])
    slo = s["slo"]
    cfg = result.config
    wl = cfg["workload"]
    rate = wl.get("rate_per_s") if wl.get("trace") is None else None
    if wl.get("trace") is None and wl.get("arrival") == "at_once":
        rate = "inf"
    g, c = result.records.itl_gaps_s, result.records.itl_counts
    out = bench_result(
        setup={"date": date, "endpoint_type": "fleetsim", "backend": "fleetsim",
               "label": label, "model_id": cfg.get("model", s["model"]),
               "tokenizer_id": cfg.get("model", s["model"]), "num_prompts": s["num_requests"],
               "request_rate": rate,
               "burstiness": (1.0 / wl["cv"] ** 2) if wl.get("arrival") == "gamma" else 1.0,
               "max_concurrency": wl.get("max_concurrency")},
        duration=duration, ok=ok,
        start_s=np.concatenate([req["arrival_s"], [r.arrival_s for r in unfinished]]),
        ttft_s=np.concatenate([lat["ttft_s"], nan]), e2e_s=np.concatenate([lat["e2e_s"], nan]),
        input_lens=np.concatenate([req["num_prompt_tokens"],
                                   [r.num_prompt_tokens for r in unfinished]]).astype(np.int64),
        output_lens=np.concatenate([req["num_output_tokens"],
                                    np.zeros(len(unfinished))]).astype(np.int64),
        itls=None, itl_pooled=(g, c) if g is not None else None, percentiles=percentiles,
        percentile_metrics=percentile_metrics,
        goodput={"ttft": slo["ttft_s"] * 1e3, "tpot": slo["tpot_s"] * 1e3}, detailed=detailed,
        errors=["" for _ in range(completed)] + ["unfinished when the run ended"
                                                  for _ in unfinished])
    out["num_prompts"] = s["num_requests"]
    out["engine_build"] = s.get("engine_build")
    return out
