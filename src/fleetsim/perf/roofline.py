"""Roofline-with-efficiency kernel times: ``max(flops / (peak * eff), bytes / (bw * eff))``.

Used when no measured table covers a GPU or shape (e.g. H20). Efficiencies are typical achieved
fractions of datasheet peaks, not fits to our validation data:

- GEMM compute 0.70: cuBLAS BF16 GEMMs of LLM shapes reach ~600-700 TFLOP/s of 989 on H100
  (the aiconfigurator-core H100 table reads 0.72 of peak at 8192^3, 0.84 at 4096^3).
- Attention compute 0.50: FlashAttention-2 reaches 50-73% of peak forward on A100 (Dao 2023,
  arXiv:2307.08691, fig. 5); FlashAttention-3 ~75% on H100 (arXiv:2407.08608) for long
  sequences; serving mixes short sequences, so we take the low end.
- Memory 0.80 (GEMM/elementwise) and 0.70 (attention KV reads, paged): STREAM-like copies reach
  ~90% of HBM peak; paged decode kernels less.
- All-reduce: ring algorithm moves ``2 (tp-1)/tp * bytes`` per GPU (Patarasuk & Yuan 2009) at
  0.70 of NVLink one-way bandwidth plus ~10 us latency (nccl-tests small-message latency).
- Every kernel costs at least ``KERNEL_FLOOR_S`` (launch + tail), ~4 us as seen at m=1 in the
  measured GEMM tables.
"""

from __future__ import annotations

GEMM_COMPUTE_EFF = 0.70
GEMM_MEMORY_EFF = 0.80
ATTN_COMPUTE_EFF = 0.50
ATTN_MEMORY_EFF = 0.70
MOE_COMPUTE_EFF = 0.50
ALLREDUCE_BW_EFF = 0.70
ALLREDUCE_LATENCY_S = 10e-6
KERNEL_FLOOR_S = 4e-6


def gemm_s(
    m: float,
    n: float,
    k: float,
    peak_flops: float,
    bw_bytes_per_s: float,
    weight_bytes: float = 2.0,
    act_bytes: float = 2.0,
) -> float:
    """(m x k) @ (k x n): 2mnk FLOPs; reads weights k*n and activations m*k, writes m*n."""
    flops = 2.0 * m * n * k
    bytes_moved = k * n * weight_bytes + (m * k + m * n) * act_bytes
    return max(
        flops / (peak_flops * GEMM_COMPUTE_EFF),
        bytes_moved / (bw_bytes_per_s * GEMM_MEMORY_EFF),
        KERNEL_FLOOR_S,
    )


def attention_s(flops: float, kv_bytes: float, peak_flops: float, bw_bytes_per_s: float) -> float:
    return max(
        flops / (peak_flops * ATTN_COMPUTE_EFF),
        kv_bytes / (bw_bytes_per_s * ATTN_MEMORY_EFF),
        KERNEL_FLOOR_S,
    )


def grouped_gemm_s(
    flops: float, bytes_moved: float, peak_flops: float, bw_bytes_per_s: float
) -> float:
    return max(
        flops / (peak_flops * MOE_COMPUTE_EFF),
        bytes_moved / (bw_bytes_per_s * GEMM_MEMORY_EFF),
        KERNEL_FLOOR_S,
    )


def allreduce_s(message_bytes: float, tp: int, link_bw_bytes_per_s: float) -> float:
    """Ring all-reduce of ``message_bytes`` across ``tp`` GPUs."""
    if tp <= 1:
        return 0.0
    moved = 2.0 * (tp - 1) / tp * message_bytes
    return ALLREDUCE_LATENCY_S + moved / (link_bw_bytes_per_s * ALLREDUCE_BW_EFF)

