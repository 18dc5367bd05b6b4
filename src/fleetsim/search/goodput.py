"""Goodput: the highest arrival rate at which a target share of requests meets the SLO.

Every probe is a full ``run()`` of the config with ``workload.rate_scale`` multiplied, for
traces and synthetic workloads alike: each probe replays the same requests (same lengths,
same arrival pattern, same random draws) compressed or stretched in time, so that the only
thing that changes between probes is the load. A rate is requests per second of arrival span
(``num_requests / (last arrival - first arrival)``) of the workload the probe actually ran.

Attainment is ``summary["slo"]["attainment"]``: requests unfinished at the end (``until_s``)
count as misses. Keep probes quick with ``workload.max_requests`` (the first N requests,
which then arrive over a span that shrinks as the rate grows) or ``workload.duration_s``
(a fixed window of simulated time, so more requests as the rate grows). Short slices
overstate goodput: queues have less time to build up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.config import SimConfig
from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import check_number, limits_of
from fleetsim.search.cost import cluster_usd_per_hour, num_gpus, usd_per_million_tokens
from fleetsim.search.threshold import ThresholdResult, search_threshold
from fleetsim.workloads import Workload, build_workload


@dataclass(frozen=True, slots=True)
class GoodputResult:
    """A goodput search over one config."""

    target: float
    """Share of requests that must meet the SLO."""
    ttft_s: float
    tpot_s: float
    base_rate_per_s: float
    """Arrival rate of the config as given (rate_scale as set), requests per second."""
    search: ThresholdResult
    usd_per_hour: float
    num_gpus: int

    @property
    def goodput_rate_per_s(self) -> float | None:
        return self.search.goodput_rate_per_s


def arrival_rate_per_s(workload: Workload) -> float:
    """Requests per second of arrival span (first to last arrival)."""
    n = len(workload)
    span_s = float(workload.arrival_s[-1] - workload.arrival_s[0]) if n else 0.0
    if n < 2 or span_s <= 0:
        raise FleetsimInputError(
            "workload", f"{n} request(s) over {span_s:g} s",
            "a rate search needs at least two requests arriving at different times; "
            "raise workload.max_requests or widen workload.duration_s")
    return n / span_s


def config_at_scale(config: SimConfig, multiplier: float) -> SimConfig:
    """``config`` with its arrival rate multiplied by ``multiplier`` (via rate_scale)."""
    wl = config.workload
    try:
        return dataclasses.replace(
            config, workload=dataclasses.replace(wl, rate_scale=wl.rate_scale * multiplier))
    except ValueError as err:  # e.g. a synthetic window asking for too many requests
        raise FleetsimInputError("workload.rate_scale", wl.rate_scale * multiplier,
                                 str(err)) from None


def base_rate_per_s(config: SimConfig) -> float:
    """Arrival rate of the config's own workload, without simulating it."""
    from fleetsim.run import seed_streams

    rng = seed_streams(config.seed, ("workload",))["workload"]
    return arrival_rate_per_s(build_workload(config.workload, rng))


def probe_config(config: SimConfig) -> tuple[float, dict[str, Any]]:
    """Run ``config``; return its SLO attainment and what a report needs about the run."""
    from fleetsim.run import run

    result = run(config)
    s, wl = result.summary, result.workload
    extra: dict[str, Any] = {
        "measured_rate_per_s": arrival_rate_per_s(wl),
        "num_requests": s["num_requests"],
        "num_unfinished": s["num_unfinished"],
        "ttft_attainment": s["slo"]["ttft_attainment"],
        "tpot_attainment": s["slo"]["tpot_attainment"],
        "ttft_p90_s": s["ttft_s"]["p90"],
        "tpot_p90_s": s["tpot_s"]["p90"],
        "tpot_mean_s": s["tpot_s"]["mean"],
        "tokens_per_request": float(np.mean(wl.num_prompt_tokens + wl.num_output_tokens)),
        "output_tokens_per_request": float(np.mean(wl.num_output_tokens)),
        "usd_per_hour": cluster_usd_per_hour(config, s),
    }
    return float(s["slo"]["attainment"]), extra


def goodput_search(
    config: SimConfig,
    *,
    target: float = 0.9,
    min_rate_per_s: float | None = None,
    max_rate_per_s: float | None = None,
    start_rate_per_s: float | None = None,
    rel_tol: float = 0.05,
    max_runs: int = 20,
    growth: float = 2.0,
    num_verify: int = 1,
    on_probe: Callable[[float, float], None] | None = None,
) -> GoodputResult:
    """Search the highest rate (requests/s) with SLO attainment >= ``target``.

    The search starts at ``start_rate_per_s`` (default: the config's own rate), brackets by
    factors of ``growth`` and bisects to ``rel_tol``; see ``fleetsim.search.threshold``.
    Raises ``FleetsimInputError`` for bad arguments and for configs ``run()`` rejects (a
    model that does not fit the GPU, for example) before any search work is lost.
    ``on_probe(rate_per_s, attainment)`` is called after each run (progress display).
    """
    check_search_args(target, min_rate_per_s, max_rate_per_s, rel_tol, max_runs)
    base = base_rate_per_s(config)

    def probe(rate_per_s: float) -> tuple[float, dict[str, Any]]:
        attainment, extra = probe_config(config_at_scale(config, rate_per_s / base))
        if on_probe is not None:
            on_probe(rate_per_s, attainment)
        return attainment, extra

    lo, hi = _scale_bounds(config, base, min_rate_per_s, max_rate_per_s)
    found = search_threshold(
        probe, target=target, start_rate_per_s=start_rate_per_s or base,
        min_rate_per_s=lo, max_rate_per_s=hi, rel_tol=rel_tol,
        max_runs=max_runs, growth=growth, num_verify=num_verify)
    return GoodputResult(target, config.slo.ttft_s, config.slo.tpot_s, base, found,
                         cluster_usd_per_hour(config), num_gpus(config))


def check_slo_reachable(config: SimConfig, target: float, sample: int = 2000) -> None:
    """Fail fast (exit 2) when even alone on an idle replica fewer than ``target`` of the
    requests would meet the SLO: no rate can, and walking the rate down would only say
    "goodput 0" after many runs. Standalone TTFT is the prompt's chunked prefill, standalone
    TPOT the mean decode step at batch size 1 (``serving/standalone.py``), on the fastest
    pool; the first ``sample`` requests are checked."""
    import numpy as np

    from fleetsim.hardware import get_gpu
    from fleetsim.metrics.slo import attainment
    from fleetsim.models import get_model
    from fleetsim.run import pool_step_model, seed_streams
    from fleetsim.serving.standalone import decode_time_s, prefill_time_s
    from fleetsim.workloads import build_workload

    workload = build_workload(config.workload, seed_streams(config.seed, ("workload",))[
        "workload"])
    prompt = workload.num_prompt_tokens[:sample].tolist()
    output = workload.num_output_tokens[:sample].tolist()
    model = get_model(config.model)
    budget = config.engine.max_batched_tokens
    best_ttft = np.full(len(prompt), np.inf)
    best_tpot = np.full(len(prompt), np.inf)
    for pool in config.pools:
        step = pool_step_model(config, model, get_gpu(pool.gpu, config.hardware.catalog),
                               pool.tp, pool.pp)
        if pool.role != "decode":
            cache: dict[int, float] = {}
            ttft = [cache.setdefault(p, prefill_time_s(step, p, budget)) if p not in cache
                    else cache[p] for p in prompt]
            best_ttft = np.minimum(best_ttft, ttft)
        if pool.role != "prefill":
            tpot = [decode_time_s(step, p, o) / (o - 1) if o > 1 else 0.0
                    for p, o in zip(prompt, output, strict=True)]
            best_tpot = np.minimum(best_tpot, tpot)
    slo = config.slo
    share = attainment(best_ttft, best_tpot, slo.ttft_s, slo.tpot_s)
    if share < target:
        raise FleetsimInputError(
            "slo", f"ttft_s={slo.ttft_s:g}, tpot_s={slo.tpot_s:g}",
            f"even alone on an idle replica only {100 * share:.1f}% of requests would meet it "
            f"(standalone TTFT p50 {float(np.median(best_ttft)):.4g} s, TPOT p50 "
            f"{float(np.median(best_tpot)):.4g} s), below --target {target:g}: no rate can; "
            f"loosen the SLO, lower --target or use faster GPUs")


def check_search_args(target: float, min_rate_per_s: float | None,
                      max_rate_per_s: float | None, rel_tol: float, max_runs: int) -> None:
    """One-line input errors naming the CLI flag."""
    if not 0.0 < target <= 1.0:
        raise FleetsimInputError("--target", target, "must be a share in (0, 1], e.g. 0.9")
    for flag, v in (("--min-rate", min_rate_per_s), ("--max-rate", max_rate_per_s)):
        if v is not None and not v > 0:
            raise FleetsimInputError(flag, v, "must be > 0 requests per second")
    if (min_rate_per_s is not None and max_rate_per_s is not None
            and min_rate_per_s > max_rate_per_s):
        raise FleetsimInputError("--min-rate", min_rate_per_s,
                                 f"must not exceed --max-rate {max_rate_per_s}")
    if not rel_tol > 0:
        raise FleetsimInputError("--tol", rel_tol, "must be > 0, e.g. 0.05 (5%)")
    if max_runs < 1:
        raise FleetsimInputError("--max-runs", max_runs, "must be >= 1")
    for flag, v, lo, hi in (("--min-rate", min_rate_per_s, 0.0, MAX_RATE_PER_S),
                            ("--max-rate", max_rate_per_s, 0.0, MAX_RATE_PER_S),
                            ("--tol", rel_tol, 0.0, 10.0), ("--max-runs", max_runs, 1, 1000)):
        if v is not None:
            check_number(v, flag, lo=lo, hi=hi)


MAX_RATE_PER_S = 1e7
"""Highest arrival rate a search may probe (``inputs.FIELD_LIMITS['rate_per_s']``)."""


def _scale_bounds(config: SimConfig, base: float, min_rate_per_s: float | None,
                  max_rate_per_s: float | None) -> tuple[float, float]:
    """The rates a search may probe: those whose rate_scale stays within its bounds."""
    lo_scale, hi_scale = limits_of("rate_scale")
    per_scale = base / config.workload.rate_scale
    lo, hi = per_scale * lo_scale, min(per_scale * hi_scale, MAX_RATE_PER_S)
    for flag, v in (("--min-rate", min_rate_per_s), ("--max-rate", max_rate_per_s)):
        if v is not None and not lo <= v <= hi:
            raise FleetsimInputError(flag, v, f"this workload can be replayed at {lo:.3g} to "
                                     f"{hi:.3g} requests/s (workload.rate_scale "
                                     f"{lo_scale:g} to {hi_scale:g})")
    return (min_rate_per_s or lo, max_rate_per_s or hi)


def goodput_to_dict(result: GoodputResult) -> dict[str, Any]:
    """JSON-ready report: the answer, its cost, and every probe in the order it ran."""
    found = result.search
    best = next((p for p in found.probes if p.rate_per_s == found.goodput_rate_per_s), None)
    per_req = best.extra.get("tokens_per_request", 0.0) if best else 0.0
    out_per_req = best.extra.get("output_tokens_per_request", 0.0) if best else 0.0
    rate = found.goodput_rate_per_s
    return {
        "goodput_requests_per_s": rate,
        "attainment_at_goodput": best.attainment if best else None,
        "lowest_failing_rate_per_s": found.lowest_fail_rate_per_s,
        "status": found.status,
        "monotone": found.monotone,
        "monotonicity_violations": [
            {"failing_rate_per_s": f, "passing_rate_per_s": p} for f, p in found.violations],
        "target": result.target,
        "slo": {"ttft_s": result.ttft_s, "tpot_s": result.tpot_s},
        "base_rate_per_s": result.base_rate_per_s,
        "num_runs": len(found.probes),
        "num_gpus": result.num_gpus,
        "usd_per_hour": result.usd_per_hour,
        "usd_per_million_tokens": usd_per_million_tokens(result.usd_per_hour, rate, per_req),
        "usd_per_million_output_tokens": usd_per_million_tokens(
            result.usd_per_hour, rate, out_per_req),
        "probes": [
            {"rate_per_s": p.rate_per_s, "attainment": p.attainment, "passed": p.passed,
             **{k: v for k, v in p.extra.items() if k != "usd_per_hour"}}
            for p in found.probes],
    }
