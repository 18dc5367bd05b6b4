"""Synthetic workloads: a renewal arrival process plus prompt and output length distributions.

Arrival processes expose the moments of their inter-arrival time (``mean``, ``second_moment``)
for queueing-theory tests. Draws come from the caller's seeded ``numpy.random.Generator`` in a
fixed order (arrivals, then prompt lengths, then output lengths), so one seed gives one workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from fleetsim.workloads.distributions import LengthDistribution, PairedEmpirical
from fleetsim.workloads.workload import Workload


class ArrivalProcess(Protocol):
    """A renewal process: i.i.d. inter-arrival times."""

    @property
    def rate_per_s(self) -> float: ...

    @property
    def mean(self) -> float: ...

    @property
    def second_moment(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]: ...


def _check_rate(rate_per_s: float) -> None:
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Poisson:
    """Poisson arrivals: exponential inter-arrival times (CV 1)."""

    rate_per_s: float
    """Mean arrival rate, requests per second."""

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)

    @property
    def mean(self) -> float:
        return 1.0 / self.rate_per_s

    @property
    def second_moment(self) -> float:
        return 2.0 / self.rate_per_s**2

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """``n`` inter-arrival times in seconds."""
        return rng.exponential(1.0 / self.rate_per_s, size=n)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gamma:
    """Gamma inter-arrival times with a given CV: cv > 1 is burstier than Poisson, < 1 smoother.

    Shape ``k = 1 / cv**2`` and scale ``cv**2 / rate_per_s`` give mean ``1 / rate_per_s``.
    ServeGen (Xiang et al., 2025) fits production API clients with this family.
    """

    rate_per_s: float
    """Mean arrival rate, requests per second."""
    cv: float
    """Coefficient of variation of inter-arrival times (std / mean), > 0."""

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)
        if not (math.isfinite(self.cv) and self.cv > 0):
            raise ValueError(
                f"gamma arrivals need cv > 0 (use arrival = 'constant' for cv 0), got {self.cv}"
            )

    @property
    def mean(self) -> float:
        return 1.0 / self.rate_per_s

    @property
    def second_moment(self) -> float:
        return (1.0 + self.cv**2) / self.rate_per_s**2

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """``n`` inter-arrival times in seconds."""
        shape = 1.0 / self.cv**2
        return rng.gamma(shape, 1.0 / (shape * self.rate_per_s), size=n)


@dataclass(frozen=True, slots=True, kw_only=True)
class Constant:
    """Evenly spaced arrivals, ``1 / rate_per_s`` apart (D/x/1 queues); draws no random numbers."""

    rate_per_s: float
    """Arrival rate, requests per second."""

    def __post_init__(self) -> None:
        _check_rate(self.rate_per_s)

    @property
    def mean(self) -> float:
        return 1.0 / self.rate_per_s

    @property
    def second_moment(self) -> float:
        return 1.0 / self.rate_per_s**2

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        """``n`` inter-arrival times in seconds."""
        return np.full(n, 1.0 / self.rate_per_s)


class AtOnce:
    """Every request at 0 s (``vllm bench serve --request-rate inf``): zero inter-arrival
    times; only with ``num_requests``."""

    rate_per_s = math.inf
    mean = 0.0
    second_moment = 0.0

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.float64]:
        return np.zeros(n)


def arrival_times_s(
    process: ArrivalProcess,
    rng: np.random.Generator,
    *,
    num_requests: int | None = None,
    until_s: float | None = None,
) -> NDArray[np.float64]:
    """Arrival times of a renewal process started by an arrival at 0 s.

    Stops after ``num_requests`` arrivals or before ``until_s`` (exclusive), whichever is first;
    at least one of them must be given.
    """
    if num_requests is None and until_s is None:
        raise ValueError("give num_requests or until_s (or both)")
    if num_requests is not None and num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if num_requests is not None:
        times = np.concatenate(([0.0], np.cumsum(process.sample(rng, num_requests - 1))))
        return times if until_s is None else times[times < until_s]
    assert until_s is not None
    # Draw in chunks of ~1.1x the expected count until the horizon is passed.
    chunk = int(until_s * process.rate_per_s * 1.1) + 16
    parts, last = [np.zeros(1)], 0.0
    while last < until_s:
        part = last + np.cumsum(process.sample(rng, chunk))
        parts.append(part)
        last = float(part[-1])
    times = np.concatenate(parts)
    return times[times < until_s]


def synthesize(
    *,
    arrival: ArrivalProcess,
    prompt_tokens: LengthDistribution | None = None,
    output_tokens: LengthDistribution | None = None,
    lengths: PairedEmpirical | None = None,
    rng: np.random.Generator,
    num_requests: int | None = None,
    until_s: float | None = None,
    name: str = "synthetic",
) -> Workload:
    """A synthetic workload: arrival times, then prompt lengths, then output lengths (or,
    with ``lengths``, (prompt, output) rows drawn together)."""
    times = arrival_times_s(arrival, rng, num_requests=num_requests, until_s=until_s)
    n = len(times)
    if lengths is not None:
        prompts, outputs = lengths.sample(rng, n)
    else:
        assert prompt_tokens is not None and output_tokens is not None
        prompts, outputs = prompt_tokens.sample(rng, n), output_tokens.sample(rng, n)
    return Workload(arrival_s=times, num_prompt_tokens=prompts, num_output_tokens=outputs,
                    name=name)
