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
"""Rows ahead searched for a request's counterpart (sends close together may swap order on
the way to the server)."""


def frontend_overhead(live_path: str | os.PathLike[str],
                      engine_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Live TTFT minus engine TTFT per request: {"num_matched", "mean", "p50", "p90", "p99"}
    (seconds). Rows are matched in arrival order by prompt and output length."""
    live = [r for r in read_rows(live_path) if measured(r, "ttft_s") is not None]
    engine = [r for r in read_rows(engine_path) if measured(r, "ttft_s") is not None]
    live.sort(key=lambda r: float(r.get("arrival_s", 0.0)))
    engine.sort(key=lambda r: float(r.get("arrival_s", 0.0)))
    taken = [False] * len(engine)
    diffs: list[float] = []
    start = 0
    for row in live:
        key = (row.get("prompt_tokens"), row.get("output_tokens"))
        while start < len(engine) and taken[start]:
            start += 1
        for j in range(start, min(start + MATCH_WINDOW, len(engine))):
            if not taken[j] and (engine[j].get("prompt_tokens"),
                                 engine[j].get("output_tokens")) == key:
                taken[j] = True
                diffs.append(float(row["ttft_s"]) - float(engine[j]["ttft_s"]))
                break
    if not diffs:
        raise FleetsimInputError("--engine", str(engine_path),
                                 "no request matches the live trace's (same prompt and output "
                                 "lengths in arrival order); pass what fleetsim emulate "
                                 "--record wrote while serving that traffic")
    d = distribution(np.array(diffs, dtype=np.float64))
    return {"num_matched": len(diffs), **{s: d[s] for s in STATS}}
