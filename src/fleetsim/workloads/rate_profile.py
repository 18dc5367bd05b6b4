"""Traffic that swings: a time-varying multiplier of a workload's arrival rate.

A profile is piecewise linear through ``(time_s, multiplier)`` points and holds its first and
last values before and after them. It is applied by time-rescaling (Cox and Lewis, "The
Statistical Analysis of Series of Events", 1966; the standard construction of a
non-homogeneous Poisson process): with ``M(T) = integral_0^T m(u) du``, an arrival at ``x`` in
the original time moves to ``T = M^-1(x)``, so arrivals that came at rate ``lambda`` come at
rate ``lambda * m(T)``. The same map serves a renewal process (Poisson, gamma, constant) and a
recorded trace: a trace keeps its own burstiness, order and lengths, and swings with the
profile on top. It draws no random numbers, so a seed still gives one workload.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.workloads.workload import Workload

MAX_POINTS = 100_000
"""More points than any schedule needs (a day at one point a second)."""


@dataclass(frozen=True, slots=True)
class RateProfile:
    """``m(t)``: the arrival rate's multiplier at simulated time ``t`` (seconds)."""

    times_s: tuple[float, ...]
    """Breakpoints, strictly increasing, >= 0."""
    multipliers: tuple[float, ...]
    """m at each breakpoint, >= 0; the last > 0 (else arrivals after it never come)."""

    def __post_init__(self) -> None:
        if not self.times_s or len(self.times_s) != len(self.multipliers):
            raise ValueError("a rate profile needs at least one [time_s, multiplier] point")
        if len(self.times_s) > MAX_POINTS:
            raise ValueError(f"a rate profile takes at most {MAX_POINTS:,} points, got "
                             f"{len(self.times_s):,}")
        for t, m in zip(self.times_s, self.multipliers, strict=True):
            if not (math.isfinite(t) and t >= 0):
                raise ValueError(f"a rate profile's times must be finite seconds >= 0, got {t}")
            if not (math.isfinite(m) and 0 <= m <= 1e6):
                raise ValueError(f"a rate profile's multipliers must be in [0, 1e6], got {m}")
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):
            raise ValueError(f"a rate profile's times must increase strictly, got "
                             f"{list(self.times_s)[:6]}")
        if self.multipliers[-1] <= 0:
            raise ValueError("a rate profile's last multiplier must be > 0 (it holds for the "
                             "rest of the run); end the profile with a positive rate")
        if self.multipliers[0] <= 0 and self.times_s[0] > 0:
            raise ValueError("a rate profile that starts after 0 s holds its first multiplier "
                             "from 0 s on: it must be > 0, or add a point at 0 s")

    @classmethod
    def from_points(cls, points: Sequence[Sequence[float]]) -> RateProfile:
        """From ``[[time_s, multiplier], ...]`` (the config's form)."""
        for p in points:
            if len(p) != 2:
                raise ValueError(f"each rate profile point is [time_s, multiplier], got {list(p)}")
        return cls(times_s=tuple(float(p[0]) for p in points),
                   multipliers=tuple(float(p[1]) for p in points))

    def _arrays(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        t = np.asarray(self.times_s, dtype=np.float64)
        m = np.asarray(self.multipliers, dtype=np.float64)
        # M at each breakpoint: the flat head, then trapezoids.
        cum = np.empty_like(t)
        cum[0] = m[0] * t[0]
        cum[1:] = cum[0] + np.cumsum(np.diff(t) * (m[:-1] + m[1:]) / 2)
        return t, m, cum

    def cumulative(self, at_s: NDArray[np.float64] | float) -> NDArray[np.float64]:
        """``M(T)``: the original-time length of real time [0, T] (how many seconds of the
        unswung process it holds)."""
        t, m, cum = self._arrays()
        x = np.asarray(at_s, dtype=np.float64)
        i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(t) - 1)
        before = x < t[0]
        tau = np.where(before, 0.0, x - t[i])
        slope = np.zeros_like(tau)
        inner = i < len(t) - 1
        j = np.minimum(i + 1, len(t) - 1)
        slope[inner] = ((m[j] - m[i]) / np.where(inner, t[j] - t[i], 1.0))[inner]
        after = cum[i] + m[i] * tau + slope * tau * tau / 2
        return np.where(before, m[0] * x, after)

    def warp(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``M^-1(x)``: the real time of each original time (non-decreasing in, out)."""
        t, m, cum = self._arrays()
        x = np.asarray(x, dtype=np.float64)
        out = np.empty_like(x)
        head = x < cum[0]
        out[head] = x[head] / m[0]  # m[0] > 0 whenever cum[0] > 0
        tail = x >= cum[-1]
        out[tail] = t[-1] + (x[tail] - cum[-1]) / m[-1]
        mid = ~(head | tail)
        if mid.any():
            xm = x[mid]
            i = np.searchsorted(cum, xm, side="right") - 1  # cum[i] <= x < cum[i + 1]
            r0 = m[i]
            slope = (m[i + 1] - m[i]) / (t[i + 1] - t[i])
            d = xm - cum[i]
            # r0*tau + slope*tau^2/2 = d; the form 2d / (r0 + sqrt(...)) is stable for any
            # sign of the slope and for r0 = 0 (the segment has mass, so the root is real).
            root = np.sqrt(np.maximum(r0 * r0 + 2 * slope * d, 0.0))
            denom = r0 + root
            tau = np.where(denom > 0, 2 * d / np.where(denom > 0, denom, 1.0), 0.0)
            out[mid] = np.minimum(t[i] + tau, t[i + 1])
        return out


def swing(workload: Workload, profile: RateProfile | None) -> Workload:
    """``workload`` with its arrival rate multiplied by ``profile`` over time."""
    if profile is None or len(workload) == 0:
        return workload
    arrival_s = profile.warp(workload.arrival_s)
    return dataclasses.replace(workload, arrival_s=np.maximum.accumulate(arrival_s))
