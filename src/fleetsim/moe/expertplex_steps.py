"""ExpertPlex's cost model and the step models that run its three systems on the engine
(``moe/expertplex.py`` says what they model): plain typed classes, compiled with the engine by
``make native`` (no one subclasses them), as ``batch_steps.py`` is for the planners. The engine
calls them at every step and window, most of an ExpertPlex run's cost when interpreted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.moe.compute import EpHardware, MoeLayerSpec, default_compute
from fleetsim.moe.step_model import ExpertParallelConfig, all_to_all_s
from fleetsim.moe.tile_model import TileLatency, expected_tiles_per_expert, reallocate_sms
from fleetsim.perf import build_step_model
from fleetsim.perf.step_model import OpCurve

H200_SMS = 132
"""SMs of an H100/H200 SXM (NVIDIA H100 datasheet; H200 is the same GH100 die)."""
APK_DECODE_SLOWDOWN = 1.08
APK_PREFILL_SLOWDOWN = 1.12
"""ExpertPlex's measured cost of its persistent kernels vs exclusive runs [paper, arXiv
2607.18002, via a third-party summary]."""

SCALAR_WINDOW_STEPS = 8
"""Decode windows of at most this many steps are priced step by step (``dense_decode_s``;
speed only: the same floats either way)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SmPolicy:
    """ExpertPlex's decode SM share: q' = min(Q_max, ceil_c(q_ref * x / x_ref))."""

    q_ref: int
    x_ref: float
    q_max: int
    cluster: int
    adaptive: bool = True
    """False: decode keeps its reference share q_ref whatever batch it runs (the SM
    re-allocation removed: the reproduction's ablation ``expertplex-static-sm``)."""


@dataclass
class CostModel:
    """Per-step seconds of every group kind for one model on one GPU type."""

    model: ModelSpec
    gpu: GPUSpec
    tile_m: int
    num_sms: int = H200_SMS
    nvlink_domain: int = 8
    """GPUs that reach each other over NVLink (HGX H200: 8); the rest over the network."""
    _tiles: dict[int, TileLatency] = field(default_factory=dict)
    _tiles_memo: dict[tuple[float, int], float] = field(default_factory=dict)
    _parts_memo: dict[tuple[float, int], tuple[float, float]] = field(default_factory=dict)
    _a2a_memo: dict[tuple[float, int, int], float] = field(default_factory=dict)
    _eps: dict[int, ExpertParallelConfig] = field(default_factory=dict)  # span -> EP group

    def __post_init__(self) -> None:
        self.spec = MoeLayerSpec.from_model(self.model)
        self.hw = EpHardware.from_gpu(self.gpu)
        self.dense = build_step_model(self.model, self.gpu, 1)
        # (the curve, not its lookup function: ``at`` is a direct call compiled)
        self._moe: OpCurve = self.dense.op_time_curve("moe")
        self.layers = self.spec.num_moe_layers

    def tile_latency(self, pool: int) -> TileLatency:
        if pool not in self._tiles:
            compute = default_compute(self.spec, self.hw, pool, 4096 * self.spec.top_k)
            self._tiles[pool] = TileLatency.fit(compute, self.spec.num_experts // pool,
                                                self.tile_m, self.num_sms)
        return self._tiles[pool]

    def tiles_per_gpu(self, tokens: float, pool: int) -> float:
        """Expected x_moe of one pool GPU for one layer of ``tokens`` tokens."""
        key = (tokens, pool)
        x = self._tiles_memo.get(key)
        if x is None:
            mean = tokens * self.spec.top_k / self.spec.num_experts
            x = self.spec.num_experts / pool * expected_tiles_per_expert(mean, self.tile_m)
            self._tiles_memo[key] = x
        return x

    def weight_read_s(self, tokens: float, pool: int) -> float:
        """One pool GPU's HBM time to read the weights of its experts that get a token, for
        one layer: a grouped GEMM reads each active expert once, whatever its tokens
        (``RooflineExpertCompute``). Routing is Poisson per expert (as the tile count's
        expectation): an expert is active with probability 1 - exp(-mean routed tokens)."""
        mean = tokens * self.spec.top_k / self.spec.num_experts
        active = self.spec.num_experts / pool * -math.expm1(-mean)
        return active * self.spec.expert_bytes / self.hw.hbm_bytes_per_s

    def expert_s(self, tokens: float, pool: int, sms: int | None = None) -> float:
        """One layer's expert GEMMs on one pool GPU with ``sms`` of its SMs (all when None)."""
        fixed, work = self.expert_parts(tokens, pool)
        if work <= 0:
            return 0.0
        return fixed + work / (self.num_sms if sms is None else sms)

    def expert_parts(self, tokens: float, pool: int) -> tuple[float, float]:
        """One layer's expert GEMMs of ``tokens`` tokens on a pool of ``pool`` GPUs as (fixed
        seconds, SM-seconds): on q SMs they take ``fixed + work / q``. The work is the larger
        of the tiles' compute (the paper's x_moe model, its slope fitted on the measured
        table, ``TileLatency``) and the weight reads of the GPU's active experts
        (``weight_read_s``: what a decode-sized batch on many experts per GPU pays, and what
        one shared copy of the experts saves); both scale with the SMs given (a share of
        the SMs draws that share of the bandwidth: our assumption). The fixed part is the
        grouped GEMM's launch (``EpHardware.kernel_overhead_s``)."""
        key = (tokens, pool)
        parts = self._parts_memo.get(key)
        if parts is None:
            x = self.tiles_per_gpu(tokens, pool)
            if x <= 0:
                parts = (0.0, 0.0)
            else:
                lat = self.tile_latency(pool)
                busy = max(lat.per_tile_s * x, self.weight_read_s(tokens, pool))
                parts = (self.hw.kernel_overhead_s, busy * self.num_sms)
            self._parts_memo[key] = parts
        return parts

    def a2a_s(self, tokens: float, pool: int, span: int) -> float:
        """Dispatch + combine of one layer: ``span`` GPUs take part (attention and pool)."""
        key = (tokens, pool, span)
        t = self._a2a_memo.get(key)
        if t is None:
            t = self._a2a_memo[key] = self._a2a(tokens, pool, span)
        return t

    def _a2a(self, tokens: float, pool: int, span: int) -> float:
        ep = self._eps.get(span)
        if ep is None:
            node = min(span, self.nvlink_domain)
            ep = self._eps[span] = ExpertParallelConfig(
                num_gpus=-(-span // node) * node, gpus_per_node=node, balancer="none")
        span = ep.num_gpus
        per_gpu = np.full(span, tokens * self.spec.top_k / pool)
        dispatch, combine = all_to_all_s(per_gpu, ep, self.spec, self.hw)
        return float(dispatch + combine)

    def dense_s(self, chunks: Sequence[int], decode: int, kv: int, gpus: int) -> float:
        """The slowest of ``gpus`` data-parallel attention GPUs (prompts dealt round-robin,
        decodes split evenly), the MoE term of the one-GPU tables removed."""
        worst = 0.0
        # Without prompts the first GPU holds the most decodes: it is the slowest.
        for g in range(gpus if chunks else min(gpus, 1)):
            mine = [(n, 0) for n in chunks[g::gpus]]
            n_dec = decode // gpus + (1 if g < decode % gpus else 0)
            if not mine and not n_dec:
                continue
            kv_g = kv * n_dec // max(decode, 1)
            tokens = sum(n for n, _ in mine) + n_dec
            t = self.dense.step_time_s(mine, n_dec, kv_g) - self._moe.at(tokens)
            worst = max(worst, t)
        return worst

    def dense_decode_s(self, decode: int, kv_tokens: np.ndarray, gpus: int) -> np.ndarray:
        """``dense_s((), decode, kv, gpus)`` for each ``kv`` in the array, vectorized: the
        same float operations (the first GPU holds the most decodes; the table model's
        vectorized decode equals its scalar one), so windows equal step by step. A short
        window's steps are priced one by one: the same floats, without numpy's fixed cost per
        call (about ten array operations), which most windows here are too short to repay."""
        if not decode:
            return np.zeros(len(kv_tokens))
        if len(kv_tokens) <= SCALAR_WINDOW_STEPS:
            return np.array([self.dense_s((), decode, int(kv), gpus) for kv in kv_tokens])
        n0 = decode // gpus + (1 if decode % gpus else 0)
        kv_g = np.asarray(kv_tokens, dtype=np.int64) * n0 // decode
        t = self.dense.decode_step_times_s(n0, kv_g) - self._moe.at(n0)
        return np.maximum(t, 0.0)

    def plex_decode_s(self, decode: int, kv: int, gpus: int, pool: int, span: int,
                      sms: int) -> tuple[float, float]:
        """(step s, expert s) of ExpertPlex's decode group given ``sms`` pool SMs."""
        expert = self.layers * self.expert_s(decode, pool, sms) * APK_DECODE_SLOWDOWN
        total = self.dense_s((), decode, kv, gpus) + self.layers * self.a2a_s(
            decode, pool, span) + expert
        return total, expert

    def plex_prefill_s(self, chunks: Sequence[int], gpus: int, pool: int, span: int,
                       sms: float) -> float:
        """ExpertPlex's prefill step; ``sms`` its mean SM share of the pool over the step."""
        tokens = sum(chunks)
        fixed, work = self.expert_parts(tokens, pool)
        expert = (fixed + work / sms) * APK_PREFILL_SLOWDOWN if work > 0 else 0.0
        return self.dense_s(chunks, 0, 0, gpus) + self.layers * (
            self.a2a_s(tokens, pool, span) + expert)

    def decode_sms(self, policy: SmPolicy, decode: int, pool: int) -> int:
        if not policy.adaptive:
            return policy.q_ref
        return reallocate_sms(policy.q_ref, self.tiles_per_gpu(decode, pool), policy.x_ref,
                              policy.q_max, policy.cluster)



class InstanceSteps:
    """A colocated or P/D instance of ``gpus`` GPUs (attention data-parallel, its own EP shard
    of the experts) as a ``StepTimeModel``."""

    # Short decode windows may be priced one ``step_time_s`` at a time (``serving/window.py``):
    # pricing has no side effect (the memos only cache) and ``decode_step_times_s`` makes the
    # same float operations as ``step_time_s`` step for step (``dense_decode_s``).
    scalar_windows = True

    def __init__(self, cost: CostModel, gpus: int) -> None:
        self.cost = cost
        self.gpus = gpus
        # tokens -> the step's MoE seconds, ``layers x (all-to-alls + expert GEMMs)``, kept
        # by the one int they depend on here (the cost model's memos are keyed by tuples
        # with a float: hashed at every step).
        self._moe_by_tokens: dict[int, float] = {}

    def _moe_s(self, tokens: int) -> float:
        moe = self._moe_by_tokens.get(tokens)
        if moe is None:
            cost, gpus = self.cost, self.gpus
            moe = cost.layers * (cost.a2a_s(tokens, gpus, gpus) + cost.expert_s(tokens, gpus))
            self._moe_by_tokens[tokens] = moe
        return moe

    def step_time_s(self, chunks: Sequence[tuple[int, int]], num_decode: int,
                    kv_tokens: int) -> float:
        """One step of an instance (both phases) or of a PD instance (one of them): its
        attention GPUs' dense part and its MoE part."""
        lens = [n for n, _ in chunks]
        tokens = num_decode
        for n in lens:
            tokens += n
        return (self.cost.dense_s(lens, num_decode, kv_tokens, self.gpus)
                + self._moe_s(tokens))

    def decode_step_times_s(self, num_decode: int, kv_tokens: np.ndarray) -> np.ndarray:
        return (self.cost.dense_decode_s(num_decode, kv_tokens, self.gpus)
                + self._moe_s(num_decode))


class InstanceSplit:
    """The same instance as a step on its own expert shard's SMs (``SharedStepModel`` with one
    resource per instance): private part = attention, all-to-alls and the GEMMs' fixed cost;
    shared work = the tiles' SM-seconds. Alone it equals ``InstanceSteps`` (up to float
    rounding): the golden test of the shared-resource port."""

    def __init__(self, cost: CostModel, gpus: int) -> None:
        self.cost = cost
        self.gpus = gpus

    def split(self, chunks: Sequence[tuple[int, int]], num_decode: int,
              kv_tokens: int) -> tuple[float, float, float]:
        cost, gpus = self.cost, self.gpus
        lens = [n for n, _ in chunks]
        tokens = sum(lens) + num_decode
        fixed, work = cost.expert_parts(tokens, gpus)
        private = cost.dense_s(lens, num_decode, kv_tokens, gpus) + cost.layers * (
            cost.a2a_s(tokens, gpus, gpus) + fixed)
        return private, cost.layers * work, 1.0


class PoolAllocator:
    """ExpertPlex's SM policy on the shared pool: decode's share q' follows the tiles of the
    batch it runs (``reallocate_sms``); prefill's weight is the rest of the SMs. Both phases'
    splits read it; the engine's max-min share with these weights gives decode q' SMs while
    prefill has expert work, and each phase all of them while the other has none (the
    persistent kernel hands SMs back at tile boundaries)."""

    def __init__(self, cost: CostModel, policy: SmPolicy, pool: int) -> None:
        self.cost = cost
        self.policy = policy
        self.pool = pool
        self.q_decode = policy.q_ref  # decode's share at its last step

    def decode_weight(self, num_decode: int) -> float:
        self.q_decode = self.cost.decode_sms(self.policy, num_decode, self.pool)
        return float(self.q_decode)

    def prefill_weight(self) -> float:
        return float(max(self.cost.num_sms - self.q_decode, self.policy.cluster))


class PlexSplit:
    """One of ExpertPlex's attention groups (``gpus`` data-parallel GPUs, ``phase`` prefill
    or decode) as a step on the shared pool: private part = its attention, the all-to-alls
    over the ``span`` GPUs and the GEMMs' fixed cost; shared work = the expert tiles'
    SM-seconds, both with the phase's measured APK overhead."""

    def __init__(self, cost: CostModel, gpus: int, span: int, phase: str,
                 allocator: PoolAllocator) -> None:
        if phase not in ("prefill", "decode"):
            raise ValueError(f"phase must be prefill or decode, got {phase!r}")
        self.cost = cost
        self.gpus = gpus
        self.span = span
        self.phase = phase
        self.allocator = allocator
        self.slowdown = APK_PREFILL_SLOWDOWN if phase == "prefill" else APK_DECODE_SLOWDOWN

    def split(self, chunks: Sequence[tuple[int, int]], num_decode: int,
              kv_tokens: int) -> tuple[float, float, float]:
        cost, pool = self.cost, self.allocator.pool
        lens = [n for n, _ in chunks]
        tokens = sum(lens) + num_decode
        fixed, work = cost.expert_parts(tokens, pool)
        private = cost.dense_s(lens, num_decode, kv_tokens, self.gpus) + cost.layers * (
            cost.a2a_s(tokens, pool, self.span) + fixed * self.slowdown)
        weight = (self.allocator.decode_weight(num_decode) if self.phase == "decode"
                  else self.allocator.prefill_weight())
        return private, cost.layers * work * self.slowdown, weight

    def decode_private_s(self, num_decode: int, kv_tokens: np.ndarray
                         ) -> tuple[np.ndarray, float]:
        """(private seconds for each ``kv``, shared work) of decode-only steps, vectorized
        with the same float operations as ``split``."""
        cost, pool = self.cost, self.allocator.pool
        fixed, work = cost.expert_parts(num_decode, pool)
        private = cost.dense_decode_s(num_decode, kv_tokens, self.gpus) + cost.layers * (
            cost.a2a_s(num_decode, pool, self.span) + fixed * self.slowdown)
        return private, cost.layers * work * self.slowdown
