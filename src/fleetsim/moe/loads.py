"""Synthetic per-microbatch expert loads: (num_microbatches, num_layers, num_experts) routed
tokens (token-expert pairs) per logical expert.

Each microbatch routes ``num_tokens * top_k`` pairs drawn multinomially from a per-layer
expert popularity. The scenarios differ in how popularity evolves:

- ``zipf``: stationary Zipf popularity (a fixed random expert order per layer).
- ``drift``: Zipf popularity whose log-weights take a Gaussian random walk per microbatch.
- ``rl``: RL rollout micro-batches: a Zipf base plus a few very hot experts that jump to new
  experts every microbatch (prompts from different tasks, shuffled): the worst case for any
  planner that plans from history.
- ``rl_switch``: the same hot experts, but they jump only every 20 microbatches (popularity
  that holds for a phase, then switches), so history is right except on switch steps.
- ``decode``: stationary Zipf with few tokens per microbatch (decode steps), so sampling
  noise dominates.
- ``ou``: log-normal popularity whose log-weights follow a stationary AR(1) (a sampled
  Ornstein-Uhlenbeck process): every microbatch has the same skew, whatever the run length.
  Its dispersion ``log_sd`` comes from a measured max/mean GPU load (``moe/load_presets.py``).

``zipf``, ``drift``, ``rl``, ``rl_switch`` and ``decode`` have no measured source for their skew
(``zipf_alpha`` 0.6, the walk's step, the hot experts' boost): stress cases. ``drift`` has no
mean reversion, so its skew grows with the run length.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError

SCENARIOS = ("zipf", "drift", "rl", "rl_switch", "decode", "ou")

# Microbatches between hot-set switches in ``rl_switch``.
RL_SWITCH_EVERY = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """Shape and skew of a synthetic load trace."""

    num_microbatches: int = 32
    """Microbatches to generate."""
    num_layers: int = 4
    """MoE layers per microbatch."""
    num_experts: int = 256
    """Logical experts per layer."""
    num_tokens: int = 4096
    """Tokens per microbatch (over all GPUs)."""
    top_k: int = 8
    """Experts each token is routed to."""
    zipf_alpha: float = 0.6
    """Popularity of the expert of rank r is proportional to r ** -zipf_alpha."""
    log_sd: float = 0.0
    """``ou``: stationary standard deviation of an expert's log-popularity (0 = uniform); set
    it from a measured max/mean with ``load_presets.calibrate_log_sd``."""
    autocorr: float = 0.9
    """``ou``: correlation of an expert's log-popularity between consecutive microbatches
    (AR(1) coefficient). Not measured in any source we found; it matters only to planners that
    plan from history (EPLB), since the others see each microbatch's exact load."""

    def __post_init__(self) -> None:
        for name in ("num_microbatches", "num_layers", "num_experts", "num_tokens", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise FleetsimInputError(name, value, "must be a positive integer")
        if self.top_k > self.num_experts:
            raise FleetsimInputError(
                "top_k", self.top_k, f"must be <= num_experts={self.num_experts}"
            )
        if not (self.zipf_alpha >= 0 and np.isfinite(self.zipf_alpha)):
            raise FleetsimInputError("zipf_alpha", self.zipf_alpha, "must be a finite number >= 0")
        if not (self.log_sd >= 0 and np.isfinite(self.log_sd)):
            raise FleetsimInputError("log_sd", self.log_sd, "must be a finite number >= 0")
        if not 0 <= self.autocorr < 1:
            raise FleetsimInputError(
                "autocorr", self.autocorr, "must be in [0, 1) (1 would never revert to the mean)"
            )


def _zipf_logits(spec: LoadSpec, rng: np.random.Generator) -> NDArray[np.float64]:
    ranks = np.arange(1, spec.num_experts + 1, dtype=np.float64)
    base = -spec.zipf_alpha * np.log(ranks)
    return np.stack([rng.permutation(base) for _ in range(spec.num_layers)])


def _cap_at(p: NDArray[np.float64], cap: float) -> NDArray[np.float64]:
    """Clip probabilities at ``cap`` and give the excess to the others in proportion."""
    for _ in range(p.shape[-1]):
        over = p > cap
        if not over.any():
            break
        excess = np.where(over, p - cap, 0.0).sum(-1, keepdims=True)
        under = np.where(over, 0.0, p)
        p = np.where(
            over, cap, p + excess * under / np.maximum(under.sum(-1, keepdims=True), 1e-300)
        )
    return p


def popularity(logits: NDArray[np.float64], top_k: int) -> NDArray[np.float64]:
    """Softmax of ``logits`` over experts, capped at 1 / top_k: a token picks ``top_k``
    distinct experts, so no expert can receive more than that share of the pairs."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return _cap_at(p / p.sum(-1, keepdims=True), 1.0 / top_k)


def sample_loads(
    p: NDArray[np.float64], num_tokens: int, top_k: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """Multinomial counts of ``num_tokens * top_k`` routed tokens for popularity ``p``."""
    return rng.multinomial(num_tokens * top_k, p).astype(np.float64)


def zipf_logits(spec: LoadSpec, rng: np.random.Generator) -> NDArray[np.float64]:
    """Stationary Zipf popularity."""
    logits = _zipf_logits(spec, rng)
    return np.broadcast_to(logits, (spec.num_microbatches, *logits.shape))


def drift_logits(
    spec: LoadSpec, rng: np.random.Generator, step_sigma: float = 0.15
) -> NDArray[np.float64]:
    """Zipf popularity whose log-weights random-walk by ``step_sigma`` per microbatch."""
    steps = rng.normal(
        0.0, step_sigma, size=(spec.num_microbatches, spec.num_layers, spec.num_experts)
    )
    steps[0] = 0.0
    return _zipf_logits(spec, rng)[None] + np.cumsum(steps, axis=0)


def rl_logits(
    spec: LoadSpec,
    rng: np.random.Generator,
    num_hot: int = 4,
    hot_boost: float = 2.0,
    shift_every: int = 1,
) -> NDArray[np.float64]:
    """Zipf base plus ``num_hot`` experts per layer whose log-weight is raised by ``hot_boost``;
    the hot set is redrawn every ``shift_every`` microbatches (RL rollouts mix tasks)."""
    if shift_every < 1:
        raise FleetsimInputError("shift_every", shift_every, "must be >= 1")
    base = _zipf_logits(spec, rng)
    logits = np.broadcast_to(base, (spec.num_microbatches, *base.shape)).copy()
    hot = None
    for t in range(spec.num_microbatches):
        if t % shift_every == 0:
            hot = np.argsort(rng.random((spec.num_layers, spec.num_experts)), axis=1)[:, :num_hot]
        assert hot is not None  # drawn at t = 0
        np.put_along_axis(logits[t], hot, np.take_along_axis(base, hot, 1) + hot_boost, axis=1)
    return logits


def rl_switch_logits(spec: LoadSpec, rng: np.random.Generator) -> NDArray[np.float64]:
    """``rl`` with the hot set held for ``RL_SWITCH_EVERY`` microbatches at a time."""
    return rl_logits(spec, rng, shift_every=RL_SWITCH_EVERY)


def ou_logits(spec: LoadSpec, rng: np.random.Generator) -> NDArray[np.float64]:
    """Log-popularity as a stationary Gaussian AR(1) per (layer, expert):
    ``x[t] = autocorr * x[t-1] + sqrt(1 - autocorr**2) * log_sd * eps[t]``, with ``x[0]`` drawn
    from the stationary law N(0, log_sd**2). Every microbatch's marginal is that same law, so the
    skew does not grow with the run length (``drift``'s random walk has variance t * step**2)."""
    shape = (spec.num_microbatches, spec.num_layers, spec.num_experts)
    eps = rng.standard_normal(shape)
    x = np.empty(shape)
    x[0] = spec.log_sd * eps[0]
    innovation_sd = spec.log_sd * np.sqrt(1.0 - spec.autocorr**2)
    for t in range(1, spec.num_microbatches):
        x[t] = spec.autocorr * x[t - 1] + innovation_sd * eps[t]
    return x


# scenario -> logits generator; ``decode`` is stationary Zipf meant for few tokens per step.
LOGITS_BY_SCENARIO = {
    "zipf": zipf_logits,
    "drift": drift_logits,
    "rl": rl_logits,
    "rl_switch": rl_switch_logits,
    "decode": zipf_logits,
    "ou": ou_logits,
}


def make_popularity(scenario: str, spec: LoadSpec, rng: np.random.Generator) -> NDArray[np.float64]:
    """(num_microbatches, num_layers, num_experts) routing probabilities of a scenario."""
    generate = LOGITS_BY_SCENARIO.get(scenario)
    if generate is None:
        raise FleetsimInputError("scenario", scenario, f"use one of {', '.join(SCENARIOS)}")
    return popularity(generate(spec, rng), spec.top_k)


def make_loads(scenario: str, spec: LoadSpec, seed: int) -> NDArray[np.float64]:
    """(num_microbatches, num_layers, num_experts) routed tokens of a named scenario
    (``zipf``, ``drift``, ``rl``, ``rl_switch``, ``decode``, ``ou``), reproducible from
    ``seed``."""
    rng = np.random.default_rng(seed)
    p = make_popularity(scenario, spec, rng)
    return sample_loads(p, spec.num_tokens, spec.top_k, rng)
