"""Personal-agent traffic: reactive requests (user-triggered, Poisson) and proactive flows
(background agents that issue their next request as soon as the last one finishes).

Lengths are (prompt, output) pairs drawn jointly from the Azure LLM inference trace 2023,
conversation service (the embedded 15-minute slice; Patel et al., Splitwise, ISCA 2024),
prompts capped at ``max_prompt_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetsim.workloads import load_trace

LENGTH_TRACE = "embedded:azure_conv_2023"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentTraffic:
    reactive_per_min: float
    """Mean rate of user-triggered (reactive) requests, per minute (Poisson)."""
    num_proactive_flows: int
    """Background flows, each with one request outstanding at a time."""
    duration_s: float
    """Reactive requests arrive and proactive requests are issued within [0, duration_s)."""
    max_prompt_tokens: int = 2048
    seed: int = 0
    reactive_times_s: tuple[float, ...] = ()
    """Scripted reactive arrivals (seconds), used instead of the Poisson process if given."""
    reactive_lengths: tuple[int, int] | None = None
    """Scripted (prompt, output) of every reactive request instead of the trace's."""
    proactive_lengths: tuple[int, int] | None = None
    """Scripted (prompt, output) of every proactive request instead of the trace's."""

    def __post_init__(self) -> None:
        if self.reactive_per_min < 0:
            raise ValueError(f"reactive_per_min must be >= 0, got {self.reactive_per_min}")
        if self.num_proactive_flows < 0:
            raise ValueError(f"num_proactive_flows must be >= 0, got {self.num_proactive_flows}")
        if not self.duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {self.duration_s}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if any(not 0 <= t < self.duration_s for t in self.reactive_times_s):
            raise ValueError(f"reactive_times_s must lie in [0, duration_s), got "
                             f"{self.reactive_times_s}")
        for name in ("reactive_lengths", "proactive_lengths"):
            pair = getattr(self, name)
            if pair is not None and (len(pair) != 2 or min(pair) < 1):
                raise ValueError(f"{name} must be (prompt, output) >= 1, got {pair}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentTrafficConfig:
    """``[agent_traffic]`` of a run config: Agent.xpu's personal-agent traffic (arXiv:2506.24045)
    in place of ``workload``, served until its last request ends. Reactive requests get
    priority 0 and proactive ones 1 (``policy.ordering = "priority"``, ``agent_xpu``)."""

    reactive_per_min: float = 2.0
    """Mean rate of user-triggered (reactive) requests, per minute (Poisson)."""
    num_proactive_flows: int = 4
    """Background flows, each issuing its next request the moment its last one finishes."""
    duration_s: float = 600.0
    """Reactive requests arrive and proactive requests are issued within [0, duration_s)."""
    max_prompt_tokens: int = 2048
    """Prompts drawn from the Azure 2023 conversation trace are capped at this length."""

    def __post_init__(self) -> None:
        checks = (("reactive_per_min", self.reactive_per_min >= 0, "must be >= 0"),
                  ("num_proactive_flows", self.num_proactive_flows >= 0, "must be >= 0"),
                  ("duration_s", self.duration_s > 0, "must be > 0 seconds"),
                  ("max_prompt_tokens", self.max_prompt_tokens >= 1, "must be >= 1"))
        for name, ok, fix in checks:
            if not ok:
                raise ValueError(f"agent_traffic.{name} {fix}, got {getattr(self, name)!r}")

    def traffic(self, seed: int) -> AgentTraffic:
        """The traffic this section describes, drawn from the run's ``seed``."""
        return AgentTraffic(reactive_per_min=self.reactive_per_min,
                            num_proactive_flows=self.num_proactive_flows,
                            duration_s=self.duration_s,
                            max_prompt_tokens=self.max_prompt_tokens, seed=seed)


class LengthSampler:
    """Draws (prompt, output) pairs from the trace with its own generator, or hands out the
    scripted pair."""

    def __init__(self, rng: np.random.Generator, max_prompt_tokens: int,
                 fixed: tuple[int, int] | None = None) -> None:
        self._fixed = fixed
        self._rng = rng
        if fixed is None:
            trace = load_trace(LENGTH_TRACE)
            self._prompts = np.minimum(trace.num_prompt_tokens, max_prompt_tokens)
            self._outputs = trace.num_output_tokens

    def draw(self) -> tuple[int, int]:
        if self._fixed is not None:
            return self._fixed
        i = int(self._rng.integers(len(self._prompts)))
        return int(self._prompts[i]), int(self._outputs[i])


def reactive_arrivals(traffic: AgentTraffic, rng: np.random.Generator) -> list[float]:
    """Poisson arrival times within the duration (or the scripted ones)."""
    if traffic.reactive_times_s:
        return sorted(traffic.reactive_times_s)
    if traffic.reactive_per_min == 0:
        return []
    mean_gap_s = 60.0 / traffic.reactive_per_min
    times: list[float] = []
    t = 0.0
    while True:
        t += float(rng.exponential(mean_gap_s))
        if t >= traffic.duration_s:
            return times
        times.append(t)


def streams(seed: int) -> tuple[np.random.Generator, np.random.Generator, np.random.Generator]:
    """Independent generators for reactive arrivals, reactive lengths, proactive lengths."""
    a, b, c = np.random.SeedSequence(seed).spawn(3)
    return np.random.default_rng(a), np.random.default_rng(b), np.random.default_rng(c)
