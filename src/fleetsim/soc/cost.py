"""FLOPs and DDR bytes of one LLM operation (a prefill chunk or a decode step), and its time
on one accelerator: the roofline ``max(flops / (peak * eff), bytes / bandwidth)``.

Weights are weight-only quantised (``bits_per_weight``; 4.5 is llama.cpp's Q4_0: 18 bytes per
32 weights), computed in FP16; the KV cache is FP16. Every forward pass streams the decoder
weights and the LM head once (the embedding table is gathered, not streamed), reads the KV
of the context and writes the new tokens' KV. Activations stay in on-chip memory and the
SoC's shared cache and are not counted (at most a few MB per chunk against GBs of weights).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.models import ModelSpec
from fleetsim.soc.device import AcceleratorSpec

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


@dataclass(frozen=True, slots=True)
class ModelCost:
    """A model at a weight precision: the per-token constants the op costs are built from."""

    model: ModelSpec
    bits_per_weight: float

    def __post_init__(self) -> None:
        if not 1 <= self.bits_per_weight <= 16:
            raise ValueError(f"bits_per_weight must be in [1, 16], got {self.bits_per_weight}")

    @property
    def streamed_params(self) -> int:
        """Weights read by every forward pass: decoder layers plus the LM head."""
        m = self.model
        return (m.num_layers * m.attention_params_per_gpu(1) + m.mlp_params_per_gpu(1)
                + m.vocab_size * m.hidden_size)

    @property
    def weight_bytes(self) -> float:
        return self.streamed_params * self.bits_per_weight / 8

    @property
    def kv_bytes_per_token(self) -> int:
        """The model's KV bytes per token (MLA's latent included), held in FP16 here."""
        return self.model.kv_bytes_per_token(kv_dtype_bytes=KV_DTYPE_BYTES)

    def _attention_flops(self, num_query: int, context: float) -> float:
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add, per query head and layer
        m = self.model
        return 4.0 * num_query * context * m.num_attention_heads * m.head_dim * m.num_layers

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
        flops = 2.0 * batch * self.streamed_params + self._attention_flops(1, 1) * total
        kv = self.kv_bytes_per_token * (total + batch)
        return OpCost(flops, self.weight_bytes + kv)


def compute_s(acc: AcceleratorSpec, cost: OpCost) -> float:
    """Time the op's arithmetic takes on ``acc`` at its achieved FLOP rate."""
    return cost.flops / (acc.peak_fp16_flops * acc.compute_eff)


def op_s(acc: AcceleratorSpec, cost: OpCost, bw_bytes_per_s: float) -> float:
    """Roofline time of the op on ``acc`` when it gets ``bw_bytes_per_s`` of DDR."""
    return max(compute_s(acc, cost), cost.bytes / bw_bytes_per_s)


def demand_bytes_per_s(acc: AcceleratorSpec, cost: OpCost, max_draw: float) -> float:
    """The bandwidth the op draws when unconstrained: all it can take if memory-bound, just
    enough to keep its arithmetic fed if compute-bound."""
    t_compute = compute_s(acc, cost)
    if t_compute <= 0:
        return max_draw
    return min(max_draw, cost.bytes / t_compute)
