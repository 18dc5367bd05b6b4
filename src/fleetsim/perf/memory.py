"""KV-cache capacity of one replica, as vLLM sizes it at start-up.

vLLM (v1 ``Worker.determine_available_memory``) profiles a dummy forward pass of
``max_num_batched_tokens`` tokens, then gives the KV cache
``total_memory * gpu_memory_utilization - weights - peak activations - non-torch memory``.
We estimate the profiled peak instead of measuring it; see ``activation_reserve_bytes``.
"""

from __future__ import annotations

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec

NON_TORCH_BYTES = 1.5e9
"""CUDA context, NCCL buffers and CUDA-graph pools vLLM counts outside torch (~1-2 GB)."""
MAX_NUM_SEQS = 256
"""vLLM's default ``max_num_seqs``: the sampler's float32 logits are sized for it."""


def activation_reserve_bytes(model: ModelSpec, tp: int, max_batched_tokens: int = 8192) -> float:
    """Peak activation bytes of vLLM's profiling forward pass, per GPU.

    The largest live tensors of one layer are the fused gate/up output (2 * intermediate / tp
    per token; intermediate / tp for a plain MLP) and its activated half, next to the
    residual and QKV buffers; the sampler adds float32 logits for ``MAX_NUM_SEQS``
    sequences. Activations are bf16.
    """
    inter = -(
        -(
            model.moe_intermediate_size * model.num_experts_per_token
            if model.is_moe
            else model.intermediate_size
        )
        // tp
    )
    heads = -(-model.num_attention_heads // tp)
    qkv = (heads + 2 * -(-model.num_kv_heads // tp)) * model.head_dim
    mlp = 3 if model.is_moe or model.gated_mlp else 2  # gate/up output + activated half
    per_token = (mlp * inter + 4 * model.hidden_size + qkv) * 2
    logits = MAX_NUM_SEQS * model.vocab_size * 4
    return max_batched_tokens * per_token + logits + NON_TORCH_BYTES


def kv_capacity_blocks(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    block_size: int,
    gpu_memory_utilization: float = 0.9,
    *,
    max_batched_tokens: int = 8192,
) -> int:
    """KV blocks (of ``block_size`` tokens) one replica of ``tp`` GPUs can hold.

    Every rank holds its shard of every block, so the replica's block count is one GPU's.
    Raises ``FleetsimInputError`` when the weights and activations do not fit.
    """
    if block_size <= 0:
        raise FleetsimInputError("block_size", block_size, "must be a positive number of tokens")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise FleetsimInputError(
            "gpu_memory_utilization", gpu_memory_utilization, "must be in (0, 1], e.g. 0.9"
        )
    budget = gpu.hbm_bytes * gpu_memory_utilization
    weights = model.weight_bytes_per_gpu(tp)
    free = budget - weights - activation_reserve_bytes(model, tp, max_batched_tokens)
    block_bytes = block_size * model.kv_bytes_per_token_per_gpu(tp)
    if free >= block_bytes:
        return int(free // block_bytes)
    # Say which knob is at fault: the weights (tp, GPU), the step budget's activations, or
    # the block size itself.
    small_block = 16 * model.kv_bytes_per_token_per_gpu(tp)
    if budget - weights - activation_reserve_bytes(model, tp, 1) < small_block:
        raise FleetsimInputError(
            "tp",
            tp,
            f"{model.name} needs {weights / 1e9:.1f} GB of weights per GPU at tp={tp} but "
            f"{gpu.name} offers {budget / 1e9:.1f} GB at gpu_memory_utilization="
            f"{gpu_memory_utilization}; use a larger tp (more GPUs per replica), pipeline "
            f"stages (pp, across nodes when tp fills one) or a bigger GPU",
        )
    if free < small_block:
        raise FleetsimInputError(
            "engine.max_batched_tokens",
            max_batched_tokens,
            f"the activations of a {max_batched_tokens}-token step leave no KV memory on "
            f"{gpu.name} (tp={tp}); lower it",
        )
    raise FleetsimInputError(
        "engine.block_size",
        block_size,
        f"one {block_size}-token KV block takes {block_bytes / 1e9:.2f} GB, more than the "
        f"{max(free, 0.0) / 1e9:.2f} GB left for KV on {gpu.name} (tp={tp}); use a smaller "
        f"block (vLLM uses 16)",
    )
