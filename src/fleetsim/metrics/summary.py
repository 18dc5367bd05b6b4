"""Aggregate metrics of a run: latency percentiles, throughput, SLO attainment, goodput, use.

Definitions (all times in seconds):
- TTFT = first output token time - arrival; E2E = finish - arrival;
  TPOT = (finish - first token) / (outputs - 1), undefined (NaN) for one-output requests;
  queueing delay = first time scheduled - arrival.
- A request meets the SLO when TTFT <= ttft_s and TPOT <= tpot_s (NaN TPOT counts as met).
  Attainment is over all requests that arrived; ones unfinished at the end count as misses.
- Goodput = requests meeting the SLO per second of makespan (first arrival to last finish).
- KV use = time-average of blocks held by requests / total blocks; GPU busy = share of the
  makespan during which the replica was running a step (however small); ``batch`` says how
  full those steps were (mean running requests, mean tokens per step).
- The timeline: the same quantities over time, in bins of fixed width from the first arrival
  (the arrivals' span / 120, merged in groups when the run drains long after), each the exact
  integral over its bin: equal with decode fast-forward on and off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.metrics.slo import slo_met
from fleetsim.serving.recorder import Records


@dataclass(frozen=True, slots=True, kw_only=True)
class SLOConfig:
    """Latency targets for SLO attainment and goodput."""

    ttft_s: float = 1.0
    """Time-to-first-token target, seconds (a chat service's usual 1 s)."""
    tpot_s: float = 0.05
    """Time-per-output-token target, seconds (50 ms = 20 tokens/s, faster than reading)."""

    def __post_init__(self) -> None:
        if not self.ttft_s > 0:
            raise ValueError(f"slo.ttft_s must be > 0 seconds, got {self.ttft_s}")
        if not self.tpot_s > 0:
            raise ValueError(f"slo.tpot_s must be > 0 seconds, got {self.tpot_s}")


def per_request_latencies(req: dict[str, NDArray]) -> dict[str, NDArray]:
    """TTFT, TPOT, E2E and queueing delay per finished request (columns of ``req``)."""
    arrival = req["arrival_s"]
    outputs = req["num_output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (req["finish_s"] - req["first_token_s"]) / (outputs - 1),
                        np.nan)
        itl_mean = np.where(outputs > 1, (req["last_token_s"] - req["first_token_s"])
                            / (outputs - 1), np.nan)
    return {
        "ttft_s": req["first_token_s"] - arrival,
        "tpot_s": tpot,
        "e2e_s": req["finish_s"] - arrival,
        "queueing_s": req["first_scheduled_s"] - arrival,
        "itl_mean_s": itl_mean,
        "itl_p99_s": req["itl_p99_s"],
        "itl_max_s": req["itl_max_s"],
    }


def weighted_percentiles(values: NDArray, counts: NDArray, pcts: list[float]) -> list[float]:
    """``np.percentile(np.repeat(values, counts), pcts)`` (linear) without expanding:
    ``values`` sorted ascending, ``counts`` > 0."""
    cum = np.cumsum(counts)
    n = int(cum[-1])
    out = []
    for p in pcts:
        pos = (n - 1) * (p / 100.0)
        lo = int(math.floor(pos))
        hi = min(lo + 1, n - 1)
        a = float(values[np.searchsorted(cum, lo, side="right")])
        b = float(values[np.searchsorted(cum, hi, side="right")])
        t = pos - lo
        diff = b - a
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def itl_distribution(records: Records) -> dict[str, float | None]:
    """Pooled gaps between output tokens of all requests (``vllm bench serve``'s ITL):
    mean, std, p50/p90/p99, max, and how many gaps."""
    g, c = records.itl_gaps_s, records.itl_counts
    if g is None or c is None or g.size == 0:
        return {"mean": None, "std": None, "p50": None, "p90": None, "p99": None,
                "max": None, "num_gaps": 0}
    n = int(c.sum())
    mean = float((g * c).sum() / n)
    std = float(math.sqrt(max(float((c * (g - mean) ** 2).sum()) / n, 0.0)))
    p50, p90, p99 = weighted_percentiles(g, c, [50, 90, 99])
    return {"mean": mean, "std": std, "p50": p50, "p90": p90, "p99": p99,
            "max": float(g[-1]), "num_gaps": n}


def distribution(values: NDArray) -> dict[str, float | None]:
    """mean/p50/p90/p99/max of the finite values (None when there are none)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90),
            "p99": float(p99), "max": float(v.max())}


def summarize(
    records: Records,
    *,
    num_arrived: int,
    first_arrival_s: float,
    slo: SLOConfig,
    num_kv_blocks_by_replica: dict[int, int],
    num_timeline_bins: int = 120,
    timeline_cache: dict[tuple[float, float, int], dict[str, NDArray]] | None = None,
) -> dict[str, Any]:
    """The run's aggregate metrics as a JSON-ready dict (``timeline_cache``: see
    ``timeline_bins``)."""
    req = records.requests
    lat = per_request_latencies(req)
    num_finished = int(req["finish_s"].size)
    end_s = float(req["finish_s"].max()) if num_finished else first_arrival_s
    makespan_s = max(end_s - first_arrival_s, 1e-12)
    met_ttft, met_tpot = slo_met(lat["ttft_s"], lat["tpot_s"], slo.ttft_s, slo.tpot_s)
    met = met_ttft & met_tpot
    denom = max(num_arrived, 1)
    total_blocks = sum(num_kv_blocks_by_replica.values())
    busy = sum(records.busy_s_by_replica.values())
    num_replicas = max(len(num_kv_blocks_by_replica), 1)
    prompt_tokens = int(req["num_prompt_tokens"].sum())
    return {
        "num_requests": num_arrived,
        "num_finished": num_finished,
        "num_unfinished": num_arrived - num_finished,
        "makespan_s": makespan_s,
        "ttft_s": distribution(lat["ttft_s"]),
        "tpot_s": distribution(lat["tpot_s"]),
        "e2e_s": distribution(lat["e2e_s"]),
        "queueing_s": distribution(lat["queueing_s"]),
        "itl_s": itl_distribution(records),
        "throughput": {
            "requests_per_s": num_finished / makespan_s,
            "input_tokens_per_s": prompt_tokens / makespan_s,
            "output_tokens_per_s": int(req["num_output_tokens"].sum()) / makespan_s,
        },
        "slo": {
            "ttft_s": slo.ttft_s,
            "tpot_s": slo.tpot_s,
            "attainment": int(met.sum()) / denom,
            "ttft_attainment": int(met_ttft.sum()) / denom,
            "tpot_attainment": int(met_tpot.sum()) / denom,
            "goodput_requests_per_s": int(met.sum()) / makespan_s,
        },
        "kv_cache": {
            "num_blocks": total_blocks,
            "mean_used_fraction": (sum(records.kv_block_seconds_by_replica.values())
                                   / max(total_blocks, 1) / makespan_s),
            "prefix_hit_rate": int(req["num_prefix_hit_tokens"].sum()) / max(prompt_tokens, 1),
        },
        "gpu_busy_fraction": busy / num_replicas / makespan_s,
        "batch": batch_stats(records),
        "num_preemptions": int(req["num_preemptions"].sum()),
        "num_swaps": int(req["num_swaps"].sum()) if "num_swaps" in req else 0,
        "num_recomputed_tokens": int(req["num_recomputed_tokens"].sum()),
        "num_steps": records.num_steps,
        "timeline": timeline_bins(records, first_arrival_s, end_s, total_blocks,
                                  num_replicas, num_timeline_bins, timeline_cache),
    }


def batch_stats(records: Records) -> dict[str, float]:
    """How full the steps were: busy-time-weighted running requests, and tokens per step.
    (A replica is "busy" whenever a step runs, even with one request in it; these say how
    much work the steps carried.)"""
    tl = records.timeline
    busy = float(tl["busy_s"].sum())
    num_steps = int(tl["num_steps"].sum())
    if busy <= 0 or num_steps == 0:
        return {"mean_running": 0.0, "mean_tokens_per_step": 0.0}
    return {"mean_running": float((tl["num_running"] * tl["busy_s"]).sum()) / busy,
            "mean_tokens_per_step": float(tl["num_tokens"].sum()) / num_steps}


# Rows of the timeline binned at a time by ``_fine_sums``: its temporaries (a few arrays of
# 8 bytes a row) stay small and are reused from chunk to chunk, where whole-timeline ones were
# fresh memory to fault in (at a million requests, 3.2 million rows: 0.2 s of a 0.33 s pass).
FINE_SUMS_CHUNK_ROWS = 1 << 16
# The most recorded bins the summary adds up (four float arrays of them): past it, the run's
# makespan is split equally instead (a day in one-millisecond bins would be 86 million).
MAX_FINE_BINS = 1 << 22


def _fine_sums(tl: dict[str, NDArray], origin: float, width: float, num_fine: int,
               chunk_rows: int = FINE_SUMS_CHUNK_ROWS) -> dict[str, NDArray]:
    """Busy seconds, KV block-seconds and running/waiting x busy seconds in each of
    ``num_fine`` bins of ``width`` from ``origin`` (``timeline_bins``). The rows inside one
    bin are added chunk by chunk of ``chunk_rows``, each bin's in row order (``np.add.at``
    adds unbuffered, in order: the floats one ``np.bincount`` over every row adds), then the
    single steps across an edge, split by time."""
    edges = origin + np.arange(num_fine + 1, dtype=np.float64) * width
    busy_s, ends, kv_s = tl["busy_s"], tl["end_s"], tl["kv_block_seconds"]
    running, waiting = tl["num_running"], tl["num_waiting"]
    sums = {name: np.zeros(num_fine) for name in ("busy", "kv", "running", "waiting")}
    across_parts: list[NDArray] = []
    across_first: list[NDArray] = []
    across_last: list[NDArray] = []
    for a in range(0, len(ends), chunk_rows):
        b = a + chunk_rows
        busy_c, ends_c = busy_s[a:b], ends[a:b]
        starts = ends_c - busy_s[a:b]
        first = np.searchsorted(edges, starts, side="right")
        first -= 1
        np.clip(first, 0, num_fine - 1, out=first)
        last = np.searchsorted(edges, ends_c, side="left")
        last -= 1
        np.clip(last, 0, num_fine - 1, out=last)
        inside = first == last
        bins_in = first[inside]
        busy_in = busy_c[inside]
        np.add.at(sums["busy"], bins_in, busy_in)
        np.add.at(sums["kv"], bins_in, kv_s[a:b][inside])
        # (running x busy of the rows inside, elementwise: the same floats as the product
        # masked)
        np.add.at(sums["running"], bins_in, running[a:b][inside] * busy_in)
        np.add.at(sums["waiting"], bins_in, waiting[a:b][inside] * busy_in)
        out = np.flatnonzero(~inside)
        if out.size:
            across_parts.append(out + a)
            across_first.append(first[out])
            across_last.append(last[out])
    # Single steps across an edge: split by time. Each (step, bin) pair it spans, step by
    # step and bin by bin; ``np.add.at`` adds unbuffered in that order, so every bin gets the
    # same floats in the same order as a loop over the steps would add them.
    if not across_parts:
        return sums
    across = np.concatenate(across_parts)
    first_a, last_a = np.concatenate(across_first), np.concatenate(across_last)
    spans = np.maximum(last_a - first_a + 1, 0)
    j = np.repeat(across, spans)
    b = np.repeat(first_a, spans) + (np.arange(j.size)
                                     - np.repeat(np.cumsum(spans) - spans, spans))
    starts_j = ends[j] - busy_s[j]
    overlap = np.minimum(ends[j], edges[b + 1]) - np.maximum(starts_j, edges[b])
    dur = busy_s[j]
    keep = (overlap > 0) & (dur > 0)
    j, b, overlap, dur = j[keep], b[keep], overlap[keep], dur[keep]
    across_values = {"busy": dur, "kv": kv_s[j],  # (dur: their busy_s)
                     "running": running[j] * dur,
                     "waiting": waiting[j] * dur}
    for name, v in across_values.items():
        np.add.at(sums[name], b, v * overlap / dur)
    return sums


def timeline_bins(
    records: Records, start_s: float, end_s: float, total_blocks: int, num_replicas: int,
    max_bins: int, cache: dict[tuple[float, float, int], dict[str, NDArray]] | None = None,
) -> dict[str, list[float]]:
    """KV use, GPU busy share and queue lengths over time, in equal bins.

    Bins have the width the run recorded with (``records.timeline_bin_s``, from
    ``timeline_origin_s``), merged in groups of g so that at most ``max_bins`` remain. Every
    record lies in one bin, except single steps across an edge, which are split by time
    (their rates are constant), so each bin is the exact integral over it. KV use is the
    time-average of blocks held over the bin; running and waiting are busy-time-weighted.

    ``cache`` (optional): the integrals over the recorded bins, by (origin, width, number of
    bins), shared by calls over the same ``records`` (the run's summary and its one pool's:
    at a million requests each pass over the timeline's 3 million rows took 0.2-0.3 s).
    """
    empty: dict[str, list[float]] = {"bin_start_s": [], "kv_used_fraction": [],
                                     "busy_fraction": [], "mean_running": [],
                                     "mean_waiting": []}
    tl = records.timeline
    if tl["end_s"].size == 0 or not math.isfinite(end_s) or end_s <= start_s:
        return empty
    origin, width = records.timeline_origin_s, records.timeline_bin_s
    if not 0 < width < math.inf or (end_s - origin) / width > MAX_FINE_BINS:
        # No fixed bins (or more than the summary will hold: arrivals a few microseconds
        # apart and a long run): equal bins of the makespan, windows attributed approximately.
        origin, width = start_s, (end_s - start_s) / max_bins
    num_fine = max(1, math.ceil((end_s - origin) / width))
    key = (origin, width, num_fine)
    sums = cache.get(key) if cache is not None else None
    if sums is None:
        sums = _fine_sums(tl, origin, width, num_fine)
        if cache is not None:
            cache[key] = sums
    group = -(-num_fine // max_bins)
    num_bins = -(-num_fine // group)
    pad = num_bins * group - num_fine
    merged = {name: np.pad(v, (0, pad)).reshape(num_bins, group).sum(axis=1)
              for name, v in sums.items()}
    bin_width = width * group
    busy = merged["busy"]
    safe = np.where(busy > 0, busy, 1.0)
    return {
        "bin_start_s": (origin + bin_width * np.arange(num_bins)).tolist(),
        "kv_used_fraction": (merged["kv"] / (bin_width * max(total_blocks, 1))).tolist(),
        "busy_fraction": np.minimum(1.0, busy / (bin_width * num_replicas)).tolist(),
        "mean_running": (merged["running"] / safe).tolist(),
        "mean_waiting": (merged["waiting"] / safe).tolist(),
    }
