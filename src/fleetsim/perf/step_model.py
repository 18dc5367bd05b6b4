"""The table-driven step-time model: kernel times summed over layers into lookup grids.

Design note. A vLLM step runs every layer once over all scheduled tokens. GEMMs, MoE experts,
all-reduces and elementwise kernels depend only on the total token count T; the LM head and
sampling only on the number of sequences R (one sampled token per request); decode attention
is affine in each request's KV length with coefficients that depend on the decode batch n; and
prefill attention depends on each chunk's (new, context) tokens. We precompute, once, every
token-indexed term summed over layers on grids of T, R, n and s, made non-decreasing (so more
work is never faster: measured tables carry a few % of noise), and the hot path is a handful of
bisects and float ops (see ``step_time_s``).

Prefill chunks with context are mapped onto the table's causal full-prefill curve by equal
attention work: a chunk of q new tokens over c cached ones computes q*c + q^2/2 query-key pairs,
the same as a causal prefill of ``s_eq = sqrt(q^2 + 2 q c)`` tokens. Its time is the larger of
that and the bandwidth time to read its c + q cached tokens (long-context, short-chunk case).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.models.quantization import BF16
from fleetsim.perf import roofline as rl
from fleetsim.perf.ops import OpTimes

OP_CLASSES = ("gemm", "attention", "moe", "communication", "other")

# Default per-step CPU cost of vLLM (scheduler, input preparation, sampler bookkeeping, output
# processing) not hidden behind the GPU; an assumption, see docs/perf_model.md. Override with
# build_step_model(..., step_overhead_s=...). The part that grows with the batch
# (step_overhead_per_seq_s) defaults to 0 for today's vLLM V1, whose per-request work is
# vectorized and overlapped; vLLM V0's measured cost is in fleetsim.perf.cpu_overhead.
STEP_OVERHEAD_S = 1.5e-3
STEP_OVERHEAD_PER_SEQ_S = 0.0
# With async scheduling (vLLM V1's default since v0.14.0, January 2026: "overlaps engine core
# scheduling with GPU execution") the CPU prepares step n+1 while the GPU runs step n, so the
# CPU cost is hidden unless it exceeds the GPU's; what remains between two steps is a short
# idle gap. vLLM PR #11133 (the async-scheduling prototype for V1, Llama-2-7B, batch 256)
# measured that gap at 150-170 us with CUDA graphs, down from 5-6 ms synchronous; we take the
# middle of the range.
ASYNC_STEP_GAP_S = 160e-6
# Elementwise kernels per layer (2 RMSNorm+residual, RoPE, SiLU-and-mul), each >= one launch.
ELEMENTWISE_KERNELS_PER_LAYER = 4

_GRID_CACHE: dict[tuple, _Grids] = {}


def _token_grid() -> NDArray[np.float64]:
    dense = np.arange(0, 1025, dtype=float)
    mid = np.arange(1024, 16385, 32, dtype=float)
    tail = np.exp2(np.arange(14, 21, 1 / 16))
    return np.unique(np.concatenate([dense, mid, np.round(tail)]))


def _attn_grid() -> NDArray[np.float64]:
    return np.unique(np.concatenate([[0.0, 1.0], np.exp2(np.arange(0, 23, 1 / 16))]))


@dataclass(slots=True)
class _Piecewise:
    """Piecewise-linear y(x) as Python lists; extrapolates with the last slope.

    ``lookup`` is a closure for the hot path: integer x on the grid's leading run of
    consecutive integers is a list index, anything else a bisect.
    """

    xs: list[float]
    ys: list[float]
    slopes: list[float]
    num_dense: int = field(init=False)  # xs starts 0, 1, ..., num_dense - 1
    # ``octave_start[k]``: the first index whose x is at least 2**(k - 1) (k >= 1; 0 for
    # k = 0), so the x of an octave [2**(k - 1), 2**k) is searched for among the grid
    # points of its octave only (a search of the whole grid took twice the comparisons).
    octave_start: list[int] = field(init=False)

    def __post_init__(self) -> None:
        n = 0
        while n < len(self.xs) and self.xs[n] == n:
            n += 1
        self.num_dense = n
        top = max(1, math.ceil(self.xs[-1])).bit_length() + 1
        self.octave_start = [0] + [bisect_left(self.xs, 2.0 ** (k - 1))
                                   for k in range(1, top + 1)]

    @classmethod
    def from_arrays(cls, xs: NDArray, ys: NDArray) -> _Piecewise:
        ys = np.maximum.accumulate(ys)  # non-decreasing: more work is never faster
        sl = np.diff(ys) / np.diff(xs)
        return cls(xs.tolist(), ys.tolist(), [*sl.tolist(), float(sl[-1])])

    def __call__(self, x: float) -> float:
        return self.at(x)  # (``lookup()`` builds a closure: for loops that call it often)

    def at(self, x: float) -> float:
        """y(x), as ``lookup()(x)``: a method, so the compiled engine calls it directly.
        (An integral x on the dense run is an index whatever its type: the compiled engine
        passes every x as a C double, and the formula below gives ``ys[i] + slope * 0.0``
        there, the same value.)"""
        if 0 <= x < self.num_dense:
            i = int(x)
            if i == x:
                return self.ys[i]
        xs = self.xs
        if x < xs[-1]:
            # ``bisect_right(xs, x) - 1`` among the points of x's octave: those below it
            # are all <= x, those of the next octave all > x.
            if x < 1.0:
                lo, hi = 0, self.octave_start[1]
            else:
                k = int(x).bit_length()
                lo, hi = self.octave_start[k], self.octave_start[k + 1]
            # (``bisect_right(xs, x, lo, hi)``, written out: the compiled engine called the
            # bisect module generically, about 1,000 instructions a call for 4-7 compares)
            while lo < hi:
                mid = (lo + hi) // 2
                if x < xs[mid]:
                    hi = mid
                else:
                    lo = mid + 1
            i = lo - 1
            if i < 0:
                i = 0
        else:  # (past the last point, or NaN: extrapolate from the last segment)
            i = len(xs) - 1
        return self.ys[i] + self.slopes[i] * (x - xs[i])

    def scaled(self, factor: float) -> _Piecewise:
        """``factor * y(x)``; the same object when ``factor == 1`` (bit-identical results)."""
        if factor == 1.0:
            return self
        return _Piecewise(self.xs, [y * factor for y in self.ys],
                          [d * factor for d in self.slopes])

    def lookup(self) -> Callable[[float], float]:
        xs, ys, sl = self.xs, self.ys, self.slopes
        num_dense = 0
        while num_dense < len(xs) and xs[num_dense] == num_dense:
            num_dense += 1
        dense = ys[:num_dense]

        def f(x: float, _bisect: Callable = bisect_right) -> float:
            if x.__class__ is int and 0 <= x < num_dense:
                return dense[x]
            x = x + 0.0  # float keys bisect 2x faster than int keys; same value (x < 2**53)
            i = _bisect(xs, x) - 1
            if i < 0:
                i = 0
            return ys[i] + sl[i] * (x - xs[i])

        return f


OpCurve = _Piecewise
"""An op class's seconds as a piecewise-linear function of tokens (``op_time_curve``)."""


@dataclass(slots=True)
class _Grids:
    by_tokens: dict[str, _Piecewise]  # op class -> seconds(T), all layers
    by_seqs: dict[str, _Piecewise]  # op class -> seconds(R): LM head, sampling
    dec_a: _Piecewise  # decode attention intercept(n), all layers
    dec_c: _Piecewise  # decode attention seconds per KV token(n), all layers
    prefill: _Piecewise  # causal prefill attention seconds(s), all layers
    prefill_floor_s: float
    kv_read_s_per_token: float  # all layers
    sources: dict[str, str]
    total_tokens: _Piecewise
    total_seqs: _Piecewise


def _build_grids(model: ModelSpec, gpu: GPUSpec, tp: int, use_tables: bool) -> _Grids:
    ops = OpTimes(model, gpu, tp, use_tables)
    m, h = model, model.hidden_size
    T = _token_grid()
    heads, kv_heads = ops.heads, ops.kv_heads
    # --- GEMMs, per layer, then summed over layers ---
    if m.uses_mla:
        proj = (
            ops.gemm_s(T, m.q_lora_rank, h)
            + ops.gemm_s(T, heads * m.head_dim, m.q_lora_rank)
            + ops.gemm_s(T, m.kv_lora_rank + m.qk_rope_head_dim, h)
            + ops.gemm_s(T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
            + ops.gemm_s(T, h, heads * m.v_head_dim)
        )
    else:
        proj = ops.gemm_s(T, (heads + 2 * kv_heads) * m.head_dim, h) + ops.gemm_s(
            T, h, heads * m.head_dim
        )
    inter = -(-m.intermediate_size // tp)
    up = (2 if m.gated_mlp else 1) * inter  # SwiGLU fuses gate and up in one GEMM
    dense_mlp = ops.gemm_s(T, up, h) + ops.gemm_s(T, h, inter)
    gemm = m.num_layers * proj + (m.num_layers - m.num_moe_layers) * dense_mlp
    moe = np.zeros_like(T)
    if m.is_moe:
        router = ops.gemm_s(T, m.num_experts, h, part=BF16)  # routers stay 16-bit
        shared: NDArray[np.float64] | float = 0.0
        if m.num_shared_experts:
            sh = -(-m.moe_intermediate_size * m.num_shared_experts // tp)
            shared = ops.gemm_s(T, 2 * sh, h) + ops.gemm_s(T, h, sh)
        gemm = gemm + m.num_moe_layers * (router + shared)
        moe = m.num_moe_layers * ops.moe_s(T)
    comm = 2 * m.num_layers * ops.allreduce_s(T)
    # norms, RoPE, activation: ~12 hidden-sized bf16 passes + the SwiGLU input/output
    elem_bytes = T * (12 * h + (up + inter)) * 2.0
    floor = ELEMENTWISE_KERNELS_PER_LAYER * rl.KERNEL_FLOOR_S
    elem = m.num_layers * np.where(
        T > 0, np.maximum(elem_bytes / (gpu.hbm_bw_bytes_per_s * rl.GEMM_MEMORY_EFF), floor), 0.0
    )
    # --- per sequence: LM head on the sampled positions, and the sampler over the vocab ---
    lm_head = ops.gemm_s(T, -(-m.vocab_size // tp), h, part=BF16)
    sampling = np.where(
        T > 0, T * m.vocab_size * 4.0 * 4 / (gpu.hbm_bw_bytes_per_s * rl.GEMM_MEMORY_EFF), 0.0
    )
    # --- attention ---
    dec_a, dec_c = ops.decode_attention_fit(T)
    dec_a, dec_c = np.where(T > 0, dec_a, 0.0), np.where(T > 0, dec_c, 0.0)
    S = _attn_grid()
    prefill = m.num_layers * ops.prefill_attention_s(S)
    prefill[0] = 0.0

    # Monotone per component first, so the totals are exactly the sums of the components.
    mono = np.maximum.accumulate
    gemm, moe, comm, elem = mono(gemm), mono(moe), mono(comm), mono(elem)
    lm_head, sampling = mono(lm_head), mono(sampling)
    pw = _Piecewise.from_arrays
    by_tokens = {
        "gemm": pw(T, gemm),
        "moe": pw(T, moe),
        "communication": pw(T, comm),
        "other": pw(T, elem),
    }
    by_seqs = {"gemm": pw(T, lm_head), "other": pw(T, sampling)}
    sources = {k: " + ".join(sorted(v)) for k, v in ops.sources.items()}
    sources.setdefault("moe", "none (dense model)")
    sources.setdefault("communication", "none (tp=1)")
    return _Grids(
        by_tokens=by_tokens,
        by_seqs=by_seqs,
        dec_a=pw(T, m.num_layers * dec_a),
        dec_c=pw(T, m.num_layers * dec_c),
        prefill=pw(S, prefill),
        prefill_floor_s=float(prefill[1]),
        kv_read_s_per_token=m.num_layers * ops.kv_read_s_per_token(),
        sources=sources,
        total_tokens=pw(T, gemm + moe + comm + elem),
        total_seqs=pw(T, lm_head + sampling),
    )


class TableStepModel:
    """``StepTimeModel`` for one replica: measured tables with per-op roofline fallback.

    Build with ``fleetsim.perf.build_step_model``. ``sources`` maps each op class to where its
    numbers come from.
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tp: int,
        use_tables: bool,
        step_overhead_s: float = STEP_OVERHEAD_S,
        step_overhead_per_seq_s: float = STEP_OVERHEAD_PER_SEQ_S,
        kernel_time_scale: float = 1.0,
        async_scheduling: bool = False,
        async_step_gap_s: float = ASYNC_STEP_GAP_S,
    ) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        # Every constructor argument: equal keys price every step alike (a caller may reuse
        # what it derived from one model for another, e.g. ESP's analytical fit).
        self.key: tuple[object, ...] = (model, gpu, tp, use_tables, float(step_overhead_s),
                                        float(step_overhead_per_seq_s),
                                        float(kernel_time_scale), bool(async_scheduling),
                                        float(async_step_gap_s))
        key = (model, gpu, tp, use_tables)
        if key not in _GRID_CACHE:
            _GRID_CACHE[key] = _build_grids(model, gpu, tp, use_tables)
        g = _GRID_CACHE[key]
        self._g = g
        self.step_overhead_s = float(step_overhead_s)
        self.step_overhead_per_seq_s = float(step_overhead_per_seq_s)
        # Every GPU term (kernels, not the CPU overhead) times this factor: a deployment's
        # kernels slower or faster than the tables' (``fleetsim calibrate`` fits it).
        self.kernel_time_scale = k = float(kernel_time_scale)
        self.sources: dict[str, str] = dict(g.sources)
        if k != 1.0:
            self.sources["kernel_time_scale"] = f"every kernel term x{k:g}"
        per_seq = (f" + {self.step_overhead_per_seq_s * 1e6:g} us per sequence"
                   if self.step_overhead_per_seq_s else "")
        # Async scheduling: the CPU cost overlaps the GPU's work, and a step costs
        # kernels + max(gap, cpu - kernels), with "kernels" the part that does not grow with
        # decode KV (so decode steps stay affine in KV, as fast-forward needs). When the CPU
        # is the bottleneck this charges the CPU's excess over the KV-free kernels, an upper
        # bound of the true max(kernels + gap, cpu) by at most the decode KV reads.
        self.async_scheduling = bool(async_scheduling)
        self.async_step_gap_s = float(async_step_gap_s)
        cpu = (f"fixed {self.step_overhead_s * 1e3:g} ms per-step overhead{per_seq}")
        if self.async_scheduling:
            cpu = (f"async scheduling: {cpu} overlapped with the GPU, "
                   f"{self.async_step_gap_s * 1e6:g} us gap per step")
        self.sources["other"] = f"roofline (elementwise, sampling) + {cpu}"
        # Hot-path bindings: the grids' piecewise-linear curves, and floats.
        self._tok, self._seq = g.total_tokens.scaled(k), g.total_seqs.scaled(k)
        self._dec_a, self._dec_c = g.dec_a.scaled(k), g.dec_c.scaled(k)
        self._prefill = g.prefill.scaled(k)
        self._floor = g.prefill_floor_s * k
        self._kv_read = g.kv_read_s_per_token * k

    def _prefill_attention_s(self, prefill_chunks: Sequence[tuple[int, int]]) -> float:
        att, floor, kv_read, prefill = 0.0, self._floor, self._kv_read, self._prefill
        for new, ctx in prefill_chunks:
            # (``_chunk_attention_s`` written out: this runs at every prefill step, and the
            # call cost 0.7% of the Azure replay's instructions; the property test
            # ``test_chunk_run_prices_are_bit_exact`` holds the two to the same floats)
            work = prefill.at(math.sqrt(float(new * new + 2 * new * ctx))) - floor
            mem = kv_read * (new + ctx)
            att += work if work > mem else mem
        return att + floor

    def _chunk_attention_s(self, new: int, ctx: int) -> float:
        """One prefill chunk's attention beyond the kernel floor: compute or KV reads,
        whichever is longer."""
        # (``float()``: the compiled engine's native sqrt takes a float; math.sqrt of an int
        # converts it the same way)
        work = self._prefill.at(math.sqrt(float(new * new + 2 * new * ctx))) - self._floor
        mem = self._kv_read * (new + ctx)
        return work if work > mem else mem

    def step_time_s(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int, decode_kv_tokens: int
    ) -> float:
        """Seconds for one step; see ``fleetsim.perf.base.StepTimeModel``."""
        num_tokens = num_decode
        for chunk in prefill_chunks:  # (not ``new, _``: compiled, ``_`` is a boxed int)
            num_tokens += chunk[0]
        num_seqs = num_decode + len(prefill_chunks)
        if self.async_scheduling:
            k = self._tok.at(num_tokens) + self._seq.at(num_seqs)
            k = k + self._dec_a.at(num_decode)
            if prefill_chunks:
                k += self._prefill_attention_s(prefill_chunks)
            t = k + self._exposed_cpu_s(num_seqs, k)
            return t + self._dec_c.at(num_decode) * decode_kv_tokens
        t = self.step_overhead_s + self.step_overhead_per_seq_s * num_seqs
        t = t + self._tok.at(num_tokens) + self._seq.at(num_seqs)
        t = t + self._dec_a.at(num_decode)
        t = t + self._dec_c.at(num_decode) * decode_kv_tokens
        if prefill_chunks:
            t += self._prefill_attention_s(prefill_chunks)
        return t

    def chunk_prices(self, chunk: int, num_decode: int) -> ChunkStepPrices:
        """``step_time_s([(chunk, ctx)], num_decode, kv)`` at any ``ctx`` and ``kv``, with
        the terms that depend on neither computed once (a chunk run's steps,
        ``serving/chunk_runs.py``)."""
        return ChunkStepPrices(self, chunk, num_decode)

    def _exposed_cpu_s(self, num_seqs: int, kernels_s: float) -> float:
        """CPU time the GPU waits for under async scheduling: the gap, or the CPU's excess."""
        excess = self.step_overhead_s + self.step_overhead_per_seq_s * num_seqs - kernels_s
        return excess if excess > self.async_step_gap_s else self.async_step_gap_s

    def step_parts_s(self, prefill_chunks: Sequence[tuple[int, int]], num_tokens: int,
                     num_seqs: int, num_decode: int, decode_kv_tokens: int) -> float:
        """GPU kernel seconds of a step with these counts, for models that change a step's
        shape (speculative decoding: ``perf/speculative.py``); ``num_tokens`` and
        ``num_seqs`` may exceed the chunks' and decodes' own (verified draft positions).
        Add ``cpu_s`` for the step's time."""
        k = self._tok.at(num_tokens) + self._seq.at(num_seqs)
        k = k + self._dec_a.at(num_decode) + self._dec_c.at(num_decode) * decode_kv_tokens
        if prefill_chunks:
            k += self._prefill_attention_s(prefill_chunks)
        return k

    def cpu_s(self, num_seqs: int, kernels_s: float) -> float:
        """CPU seconds the GPU waits for in a step of ``num_seqs`` sequences whose kernels
        take ``kernels_s`` (all of the CPU cost when synchronous)."""
        if self.async_scheduling:
            return self._exposed_cpu_s(num_seqs, kernels_s)
        return self.step_overhead_s + self.step_overhead_per_seq_s * num_seqs

    def layer_pass_s(self, num_tokens: int, num_decode: int, decode_kv_tokens: int,
                     num_layers: int) -> float:
        """Kernel seconds of one average layer (token-indexed terms and decode attention,
        divided by ``num_layers``) over ``num_tokens`` tokens, plus the LM head and sampler
        for ``num_decode`` sequences: a one-layer draft head of the model's shape."""
        layers = (self._tok.at(num_tokens) + self._dec_a.at(num_decode)
                  + self._dec_c.at(num_decode) * decode_kv_tokens) / num_layers
        return layers + self._seq.at(num_decode)

    def per_sequence_s(self, num_seqs: int) -> float:
        """Seconds of the terms priced per sampled sequence: LM head GEMM and sampling."""
        return self._seq.at(num_seqs)

    def op_time_lookup(self, op_class: str) -> Callable[[float], float]:
        """Seconds of one op class (``gemm``, ``moe``, ``communication``, ``other``) as a
        function of the step's token count, for models that replace a part (expert
        parallelism replaces ``moe``)."""
        return self._g.by_tokens[op_class].scaled(self.kernel_time_scale).lookup()

    def op_time_curve(self, op_class: str) -> OpCurve:
        """``op_time_lookup`` as the curve itself, whose ``at(tokens)`` gives the same floats:
        compiled code calls the method directly, where the function is a generic call (and
        its search a generic ``bisect``)."""
        return self._g.by_tokens[op_class].scaled(self.kernel_time_scale)

    def decode_step_times_s(
        self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """``step_time_s((), num_decode, kv)`` per element, bit for bit (same float ops)."""
        kv = np.asarray(decode_kv_tokens).astype(np.float64)
        if self.async_scheduling:
            base, per_kv, _ = self.decode_terms_s(num_decode)
            return base + per_kv * kv
        t = self.step_overhead_s + self.step_overhead_per_seq_s * num_decode
        t = t + self._tok.at(num_decode) + self._seq.at(num_decode)
        t = t + self._dec_a.at(num_decode)
        return t + self._dec_c.at(num_decode) * kv

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        """``step_time_s((), n, kv) == (base + per_kv * kv) + extra``, bit for bit."""
        if self.async_scheduling:
            k = self._tok.at(num_decode) + self._seq.at(num_decode)
            k = k + self._dec_a.at(num_decode)
            return k + self._exposed_cpu_s(num_decode, k), self._dec_c.at(num_decode), 0.0
        t = self.step_overhead_s + self.step_overhead_per_seq_s * num_decode
        t = t + self._tok.at(num_decode) + self._seq.at(num_decode)
        return t + self._dec_a.at(num_decode), self._dec_c.at(num_decode), 0.0

    def attention_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        """``breakdown_s(...)["attention"]``, the same floats, without the other op classes
        (a sequence-parallel prefill weighs its ring exchange against it at every step)."""
        att = self._dec_a.at(num_decode) + self._dec_c.at(num_decode) * decode_kv_tokens
        if prefill_chunks:
            att += self._prefill_attention_s(prefill_chunks)
        return att

    def breakdown_s(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int, decode_kv_tokens: int
    ) -> dict[str, float]:
        """Seconds by op class for one step (slow path; sums to ``step_time_s`` up to
        rounding)."""
        g = self._g
        num_tokens = num_decode + sum(n for n, _ in prefill_chunks)
        num_seqs = num_decode + len(prefill_chunks)
        scale = self.kernel_time_scale
        out = {k: g.by_tokens[k](num_tokens) * scale if k in g.by_tokens else 0.0
               for k in OP_CLASSES}
        for k, f in g.by_seqs.items():
            out[k] += f(num_seqs) * scale
        out["attention"] = self.attention_s(prefill_chunks, num_decode, decode_kv_tokens)
        if self.async_scheduling:
            kernels = sum(out.values()) - (self._dec_c.at(num_decode) * decode_kv_tokens)
            out["other"] += self._exposed_cpu_s(num_seqs, kernels)
        else:
            out["other"] += self.step_overhead_s + self.step_overhead_per_seq_s * num_seqs
        return out


class ChunkStepPrices:
    """``TableStepModel.step_time_s([(chunk, ctx)], num_decode, kv)`` for one chunk size and
    decode count at many contexts (the steps of a chunk run): the terms that depend on
    neither ``ctx`` nor ``kv`` (the token, sequence and decode lookups, the CPU overhead) are
    added once, as ``step_time_s`` adds them first, and each price then adds the rest in
    ``step_time_s``'s order, so every price is the same float to the bit (a property test
    holds it there). A run priced two thirds of its instructions in those lookups."""

    __slots__ = ("_async", "_base", "_chunk", "_dec_c", "_model", "_num_seqs")

    def __init__(self, model: TableStepModel, chunk: int, num_decode: int) -> None:
        self._model = model
        self._chunk = chunk
        num_tokens = num_decode + chunk
        num_seqs = num_decode + 1
        self._num_seqs = num_seqs
        self._async = model.async_scheduling
        if self._async:
            k = model._tok.at(num_tokens) + model._seq.at(num_seqs)
            self._base = k + model._dec_a.at(num_decode)
        else:
            t = model.step_overhead_s + model.step_overhead_per_seq_s * num_seqs
            t = t + model._tok.at(num_tokens) + model._seq.at(num_seqs)
            self._base = t + model._dec_a.at(num_decode)
        self._dec_c = model._dec_c.at(num_decode)

    def step_s(self, ctx: int, decode_kv_tokens: int) -> float:
        """The step's seconds with the chunk after ``ctx`` computed tokens and the decodes'
        ``decode_kv_tokens`` of context."""
        model = self._model
        att = 0.0  # (``_prefill_attention_s([(chunk, ctx)])``, the same additions)
        att += model._chunk_attention_s(self._chunk, ctx)
        att = att + model._floor
        if self._async:
            k = self._base
            k += att
            t = k + model._exposed_cpu_s(self._num_seqs, k)
            return t + self._dec_c * decode_kv_tokens
        t = self._base + self._dec_c * decode_kv_tokens
        t += att
        return t
