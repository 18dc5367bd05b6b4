"""SLO arithmetic shared by run summaries, the expert-pool model and the reproductions: which
requests met their latency targets (``slo_met``, ``attainment``) and where a curve swept over
arrival rates crosses a target (``crossing_rate``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

Target = float | NDArray[np.float64]
"""One target for every request, or one per request (seconds)."""


def slo_met(ttft_s: ArrayLike, tpot_s: ArrayLike, ttft_slo_s: Target, tpot_slo_s: Target
            ) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Per request: whether its TTFT and whether its TPOT met the target. A NaN TPOT (a
    one-token output has no inter-token time) meets it. The targets may be one number or one
    per request (e.g. a TTFT target scaled to each prompt)."""
    ttft = np.asarray(ttft_s, dtype=np.float64)
    tpot = np.asarray(tpot_s, dtype=np.float64)
    met_ttft = ttft <= np.asarray(ttft_slo_s, dtype=np.float64)
    met_tpot = np.isnan(tpot) | (tpot <= np.asarray(tpot_slo_s, dtype=np.float64))
    return met_ttft, met_tpot


def attainment(ttft_s: ArrayLike, tpot_s: ArrayLike, ttft_slo_s: Target, tpot_slo_s: Target,
               *, num_requests: int | None = None) -> float:
    """Share of requests that met both targets (``slo_met``). ``num_requests``: the
    denominator when it is not the requests given, e.g. every arrival where the unfinished
    have no latencies and count as misses."""
    met_ttft, met_tpot = slo_met(ttft_s, tpot_s, ttft_slo_s, tpot_slo_s)
    n = met_ttft.size if num_requests is None else num_requests
    return int((met_ttft & met_tpot).sum()) / max(n, 1)


def crossing_rate(rates: Sequence[float], values: Sequence[float | None], limit: float, *,
                  rising: bool = True) -> float | None:
    """Where a metric swept over ``rates`` (ascending) first leaves ``limit``: the highest
    rate it stays within, linear between the last rate within and the first beyond (the
    artifacts' ``find_intersection_point`` of FastServe, ``get_intersection_point`` of
    LoongServe).

    ``rising``: the metric grows with load (a latency: beyond is ``value > limit``); else it
    falls (an attainment: beyond is ``value < limit``). Returns ``rates[-1]`` when it never
    leaves (a lower bound: ``frame.is_bound`` tells), None when even the first rate is beyond.
    A None value (a run that did not finish) ends the curve at the rate before it. ``values``
    may stop short of ``rates`` once the metric has left (a sweep that skips higher rates)."""
    prev: tuple[float, float] | None = None
    for rate, value in zip(rates, values, strict=False):
        if value is None or (value > limit if rising else value < limit):
            if prev is None:
                return None
            if value is None:
                return prev[0]
            r0, v0 = prev
            gap, span = (limit - v0, value - v0) if rising else (v0 - limit, v0 - value)
            return r0 + (rate - r0) * gap / span
        prev = (rate, value)
    return rates[-1]
