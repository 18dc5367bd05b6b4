"""``fleetsim compare LIVE.jsonl SIM_DIR``: live latency percentiles against the simulator's.

LIVE.jsonl is a trace written by ``fleetsim gateway --record``, ``fleetsim emulate --record``
or ``fleetsim load --out`` (its ``ttft_s``, ``tpot_s``, ``e2e_s`` of successful rows); SIM_DIR
is the results folder of ``fleetsim run`` on the same traffic (its ``requests.csv``).

With ``--engine EMULATED.jsonl`` (what ``fleetsim emulate --record`` wrote while serving the
same traffic) it also measures the front end: each request's live TTFT minus the emulator's
engine TTFT of the same request, i.e. the HTTP path both ways, which the simulator leaves out
unless ``cluster.frontend_overhead_s`` is set.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_text
from fleetsim.live.lag import DEFAULT_WARN_S
from fleetsim.live.trace import LATENCIES, measured, read_latencies, read_rows
from fleetsim.metrics.summary import distribution

STATS = ("mean", "p50", "p90", "p99")


def read_predicted(sim_dir: str | os.PathLike[str]) -> dict[str, list[float]]:
    """Per-request latencies of a ``fleetsim run`` results folder."""
    path = Path(sim_dir) / "requests.csv"
    text = read_text(path, "simulation results (fleetsim run --out DIR)")
    reader = csv.DictReader(io.StringIO(text))
    missing = [k for k in LATENCIES if k not in (reader.fieldnames or ())]
    if missing:
        raise FleetsimInputError(str(path), ",".join(reader.fieldnames or ())[:80],
                                 f"missing columns {', '.join(missing)}; pass the folder "
                                 f"fleetsim run --out wrote")
    out: dict[str, list[float]] = {k: [] for k in LATENCIES}
    for row in reader:
        for k in LATENCIES:
            try:
                v = float(row[k])
            except (TypeError, ValueError):
                continue
            if math.isfinite(v):
                out[k].append(v)
    return out


def compare(live_path: str | os.PathLike[str],
            sim_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """{latency: {"live": stats, "predicted": stats, "error": relative error of each stat}}
    plus the request counts."""
    live, predicted = read_latencies(live_path), read_predicted(sim_dir)
    out: dict[str, Any] = {"num_live": len(live["ttft_s"]),
                           "num_predicted": len(predicted["ttft_s"])}
    for k in LATENCIES:
        a = distribution(np.array(live[k], dtype=np.float64))
        b = distribution(np.array(predicted[k], dtype=np.float64))
        err = {s: (a[s] - b[s]) / b[s] if a[s] is not None and b[s] else None for s in STATS}
        out[k] = {"live": {s: a[s] for s in STATS}, "predicted": {s: b[s] for s in STATS},
                  "error": err}
    return out


MATCH_WINDOW = 8
"""Rows ahead searched for a request's counterpart when the traces carry no request ids
(sends close together may swap order on the way to the server)."""
MIN_MATCHED_SHARE = 0.95
"""Below this share of the live trace's requests matched, the front-end figure describes a
sample the traces chose, not the traffic: the report says so."""


def frontend_overhead(live_path: str | os.PathLike[str],
                      engine_paths: str | os.PathLike[str] | list[str | os.PathLike[str]]
                      ) -> dict[str, Any]:
    """Live TTFT minus engine TTFT per request, over matched pairs only:
    {"num_matched", "num_live", "matched_share", "matched_by", "mean", "p50", "p90", "p99"}
    (seconds). ``engine_paths``: one emulator's trace or one per backend. Rows are matched by
    ``request_id`` (the ``X-Request-Id`` every fleetsim hop records); traces without ids fall
    back to arrival order and prompt and output lengths (one engine trace only)."""
    if not isinstance(engine_paths, list):
        engine_paths = [engine_paths]
    engine_path = ", ".join(str(p) for p in engine_paths)
    live = [r for r in read_rows(live_path) if measured(r, "ttft_s") is not None]
    engine = [r for p in engine_paths for r in read_rows(p) if measured(r, "ttft_s") is not None]
    by_id = {r["request_id"]: r for r in engine if r.get("request_id")}
    if by_id and any(r.get("request_id") for r in live):
        pairs = [(r, by_id[r["request_id"]]) for r in live if r.get("request_id") in by_id]
        matched_by = "request_id"
    else:
        pairs = _pairs_in_order(live, engine)
        matched_by = "arrival order, prompt and output lengths"
    if not pairs:
        raise FleetsimInputError("--engine", str(engine_path),
                                 f"no request matches the live trace's (by {matched_by}); "
                                 f"pass what fleetsim emulate --record wrote while serving "
                                 f"that traffic")
    diffs = np.array([float(a["ttft_s"]) - float(b["ttft_s"]) for a, b in pairs])
    d = distribution(diffs)
    return {"num_matched": len(pairs), "num_live": len(live),
            "matched_share": len(pairs) / len(live), "matched_by": matched_by,
            **{s: d[s] for s in STATS}}


def _pairs_in_order(live: list[dict[str, Any]], engine: list[dict[str, Any]]
                    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    live = sorted(live, key=lambda r: float(r.get("arrival_s", 0.0)))
    engine = sorted(engine, key=lambda r: float(r.get("arrival_s", 0.0)))
    taken = [False] * len(engine)
    pairs = []
    start = 0
    for row in live:
        key = (row.get("prompt_tokens"), row.get("output_tokens"))
        while start < len(engine) and taken[start]:
            start += 1
        for j in range(start, min(start + MATCH_WINDOW, len(engine))):
            if not taken[j] and (engine[j].get("prompt_tokens"),
                                 engine[j].get("output_tokens")) == key:
                taken[j] = True
                pairs.append((row, engine[j]))
                break
    return pairs


def lag_report(path: str | os.PathLike[str], warn_s: float = DEFAULT_WARN_S) -> dict[str, Any]:
    """How far the process that wrote a live trace fell behind real time while serving
    (its rows' ``lag_s``): {"num_rows", "p50", "p99", "max", "num_over", "warn_s"}, or
    {"num_rows": 0} for a trace that does not record it."""
    lags = [float(r["lag_s"]) for r in read_rows(path)
            if isinstance(r.get("lag_s"), int | float) and not isinstance(r.get("lag_s"), bool)]
    if not lags:
        return {"num_rows": 0}
    v = np.array(lags, dtype=np.float64)
    return {"num_rows": len(lags), "p50": float(np.median(v)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()),
            "num_over": int((v > warn_s).sum()), "warn_s": warn_s}
