"""``fleetsim compare LIVE.jsonl SIM_DIR``: live latency percentiles against the simulator's.

LIVE.jsonl is a trace written by ``fleetsim gateway --record``, ``fleetsim emulate --record``
or ``fleetsim load --out`` (its ``ttft_s``, ``tpot_s``, ``e2e_s`` of successful rows); SIM_DIR
is the results folder of ``fleetsim run`` on the same traffic (its ``requests.csv``).
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
from fleetsim.live.trace import LATENCIES, read_latencies
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
