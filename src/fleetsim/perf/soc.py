"""FLOPs and DDR bytes of one LLM operation (a prefill chunk or a decode step), and its time
on one accelerator: the roofline ``max(flops / (peak * eff), bytes / bandwidth)``.

Weights are weight-only quantised (``bits_per_weight``; 4.5 is llama.cpp's Q4_0: 18 bytes per
32 weights), computed in FP16; the KV cache is FP16. Every forward pass streams the decoder
weights and the LM head once (the embedding table is gathered, not streamed), reads the KV
of the context and writes the new tokens' KV. Activations stay in on-chip memory and the
SoC's shared cache and are not counted (at most a few MB per chunk against GBs of weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetsim.hardware.soc import AcceleratorSpec, SoCSpec
from fleetsim.models import ModelSpec
from fleetsim.perf.soc_contention import share_bandwidth

KV_DTYPE_BYTES = 2  # FP16 KV cache (OpenVINO and llama.cpp defaults on Intel GPUs)


@dataclass(frozen=True, slots=True)
class OpCost:
    """What one operation asks of an accelerator."""

    flops: float
    bytes: float
    """DDR bytes read and written."""

    def scaled(self, share: float) -> OpCost:
        """The part of this op a tensor split gives one accelerator (a ``share`` of every
        matrix: weights, heads and KV alike)."""
        return OpCost(self.flops * share, self.bytes * share)


@dataclass(frozen=True)
class ModelCost:
    """A model at a weight precision: the per-token constants the op costs are built from
    (computed once, at construction: every step of a run is priced from them)."""

    model: ModelSpec
    bits_per_weight: float
    kv_dtype_bytes: int = KV_DTYPE_BYTES
    """KV element size the runtime keeps (FP16 by default, whatever the checkpoint's)."""
    # Derived in ``__post_init__`` (plain fields, not ``cached_property``: compiled with
    # mypyc, a cached property is computed again at every read, 18% of an Agent.xpu run).
    streamed_params: int = field(init=False, repr=False, compare=False)
    """Weights read by every forward pass: decoder layers plus the LM head."""
    weight_bytes: float = field(init=False, repr=False, compare=False)
    kv_bytes_per_token: int = field(init=False, repr=False, compare=False)
    """The model's KV bytes per token (MLA's latent included), at ``kv_dtype_bytes``."""
    # The model's attention shape, read at every step (the model spec is interpreted: three
    # attribute lookups a step), and a decode token's attention FLOPs (``_attention_flops(1,
    # 1)``, the same float whenever it is computed).
    num_heads: int = field(init=False, repr=False, compare=False)
    head_dim: int = field(init=False, repr=False, compare=False)
    num_layers: int = field(init=False, repr=False, compare=False)
    decode_attention_flops: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= self.bits_per_weight <= 16:
            raise ValueError(f"bits_per_weight must be in [1, 16], got {self.bits_per_weight}")
        if self.kv_dtype_bytes not in (1, 2, 4):
            raise ValueError(f"kv_dtype_bytes must be 1, 2 or 4, got {self.kv_dtype_bytes}")
        m = self.model
        streamed = (m.num_layers * m.attention_params_per_gpu(1) + m.mlp_params_per_gpu(1)
                    + m.vocab_size * m.hidden_size)
        object.__setattr__(self, "streamed_params", streamed)
        object.__setattr__(self, "weight_bytes", streamed * self.bits_per_weight / 8)
        object.__setattr__(self, "kv_bytes_per_token",
                           m.kv_bytes_per_token(kv_dtype_bytes=self.kv_dtype_bytes))
        object.__setattr__(self, "num_heads", m.num_attention_heads)
        object.__setattr__(self, "head_dim", m.head_dim)
        object.__setattr__(self, "num_layers", m.num_layers)
        object.__setattr__(self, "decode_attention_flops", self._attention_flops(1, 1))

    def _attention_flops(self, num_query: int, context: float) -> float:
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add, per query head and layer
        return (4.0 * num_query * context * self.num_heads * self.head_dim
                * self.num_layers)

    def prefill(self, num_tokens: int, num_cached: int) -> OpCost:
        """A chunk of ``num_tokens`` prompt tokens after ``num_cached`` already in the KV."""
        mean_context = num_cached + (num_tokens + 1) / 2  # causal: token i sees i earlier ones
        flops = (2.0 * num_tokens * self.streamed_params
                 + self._attention_flops(num_tokens, mean_context))
        kv = self.kv_bytes_per_token * (num_cached + num_tokens)  # read the prefix, write new
        return OpCost(flops, self.weight_bytes + kv)

    def decode(self, contexts: list[int]) -> OpCost:
        """One decode step of a batch whose sequences hold ``contexts`` tokens each."""
        batch = len(contexts)
        total = sum(contexts)
        flops = 2.0 * batch * self.streamed_params + self.decode_attention_flops * total
        kv = self.kv_bytes_per_token * (total + batch)
        return OpCost(flops, self.weight_bytes + kv)

    def step(self, chunks: Sequence[tuple[int, int]], num_decode: int,
             kv_tokens: int) -> OpCost:
        """One engine step (``StepTimeModel.step_time_s``'s arguments): prefill ``chunks`` of
        (tokens, tokens already cached) and ``num_decode`` decodes whose requests hold
        ``kv_tokens`` computed tokens in all. One forward pass streams the weights once; each
        chunk costs what ``prefill`` charges beyond them, the decodes what ``decode`` does
        (a decode's context is its computed tokens plus the token it feeds in)."""
        flops, nbytes = self.step_flops_bytes(chunks, num_decode, kv_tokens)
        return OpCost(flops, nbytes)

    def step_flops_bytes(self, chunks: Sequence[tuple[int, int]], num_decode: int,
                         kv_tokens: int) -> tuple[float, float]:
        """``step``'s (flops, bytes) as a pair: a step's split reads them without building
        an ``OpCost`` (a frozen dataclass: its ``__init__`` is Python-level even when
        compiled, 3.6k instructions a step)."""
        flops = 0.0
        kv_bytes = 0.0
        kv = self.kv_bytes_per_token
        for n, cached in chunks:
            flops += 2.0 * n * self.streamed_params + self._attention_flops(
                n, cached + (n + 1) / 2)
            kv_bytes += kv * (cached + n)
        if num_decode:
            total = kv_tokens + num_decode
            flops += (2.0 * num_decode * self.streamed_params
                      + self.decode_attention_flops * total)
            kv_bytes += kv * (total + num_decode)
        return flops, self.weight_bytes + kv_bytes


def compute_s(acc: AcceleratorSpec, cost: OpCost) -> float:
    """Time the op's arithmetic takes on ``acc`` at its achieved FLOP rate."""
    return flops_s(acc, cost.flops)


def flops_s(acc: AcceleratorSpec, flops: float) -> float:
    """``compute_s`` of ``flops`` (without an ``OpCost``: a frozen dataclass, whose
    ``__init__`` is Python-level even compiled)."""
    return flops / (acc.peak_fp16_flops * acc.compute_eff)


def op_s(acc: AcceleratorSpec, cost: OpCost, bw_bytes_per_s: float) -> float:
    """Roofline time of the op on ``acc`` when it gets ``bw_bytes_per_s`` of DDR."""
    return max(compute_s(acc, cost), cost.bytes / bw_bytes_per_s)


def demand_bytes_per_s(acc: AcceleratorSpec, cost: OpCost, max_draw: float) -> float:
    """The bandwidth the op draws when unconstrained: all it can take if memory-bound, just
    enough to keep its arithmetic fed if compute-bound."""
    return draw_bytes_per_s(compute_s(acc, cost), cost.bytes, max_draw)


def draw_bytes_per_s(t_compute: float, nbytes: float, max_draw: float) -> float:
    """``demand_bytes_per_s`` of an op whose arithmetic takes ``t_compute`` and which moves
    ``nbytes``."""
    if t_compute <= 0:
        return max_draw
    return min(max_draw, nbytes / t_compute)


class SocSplit:
    """An engine step on one accelerator of an SoC, split for the shared DDR
    (``serving/shared_steps.py``, with ``overlap``: arithmetic and memory traffic proceed
    together): the private part is the step's arithmetic (``compute_s``), the shared work its
    DDR bytes, and the step draws at most its demand (``demand_bytes_per_s``: all the
    accelerator can draw when memory-bound, just enough to feed its arithmetic when
    compute-bound). Under the DDR's max-min shares this is the contention model the SoC
    engine used (``perf/soc_contention.py``): a step's progress is its share over its bytes,
    capped by its arithmetic."""

    # ``split`` reads nothing but its arguments and ``decode_private_s`` makes its float
    # operations: a short decode window may be priced step by step (``SharedStepModel``).
    scalar_windows = True

    def __init__(self, cost: ModelCost, soc: SoCSpec, accelerator: str) -> None:
        self.cost = cost
        self.soc = soc
        self.accelerator = soc.accelerator(accelerator)
        self.max_draw_bytes_per_s = self.accelerator.max_draw_bytes_per_s(
            soc.ddr_bw_bytes_per_s)
        # ``flops_s``'s divisor, the same product (the accelerator spec is interpreted: two
        # attribute lookups a step)
        acc = self.accelerator
        self.flops_per_s = acc.peak_fp16_flops * acc.compute_eff

    def split(self, chunks: Sequence[tuple[int, int]], num_decode: int,
              kv_tokens: int) -> tuple[float, float, float, float]:
        """(private seconds, DDR bytes, weight 1, the step's most bytes/s)."""
        flops, nbytes = self.cost.step_flops_bytes(chunks, num_decode, kv_tokens)
        private_s = flops / self.flops_per_s  # (``flops_s``)
        demand = draw_bytes_per_s(private_s, nbytes, self.max_draw_bytes_per_s)
        return private_s, nbytes, 1.0, demand if demand > 0 else math.inf

    def decode_split(self, num_decode: int, kv_tokens: int
                     ) -> tuple[float, float, float, float]:
        """``split((), num_decode, kv_tokens)`` with its float operations, without the walk
        over prefill chunks (a decode window prices each of its steps so)."""
        private_s, nbytes = self._decode_private_bytes(num_decode, kv_tokens)
        demand = draw_bytes_per_s(private_s, nbytes, self.max_draw_bytes_per_s)
        return private_s, nbytes, 1.0, demand if demand > 0 else math.inf

    def decode_alone_s(self, num_decode: int, kv_tokens: int, alone_rate: float,
                       overlap: bool) -> float:
        """A decode-only step's length at the shared model's ``alone_rate`` (its
        ``decode_step_s``): ``decode_split``'s float operations and then ``_alone_s``'s,
        without the four-tuple between them (a window prices each of its steps so; the
        tuple, its boxed floats and two calls were about half of each step's price)."""
        private_s, nbytes = self._decode_private_bytes(num_decode, kv_tokens)
        demand = draw_bytes_per_s(private_s, nbytes, self.max_draw_bytes_per_s)
        max_rate = demand if demand > 0 else math.inf
        shared_s = nbytes / (alone_rate if alone_rate <= max_rate else max_rate)
        if overlap:
            return shared_s if shared_s > private_s else private_s  # max(private, shared)
        return private_s + shared_s

    def _decode_private_bytes(self, num_decode: int, kv_tokens: int) -> tuple[float, float]:
        """A decode-only step's arithmetic seconds and DDR bytes (``split``'s floats; two
        floats, which a compiled caller gets without a tuple object)."""
        c = self.cost
        flops = 0.0
        kv_bytes = 0.0
        if num_decode:
            total = kv_tokens + num_decode
            flops += (2.0 * num_decode * c.streamed_params + c.decode_attention_flops * total)
            kv_bytes += c.kv_bytes_per_token * (total + num_decode)
        return flops / self.flops_per_s, c.weight_bytes + kv_bytes

    def decode_private_s(self, num_decode: int, kv_tokens: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``split`` of decode-only steps for each ``kv_tokens``, vectorized with the same
        float operations (a decode window is priced without a Python call per step):
        (private seconds, DDR bytes, the steps' most bytes/s)."""
        c = self.cost
        total = kv_tokens + num_decode
        flops = 2.0 * num_decode * c.streamed_params + c.decode_attention_flops * total
        work = c.weight_bytes + c.kv_bytes_per_token * (total + num_decode)
        acc = self.accelerator
        private_s = flops / (acc.peak_fp16_flops * acc.compute_eff)
        with np.errstate(divide="ignore"):
            demand = np.where(private_s > 0, np.minimum(self.max_draw_bytes_per_s,
                                                        work / private_s),
                              self.max_draw_bytes_per_s)
        return private_s, work, demand


# ---- tensor splits: one op over both accelerators, the halves sharing the DDR ----------------
_DONE = 1e-12  # a part with less than this share of its work left has finished
SPLIT_STEPS = 100  # the partition search tries NPU shares 0, 0.01, ..., 1


@dataclass(frozen=True, slots=True)
class Part:
    """The part of an op one accelerator runs."""

    accelerator: str
    cost: OpCost


def part_rates(soc: SoCSpec, parts: Sequence[Part]) -> list[float]:
    """Share of its work each running part completes per second, with the DDR shared."""
    accs = [soc.accelerator(p.accelerator) for p in parts]
    draws = [a.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s) for a in accs]
    demands = [demand_bytes_per_s(a, p.cost, d) for a, p, d in zip(accs, parts, draws,
                                                                       strict=True)]
    alloc = share_bandwidth(demands, soc.achievable_bw_bytes_per_s)
    rates = []
    for acc, part, bw in zip(accs, parts, alloc, strict=True):
        t_mem = part.cost.bytes / bw if part.cost.bytes > 0 else 0.0
        rates.append(1.0 / max(compute_s(acc, part.cost), t_mem))
    return rates


def concurrent_s(soc: SoCSpec, parts: Sequence[Part]) -> list[float]:
    """When each of ``parts``, started together with nothing else running, finishes: a
    closed form in rounds, each ending when the next part does (so at most one round per
    part; the DDR shares change only then)."""
    left = [1.0] * len(parts)
    end = [0.0] * len(parts)
    elapsed_s = 0.0
    live = list(range(len(parts)))
    for _ in range(len(parts)):
        if not live:
            break
        rates = part_rates(soc, [parts[i] for i in live])
        dt = min(left[i] / r for i, r in zip(live, rates, strict=True))
        elapsed_s += dt
        for i, r in zip(list(live), rates, strict=True):
            left[i] -= r * dt
            if left[i] <= _DONE:
                end[i] = elapsed_s
                live.remove(i)
    if live:
        raise RuntimeError(f"parts {live} of a split op did not finish in {len(parts)} rounds")
    return end


def split_parts(cost: OpCost, npu_share: float) -> list[Part]:
    """``cost`` split over the NPU (``npu_share`` of every matrix) and the iGPU (the rest);
    a part with no work is left out."""
    return [p for p in (Part("npu", cost.scaled(npu_share)),
                        Part("igpu", cost.scaled(1.0 - npu_share))) if p.cost.flops > 0]


def best_npu_share(soc: SoCSpec, cost: OpCost) -> float:
    """The NPU share of a tensor split that finishes ``cost`` soonest, both halves running
    together on the shared DDR (the paper's "optimal tensor-partitioning" baseline)."""
    best, best_s = 0.0, float("inf")
    for k in range(SPLIT_STEPS + 1):
        share = k / SPLIT_STEPS
        finish = max(concurrent_s(soc, split_parts(cost, share)))
        if finish < best_s - 1e-15:
            best, best_s = share, finish
    return best


class TensorSplitSteps:
    """A step model of one replica over both accelerators (Agent.xpu's static-partition
    baseline): every step is split at a fixed NPU share, the prefill share for a step with
    prompt tokens, else the decode share, each chosen offline (``best_npu_share``) for a
    ``profile_tokens`` prompt and a decode at that context. The two halves run together on
    the DDR (``concurrent_s``); the step ends with the later one. Exact only while nothing
    else runs on the SoC (a one-pool cluster)."""

    def __init__(self, cost: ModelCost, soc: SoCSpec, profile_tokens: int = 1024) -> None:
        self.cost = cost
        self.soc = soc
        self.prefill_npu_share = best_npu_share(soc, cost.prefill(profile_tokens, 0))
        self.decode_npu_share = best_npu_share(soc, cost.decode([profile_tokens]))

    def step_time_s(self, chunks: Sequence[tuple[int, int]], num_decode: int,
                    kv_tokens: int) -> float:
        op = self.cost.step(chunks, num_decode, kv_tokens)
        share = self.prefill_npu_share if chunks else self.decode_npu_share
        return max(concurrent_s(self.soc, split_parts(op, share)))

    def decode_step_times_s(self, num_decode: int, kv_tokens: np.ndarray) -> np.ndarray:
        return np.array([self.step_time_s((), num_decode, int(kv)) for kv in kv_tokens])
