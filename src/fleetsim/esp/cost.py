"""What elastic sequence parallelism (ESP, LoongServe) costs, from fleetsim's measured step model.

An *instance* is one tensor-parallel group (LoongServe's artifact: TP 2, so four instances on an
8-GPU node). A prefill batch runs on ``k`` instances as one sequence-parallel group, and a decode
batch keeps its KV spread over several instances. Nothing here is fitted to the paper: every
kernel comes from the instance's own ``StepTimeModel`` (aiconfigurator tables or roofline,
docs/perf_model.md); only the communication is added, from the GPU catalog's NVLink bandwidth.

**Prefill on k instances** (striped ring attention, as LoongServe's kernels). Each instance owns
``l/k`` of every request's tokens, so it runs the linear layers on ``sum(l)/k`` tokens, and its
queries meet every key once: ``l^2 / (2k)`` causal query-key pairs per request. fleetsim's step
model prices a chunk of ``q`` new tokens over ``c`` cached ones as ``q*c + q^2/2`` pairs, so the
instance's share is exactly the chunk ``(l/k, l(k-1)/(2k))``. The ring passes every instance's KV
block to the ``k-1`` others, layer by layer: ``(k-1)/k * sum(l)`` tokens of KV per GPU per layer
over NVLink, overlapped with the attention it feeds (the next block travels while the current
one is computed), so only the excess over the attention time is exposed.

**Decode over instances** (multi-master decoding). The batch's requests are split among ``m``
master instances, each running the linear layers (and the LM head) for its share; every instance
holding KV computes partial attention for the queries whose KV it holds; per layer the masters
send queries out and gather partial outputs back: two small messages, priced at the link's
latency plus bytes over bandwidth.

**Migration** (scale-down between iterations): the KV of ``n`` tokens over one NVLink hop, every
GPU of the instance moving its shard in parallel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf import TableStepModel, build_step_model
from fleetsim.perf.roofline import ALLREDUCE_BW_EFF, ALLREDUCE_LATENCY_S

# NVLink point-to-point: the same achieved fraction and per-message latency fleetsim's roofline
# uses for the TP all-reduce (docs/perf_model.md), not a fit.
LINK_BW_EFF = ALLREDUCE_BW_EFF
LINK_LATENCY_S = ALLREDUCE_LATENCY_S
ACT_BYTES = 2  # fp16 activations

# The artifact's profiling grid for the analytical model (test/longserve/
# 1-benchmark-identical-req.py, ``get_time_with_batch_size_params``): (batch size, input length).
PROFILE_GRID: tuple[tuple[int, int], ...] = (
    (1024, 10), (256, 100), (64, 1000), (16, 10000), (4, 50000), (2, 100000), (1, 200000))


@dataclass(frozen=True, slots=True)
class DecodeShard:
    """What one instance holds of a decode batch: requests with KV on it and their tokens."""

    num_requests: int
    num_kv_tokens: int


class EspCostModel:
    """Seconds of ESP prefill, multi-master decode and KV migration for one model on instances
    of ``tp`` GPUs each."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int,
                 step: TableStepModel | None = None) -> None:
        """``step``: the instance's step model (default: the built-in one for ``model`` on
        ``tp`` ``gpu``s, with the engine's default overheads)."""
        self.model, self.gpu, self.tp = model, gpu, tp
        if step is None:
            step = build_step_model(model, gpu, tp=tp)
        assert isinstance(step, TableStepModel)  # the built-in model: it has breakdown_s
        self.step = step
        # Equal keys, equal costs: what prices a step (the step model's own key) and the
        # ring and the exchange (the model's shape, the GPU's link, the instance's TP).
        self.key: tuple[object, ...] = (model, gpu, tp, step.key)
        self.kv_bytes_per_token_per_gpu = model.kv_bytes_per_token_per_gpu(tp)
        self.link_bw_bytes_per_s = gpu.nvlink_bw_bytes_per_s * LINK_BW_EFF
        self._dec_attn: dict[int, tuple[float, float]] = {}  # batch -> (a, c) of decode attention
        self._linear: dict[int, float] = {}  # tokens -> decode step without attention

    # -- prefill -------------------------------------------------------------------------
    def prefill_s(self, lengths: Sequence[int], k: int) -> float:
        """One prefill iteration of ``lengths`` on ``k`` instances (sequence parallel)."""
        return self.prefill_chunks_s([(n, 0) for n in lengths], k)

    def prefill_chunks_s(self, chunks: Sequence[tuple[int, int]], k: int) -> float:
        """Prefill chunks ``(new tokens q, cached context c)`` on ``k`` instances: each
        instance computes ``q/k`` queries against ``c + q(k-1)/(2k)`` keys on average, so
        its query-key pairs are ``(q/k) c + q^2/(2k)``, its share of the chunk's."""
        if k < 1 or not chunks:
            raise ValueError(f"prefill needs k >= 1 and a request, got k={k}, {len(chunks)}")
        shares = [(-(-q // k), c + q * (k - 1) // (2 * k)) for q, c in chunks]
        compute = self.step.step_time_s(shares, 0, 0)
        if k == 1:
            return compute
        attention = self.step.attention_s(shares, 0, 0)
        return compute + max(0.0, self.ring_s(sum(q for q, _ in chunks), k) - attention)

    def ring_s(self, num_tokens: int, k: int) -> float:
        """The ring's KV exchange of a prefill of ``num_tokens`` on ``k`` instances."""
        layers = self.model.num_layers
        per_layer = self.kv_bytes_per_token_per_gpu / layers * num_tokens * (k - 1) / k
        return layers * ((k - 1) * LINK_LATENCY_S + per_layer / self.link_bw_bytes_per_s)

    # -- decode --------------------------------------------------------------------------
    def decode_s(self, num_requests: int, shards: Sequence[DecodeShard], num_masters: int) -> float:
        """One decode step of ``num_requests`` whose KV lies in ``shards`` (one per instance
        holding any), with the batch split over ``num_masters`` master instances."""
        masters = max(1, min(num_masters, num_requests))
        linear = self._linear_s(math.ceil(num_requests / masters))
        attention = max(self._attention_s(s) for s in shards) if shards else 0.0
        if len(shards) <= 1 and masters == 1:
            return linear + attention
        layers = self.model.num_layers
        message = num_requests * self.model.hidden_size / self.tp * ACT_BYTES
        exchange = layers * 2 * (LINK_LATENCY_S + message / self.link_bw_bytes_per_s)
        return linear + attention + exchange

    def decode_terms_s(self, num_requests: int, k: int, num_masters: int
                       ) -> tuple[float, float, float]:
        """``decode_s`` of ``num_requests`` whose KV is spread evenly over ``k`` instances,
        as ``(base, per total KV token, exchange)``: one step costs
        ``(base + per_kv * kv_tokens) + exchange``."""
        masters = max(1, min(num_masters, num_requests))
        linear = self._linear_s(math.ceil(num_requests / masters))
        a, c = self._attention_terms(num_requests)
        if k <= 1 and masters == 1:
            return linear + a, c, 0.0
        layers = self.model.num_layers
        message = num_requests * self.model.hidden_size / self.tp * ACT_BYTES
        exchange = layers * 2 * (LINK_LATENCY_S + message / self.link_bw_bytes_per_s)
        return linear + a, c / k, exchange

    def _attention_terms(self, n: int) -> tuple[float, float]:
        ac = self._dec_attn.get(n)
        if ac is None:
            a = self.step.breakdown_s((), n, 0)["attention"]
            c = (self.step.breakdown_s((), n, 1_000_000)["attention"] - a) / 1_000_000
            ac = self._dec_attn[n] = (a, c)
        return ac

    def _linear_s(self, num_tokens: int) -> float:
        t = self._linear.get(num_tokens)
        if t is None:
            total = self.step.step_time_s((), num_tokens, 0)
            t = total - self.step.breakdown_s((), num_tokens, 0)["attention"]
            self._linear[num_tokens] = t
        return t

    def _attention_s(self, shard: DecodeShard) -> float:
        n = shard.num_requests
        if n == 0:
            return 0.0
        a, c = self._attention_terms(n)
        return a + c * shard.num_kv_tokens

    # -- migration -----------------------------------------------------------------------
    def migration_s(self, num_tokens: int) -> float:
        """Moving the KV of ``num_tokens`` tokens from one instance to another."""
        if num_tokens <= 0:
            return 0.0
        return LINK_LATENCY_S + (num_tokens * self.kv_bytes_per_token_per_gpu
                                 / self.link_bw_bytes_per_s)


class EspStepModel:
    """The engine's step model (``perf.base.StepTimeModel``) of a member of ``degree`` ESP
    instances (``serving/groups.py``): prefill chunks sequence parallel over the member's
    instances, decodes multi-master with the batch's KV spread evenly over them (the
    member's KV is one pool: where each token lies within it is not tracked).

    A decode-only step is ``(base + per_kv * kv) + exchange`` from ``decode_terms_s``, the
    same floats the engine's fast-forward windows add up."""

    def __init__(self, cost: EspCostModel, degree: int, min_compute_bound_batch: int) -> None:
        if degree < 1:
            raise ValueError(f"degree must be >= 1, got {degree}")
        self.cost, self.degree = cost, degree
        self.min_compute_bound_batch = min_compute_bound_batch
        self.sources = cost.step.sources
        self._terms: dict[int, tuple[float, float, float]] = {}

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        terms = self._terms.get(num_decode)
        if terms is None:
            masters = max(1, min(self.degree, num_decode // self.min_compute_bound_batch))
            terms = self._terms[num_decode] = self.cost.decode_terms_s(
                num_decode, self.degree, masters)
        return terms

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        t = self.cost.prefill_chunks_s(prefill_chunks, self.degree) if prefill_chunks else 0.0
        if num_decode:
            base, per_kv, extra = self.decode_terms_s(num_decode)
            d = base + per_kv * float(decode_kv_tokens)
            if extra:
                d = d + extra
            t = d if not prefill_chunks else t + d
        return t

    def decode_step_times_s(self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
                            ) -> NDArray[np.float64]:
        base, per_kv, extra = self.decode_terms_s(num_decode)
        out: NDArray[np.float64] = (base + per_kv * decode_kv_tokens.astype(np.float64)) + extra
        return out


@dataclass(frozen=True, slots=True)
class AnalyticalModel:
    """LoongServe's scheduler-side predictor: ``T_k = A_k + B_k*sum(l) + C_k*sum(l^2)`` per
    degree of parallelism ``k``, fitted to profiled prefills (the artifact's Figure 14
    model). Here the "profile" is :class:`EspCostModel` itself, on the artifact's grid."""

    coefficients: tuple[tuple[float, float, float], ...]
    """Index ``k - 1`` -> (A_k, B_k, C_k) in seconds, seconds/token, seconds/token^2."""
    mean_rel_error: float
    """Mean |fit - profile| / profile over the profiled points (the artifact asks < 10%)."""

    @property
    def max_k(self) -> int:
        return len(self.coefficients)

    def grows(self, k: int) -> bool:
        """Is ``predict_s(k, ...)`` non-decreasing in both sums (B_k, C_k >= 0)? Then a
        batch predicted too slow stays too slow with longer requests (floats round
        monotonically, so this holds for the computed values too)."""
        if k < 1:
            return False
        _, b, c = self.coefficients[min(k, self.max_k) - 1]
        return b >= 0.0 and c >= 0.0

    def predict_s(self, k: int, sum_tokens: float, sum_sq_tokens: float) -> float:
        if k < 1:
            return math.inf
        a, b, c = self.coefficients[min(k, self.max_k) - 1]
        return a + b * sum_tokens + c * sum_sq_tokens


def fit_analytical(cost: EspCostModel | Callable[[Sequence[int], int], float], max_k: int,
                   max_tokens_per_instance: int) -> AnalyticalModel:
    """Least-squares fit (relative error) of A_k, B_k, C_k to ``cost.prefill_s`` (or a
    ``(lengths, k) -> seconds`` profile) on the artifact's profiling grid, keeping the points
    whose batch fits ``k`` instances."""
    prefill_s = cost.prefill_s if isinstance(cost, EspCostModel) else cost
    coefs: list[tuple[float, float, float]] = []
    errors: list[float] = []
    for k in range(1, max_k + 1):
        rows, times = [], []
        for batch, length in PROFILE_GRID:
            for scale in (0.25, 0.5, 1.0):
                n = max(1, round(batch * scale))
                if n * length > k * max_tokens_per_instance:
                    continue
                rows.append((1.0, n * length, n * length * length))
                times.append(prefill_s([length] * n, k))
        x, t = np.asarray(rows, dtype=np.float64), np.asarray(times, dtype=np.float64)
        sol, *_ = np.linalg.lstsq(x / t[:, None], np.ones_like(t), rcond=None)
        coefs.append((float(sol[0]), float(sol[1]), float(sol[2])))
        errors.extend(np.abs(x @ sol - t) / t)
    return AnalyticalModel(coefficients=tuple(coefs), mean_rel_error=float(np.mean(errors)))
