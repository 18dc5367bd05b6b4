"""Is a run overloaded? The offered load against the service's capacity, from the waiting
queue's trend over the arrivals' span.

An overloaded queue (arrival rate ``lam`` above the completion rate ``mu``) is unstable: its
waiting count grows at ``lam - mu`` requests/s for as long as arrivals last, whatever the span
(M/M/1 or any G/G/1 with rho > 1). A stable one fluctuates around a constant. So the check
fits the waiting count's least-squares slope over the arrivals' span and calls the run
overloaded when (a) the mean waiting count rose from each quarter of the span to the next,
(b) the last quarter holds at least ``MIN_WAITING`` waiting requests, and (c) the slope is at
least ``MIN_EXCESS_SHARE`` of the offered rate (offered load >= about 1.05 x capacity). It
needs no drain after the last arrival, so it holds for long spans (where a backlog of a
minute is a small share of the hour) and for runs cut by ``until_s`` (which never drain).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

MIN_WAITING = 2.0
"""Requests waiting, on average over the last quarter of the span, below which a rising queue
is noise (the old rule's floor, kept)."""
MIN_EXCESS_SHARE = 0.05
"""Queue growth (requests/s) over the offered rate at and above which the run is overloaded:
5% of arrivals left waiting. On ``examples/sweep.toml``'s points and cut runs, healthy ones
measured 0.000 to 0.014 (an H100 at 4x, bursty but stable) and overloaded ones 0.18 (an A100
at 2x: SLO 3.2%, TTFT p99 86 s) and above."""


def overload_check(summary: dict[str, Any], arrival_s: NDArray[np.float64]) -> dict[str, Any]:
    """The overload verdict of a summarised run (``summary`` as ``metrics.summarize`` makes
    it, with its ``timeline``; ``arrival_s`` the workload's sorted arrival times in s).

    Only the first ``summary["num_requests"]`` arrivals count: a run cut by ``until_s``
    offered those over their own span, not the whole workload's. Returns ``queue_grew``,
    ``offered_requests_per_s`` (arrivals over their span), ``offered_over_capacity`` (offered
    over the completion rate over the makespan, which an overloaded run drains at; ``None``
    without finishes), ``queue_growth_per_s`` (the waiting count's slope over the span) and,
    when overloaded, ``warning``."""
    n = int(summary["num_requests"])
    arrived = np.asarray(arrival_s[:n], dtype=float) if n else np.zeros(0)
    span = float(arrived[-1] - arrived[0]) if len(arrived) else 0.0
    offered = n / span if span > 0 else None
    makespan, finished = summary["makespan_s"], summary["num_finished"]
    ratio = offered / (finished / makespan) if offered and makespan > 0 and finished else None
    slope, grew = _queue_trend(summary.get("timeline") or {}, float(arrived[0]) if n else 0.0,
                               span)
    overloaded = (grew and slope is not None and offered is not None
                  and slope >= MIN_EXCESS_SHARE * offered)
    out: dict[str, Any] = {"queue_grew": overloaded, "offered_over_capacity": ratio,
                           "offered_requests_per_s": offered, "queue_growth_per_s": slope}
    if overloaded:
        # Over a cut run the makespan ratio undercounts; lam / (lam - slope) is the same
        # estimate from the queue, so report the larger.
        assert offered is not None and slope is not None
        est = max(ratio or 0.0, offered / max(offered - slope, 1e-12))
        out["warning"] = (f"queue grew for the whole run: offered load is about {est:.1f} x "
                          f"capacity; lower the rate (workload.rate_scale) or add replicas")
    return out


def _queue_trend(timeline: dict[str, Any], first_s: float,
                 span: float) -> tuple[float | None, bool]:
    """(slope of the waiting count over the span in requests/s, whether its quarter means
    rose quarter after quarter with the last at least MIN_WAITING)."""
    waiting = timeline.get("mean_waiting") or []
    if span <= 0 or len(waiting) < 8:
        return None, False
    starts = np.asarray(timeline["bin_start_s"], dtype=float) - first_s
    w = np.asarray(waiting, dtype=float)
    inside = starts < span
    if inside.sum() < 4:
        return None, False
    t, w = starts[inside], np.nan_to_num(w[inside])
    slope = float(np.polyfit(t, w, 1)[0]) if np.ptp(t) > 0 else None
    means = [float(x.mean()) for x in np.array_split(w, 4)]
    grew = all(b > a for a, b in zip(means, means[1:], strict=False)) and means[-1] >= MIN_WAITING
    return slope, grew
