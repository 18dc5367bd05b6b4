"""Transformer architecture spec: dense GQA (Llama, Qwen2), MoE (Mixtral, Qwen3-MoE) and
DeepSeek-V3's MLA + MoE (DeepSeek-V3 technical report, arXiv:2412.19437, section 2.1).

Sharding follows vLLM tensor parallelism: attention heads, MLP/expert intermediate dims and the
vocabulary are split across ``tp`` ranks; KV heads are replicated when ``tp > num_kv_heads``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetsim.models.quantization import QuantMode


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Architecture numbers needed for memory and step-time modelling."""

    name: str
    """Display name, e.g. ``"Llama-3.1-8B"``."""
    num_layers: int
    """Decoder layers."""
    hidden_size: int
    """Residual stream width."""
    num_attention_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (GQA); equal to query heads for MHA and for MLA."""
    head_dim: int
    """Query/key head width (for MLA: qk_nope_head_dim + qk_rope_head_dim)."""
    intermediate_size: int
    """Dense MLP width (SwiGLU, three matrices); for MoE models the dense layers' width."""
    gated_mlp: bool = True
    """The dense MLP is gated (SwiGLU: gate, up and down matrices, as Llama and Qwen); False
    for a plain two-matrix MLP (fc1, activation, fc2, as OPT and GPT-2)."""
    vocab_size: int
    """Vocabulary size (embedding and LM head rows)."""
    max_context_tokens: int
    """Longest supported sequence (max_position_embeddings)."""
    weight_dtype_bytes: int = 2
    """Bytes per weight: 2 for bf16, 1 for fp8."""
    kv_dtype_bytes: int = 2
    """Bytes per KV-cache element (bf16 cache by default, as vLLM's kv_cache_dtype=auto)."""
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    num_experts_per_token: int = 0
    """Routed experts each token visits (top-k)."""
    moe_intermediate_size: int = 0
    """Width of one expert's SwiGLU MLP."""
    num_shared_experts: int = 0
    """Always-on experts per MoE layer (DeepSeek), each ``moe_intermediate_size`` wide."""
    num_dense_layers: int = 0
    """Leading layers with a dense MLP instead of MoE (DeepSeek first_k_dense_replace)."""
    kv_lora_rank: int = 0
    """MLA compressed KV width; 0 means standard (GQA/MHA) attention."""
    q_lora_rank: int = 0
    """MLA compressed query width (0: direct query projection)."""
    qk_nope_head_dim: int = 0
    """MLA per-head non-rotary query/key width."""
    qk_rope_head_dim: int = 0
    """MLA per-head rotary width (the decoupled RoPE key is cached once per token)."""
    v_head_dim: int = 0
    """MLA per-head value width."""
    quantization: QuantMode | None = None
    """How the linear layers are quantized when served (``models.quantization.quantize``);
    None: the checkpoint's own dtype, ``weight_dtype_bytes`` for every weight."""

    def __post_init__(self) -> None:
        for field in (
            "num_layers",
            "hidden_size",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
            "max_context_tokens",
            "weight_dtype_bytes",
            "kv_dtype_bytes",
        ):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.num_experts and not 0 < self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"num_experts_per_token must be in 1..{self.num_experts}, "
                f"got {self.num_experts_per_token}"
            )
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise ValueError("moe_intermediate_size must be > 0 for an MoE model")
        if not 0 <= self.num_dense_layers <= self.num_layers:
            raise ValueError(
                f"num_dense_layers must be in 0..{self.num_layers}, got {self.num_dense_layers}"
            )

    @property
    def dense_mlp_matrices(self) -> int:
        """Weight matrices of one dense MLP: 3 gated (SwiGLU), 2 plain."""
        return 3 if self.gated_mlp else 2

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0

    # ---- per-layer weight counts (elements), for ``tp`` ranks, per rank ----

    def attention_params_per_gpu(self, tp: int = 1) -> int:
        """Attention weights of one layer held by one TP rank (elements)."""
        h = self.hidden_size
        heads = _ceil_div(self.num_attention_heads, tp)
        if self.uses_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            # The down-projections (q_a, kv_a) are replicated in vLLM; up-projections are split.
            q = (
                h * self.q_lora_rank + self.q_lora_rank * heads * qk
                if self.q_lora_rank
                else h * heads * qk
            )
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * heads * (
                self.qk_nope_head_dim + self.v_head_dim
            )
            return q + kv + heads * self.v_head_dim * h
        kv_heads = _ceil_div(self.num_kv_heads, tp)  # replicated when tp > num_kv_heads
        return h * heads * self.head_dim * 2 + 2 * h * kv_heads * self.head_dim

    def mlp_params_per_gpu(self, tp: int = 1) -> int:
        """MLP (dense) or expert weights of all layers held by one TP rank (elements)."""
        h = self.hidden_size
        dense = self.dense_mlp_matrices * h * _ceil_div(self.intermediate_size, tp)
        if not self.is_moe:
            return self.num_layers * dense
        experts = self.num_experts + self.num_shared_experts
        moe = 3 * h * _ceil_div(self.moe_intermediate_size, tp) * experts + h * self.num_experts
        return self.num_dense_layers * dense + self.num_moe_layers * moe

    def embedding_params_per_gpu(self, tp: int = 1) -> int:
        """Embedding plus LM head (vocab-parallel in vLLM), per rank (elements)."""
        rows = _ceil_div(self.vocab_size, tp)
        return rows * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """Total parameters (norms included, MTP/draft layers excluded)."""
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        return (
            self.num_layers * self.attention_params_per_gpu(1)
            + self.mlp_params_per_gpu(1)
            + self.embedding_params_per_gpu(1)
            + norms
        )

    @property
    def num_active_params(self) -> int:
        """Parameters one token touches (routed experts counted top-k times)."""
        if not self.is_moe:
            return self.num_params
        skipped = (self.num_experts - self.num_experts_per_token) * 3 * self.hidden_size
        return self.num_params - self.num_moe_layers * skipped * self.moe_intermediate_size

    def weight_bytes_per_gpu(self, tp: int = 1) -> int:
        """Weight bytes resident on one TP rank."""
        if self.quantization is not None:
            return self._quantized_weight_bytes_per_gpu(tp, self.quantization)
        elems = (
            self.num_layers * self.attention_params_per_gpu(tp)
            + self.mlp_params_per_gpu(tp)
            + self.embedding_params_per_gpu(tp)
        )
        # Norms and embeddings stay in 16-bit even in fp8 checkpoints; counted at dtype size,
        # a <1% error for the models we ship.
        return elems * self.weight_dtype_bytes + (2 * self.num_layers + 1) * self.hidden_size * 2

    def _quantized_weight_bytes_per_gpu(self, tp: int, q: QuantMode) -> int:
        """Linear layers at the mode's bits (dense and routed experts apart); embeddings, LM
        head, norms and routers in 16 bits, as vLLM's quantizers leave them."""
        h = self.hidden_size
        experts = routers = 0
        if self.is_moe:
            inter = _ceil_div(self.moe_intermediate_size, tp)
            experts = self.num_moe_layers * 3 * h * inter * self.num_experts
            routers = self.num_moe_layers * h * self.num_experts
        dense = (self.num_layers * self.attention_params_per_gpu(tp)
                 + self.mlp_params_per_gpu(tp) - experts - routers)
        sixteen_bit = (self.embedding_params_per_gpu(tp) + routers
                       + (2 * self.num_layers + 1) * h)
        return int(dense * q.dense.weight_bytes + experts * q.experts.weight_bytes
                   + sixteen_bit * 2)

    def kv_bytes_per_token_per_gpu(self, tp: int = 1) -> int:
        """KV-cache bytes one token occupies on one TP rank, all layers.

        GQA/MHA: K and V, ``num_kv_heads / tp`` heads (at least 1: replicated past that).
        MLA: the compressed latent plus the shared RoPE key, replicated on every rank.
        """
        if self.uses_mla:
            latent = self.kv_lora_rank + self.qk_rope_head_dim
            return self.num_layers * latent * self.kv_dtype_bytes
        kv_heads = _ceil_div(self.num_kv_heads, tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * self.kv_dtype_bytes
