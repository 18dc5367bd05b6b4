"""Summary statistics of a trace or workload, for ``fleetsim trace info`` and reports."""

from __future__ import annotations

import os

import numpy as np
from numpy.typing import NDArray

from fleetsim.workloads.loaders import load_trace
from fleetsim.workloads.workload import Workload


def trace_info(
    source: str | os.PathLike[str], format: str = "auto", *, hash_block_tokens: int = 512
) -> dict[str, object]:
    """Statistics of a trace file or ``embedded:<name>``; see ``workload_info`` for the keys.

    ``format`` and ``hash_block_tokens`` are passed to ``load_trace``.
    """
    info = workload_info(load_trace(source, format, hash_block_tokens=hash_block_tokens))
    info["source"] = os.fspath(source)
    return info


def workload_info(workload: Workload) -> dict[str, object]:
    """A flat, JSON-ready dict of plain ints, floats, strings and None.

    Keys: ``source``, ``rows``, ``span_s`` (first to last arrival), ``mean_rate_per_s``
    (rows / span), ``iat_cv`` (std / mean of inter-arrival times; 1 for Poisson), then
    ``prompt_tokens_{mean,p50,p90,p99,max}`` and the same for ``output_tokens``, and for traces
    with ``hash_ids``: ``hash_block_tokens``, ``num_hash_blocks``, ``num_distinct_hash_blocks``,
    ``hash_block_reuse_share`` (share of blocks equal to an earlier block: the hit share of an
    infinite cache that may match any block) and ``prefix_hit_block_share`` (share of blocks in
    the longest already-seen prefix of their request: the hit share of an infinite prefix
    cache). The hash keys are None when the trace has no hash_ids.
    """
    arrival = workload.arrival_s
    rows = len(workload)
    span_s = float(arrival[-1] - arrival[0]) if rows else 0.0
    iat = np.diff(arrival)
    iat_mean = float(iat.mean()) if len(iat) else 0.0
    info: dict[str, object] = {
        "source": workload.name,
        "rows": rows,
        "span_s": span_s,
        "mean_rate_per_s": rows / span_s if span_s > 0 else None,
        "iat_cv": float(iat.std()) / iat_mean if iat_mean > 0 else None,
    }
    info.update(_length_stats("prompt_tokens", workload.num_prompt_tokens))
    info.update(_length_stats("output_tokens", workload.num_output_tokens))
    info.update(_hash_stats(workload))
    return info


def _length_stats(prefix: str, tokens: NDArray[np.int64]) -> dict[str, object]:
    if len(tokens) == 0:
        return {f"{prefix}_{k}": None for k in ("mean", "p50", "p90", "p99", "max")}
    p50, p90, p99 = np.percentile(tokens, [50, 90, 99])
    return {
        f"{prefix}_mean": float(tokens.mean()),
        f"{prefix}_p50": float(p50),
        f"{prefix}_p90": float(p90),
        f"{prefix}_p99": float(p99),
        f"{prefix}_max": int(tokens.max()),
    }


def _hash_stats(workload: Workload) -> dict[str, object]:
    keys = (
        "hash_block_tokens",
        "num_hash_blocks",
        "num_distinct_hash_blocks",
        "hash_block_reuse_share",
        "prefix_hit_block_share",
    )
    if workload.hash_ids is None:
        return dict.fromkeys(keys)
    seen: set[int] = set()
    num_blocks = num_prefix_hits = 0
    for ids in workload.hash_ids:
        hits = 0
        for block in ids:
            if block not in seen:
                break
            hits += 1
        num_prefix_hits += hits
        num_blocks += len(ids)
        seen.update(ids)
    return {
        "hash_block_tokens": workload.hash_block_tokens,
        "num_hash_blocks": num_blocks,
        "num_distinct_hash_blocks": len(seen),
        "hash_block_reuse_share": 1 - len(seen) / num_blocks if num_blocks else None,
        "prefix_hit_block_share": num_prefix_hits / num_blocks if num_blocks else None,
    }
