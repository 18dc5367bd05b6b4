"""ExpertPlex's tile-aware latency model of expert GEMMs and its online SM re-allocation
(ExpertPlex, arXiv:2607.18002: the abstract and a third-party summary of the paper).

An expert GEMM with ``m`` routed tokens runs ``ceil(m / M_t)`` row tiles whatever ``m`` is inside
a tile, so a GPU's expert latency follows its tile count ``x_moe = sum_{e: m_e>0} ceil(m_e/M_t)``
rather than its token count [paper]. We price a tile from fleetsim's measured MoE tables: on
every pool size the table's time for ``j * M_t`` tokens on each local expert (``j`` = 1..8) is
fitted as ``a + b * x`` (fixed launch/weight-read cost ``a``, seconds per tile ``b`` on all SMs).
With ``q`` of the GPU's ``Q`` SMs a phase's tiles take ``b * x * Q / q``.

Routing is expected-value: an expert of a layer receives Poisson(``tokens * top_k / E``) routed
tokens (uniform routing, as the tables assume), so the expected tile count is exact for that
assumption, not a rounding of the mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.compute import ExpertCompute


def expected_tiles_per_expert(mean_tokens: float, tile_m: int) -> float:
    """E[ceil(X / tile_m)] for X ~ Poisson(mean_tokens): sum over j >= 0 of P(X > j*tile_m)."""
    if mean_tokens <= 0:
        return 0.0
    upper = int(mean_tokens + 12 * math.sqrt(mean_tokens) + 12)
    k = np.arange(upper + 1, dtype=np.float64)
    log_pmf = k * math.log(mean_tokens) - mean_tokens - _log_factorials(upper + 1)
    survival = 1.0 - np.cumsum(np.exp(log_pmf))  # P(X > k)
    survival = np.clip(survival, 0.0, 1.0)
    return float(survival[::tile_m].sum())


_LOG_FACTORIALS = np.zeros(0)  # lgamma(k + 1) for k = 0, 1, ...: the longest asked for so far


def _log_factorials(num: int) -> np.ndarray:
    """``[math.lgamma(k + 1.0) for k in range(num)]`` as an array: the same floats, computed
    once per k in a process (a cost model asks for these at every new token count)."""
    global _LOG_FACTORIALS
    have = len(_LOG_FACTORIALS)
    if num > have:
        more = np.array([math.lgamma(v + 1) for v in np.arange(have, num, dtype=np.float64)])
        _LOG_FACTORIALS = np.concatenate([_LOG_FACTORIALS, more])
    return _LOG_FACTORIALS[:num]


def tiles(token_counts: list[int] | np.ndarray, tile_m: int) -> int:
    """x_moe of explicit per-expert token counts (the paper's formula)."""
    if tile_m < 1:
        raise FleetsimInputError("tile_m", tile_m, "must be an integer >= 1")
    return int(sum(-(-int(m) // tile_m) for m in token_counts if m > 0))


def ceil_to(value: float, multiple: int) -> int:
    """ceil_c: the smallest multiple of ``multiple`` (SMs per thread-block cluster) >= value."""
    return int(math.ceil(value / multiple - 1e-9)) * multiple


def reallocate_sms(q: int, x_moe: float, x_ref: float, q_max: int, cluster: int) -> int:
    """The paper's q' = min(Q_max, ceil_c(q * x_moe / x*_moe)): SMs that keep a phase's expert
    latency at the one its reference allocation ``q`` gives at ``x_ref`` tiles (at least one
    cluster)."""
    if x_ref <= 0:
        raise FleetsimInputError("x_ref", x_ref, "must be > 0 tiles")
    return max(cluster, min(q_max, ceil_to(q * x_moe / x_ref, cluster)))


@dataclass(frozen=True, slots=True)
class TileLatency:
    """Expert-GEMM seconds of one GPU as a + b * tiles * Q / q, fitted on the measured table."""

    fixed_s: float
    per_tile_s: float
    num_sms: int
    fit_error: float
    """Largest relative error of the fit over its calibration points."""

    @classmethod
    def fit(cls, compute: ExpertCompute, experts_per_gpu: int, tile_m: int,
            num_sms: int) -> TileLatency:
        js = np.arange(1, 9, dtype=np.float64)
        x = js * experts_per_gpu
        t = np.array([float(compute.gpu_time_s(np.full((1, 1, experts_per_gpu), j * tile_m))
                            .max()) for j in js])
        b, a = np.polyfit(x, t, 1)
        a = max(float(a), 0.0)
        err = float(np.max(np.abs(a + b * x - t) / t))
        return cls(a, float(b), num_sms, err)

    def seconds(self, x_moe: float, sms: int | None = None) -> float:
        """One layer's expert GEMMs of ``x_moe`` tiles on ``sms`` SMs (all when None)."""
        q = self.num_sms if sms is None else sms
        if not 0 < q <= self.num_sms:
            raise FleetsimInputError("sms", q, f"must be in 1..{self.num_sms}")
        if x_moe <= 0:
            return 0.0
        return self.fixed_s + self.per_tile_s * x_moe * self.num_sms / q
