"""What moving KV or queries between GPUs and a host costs, in the units the KV-pool routers
take (``policies/mooncake.py``'s ``store_token_cost``, ``policies/tokenlake.py``'s
``query_bytes_per_token``): from the model's config and the GPU's datasheet, no measured
efficiency."""

from __future__ import annotations

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec

ACTIVATION_BYTES = 2
"""BF16 queries and attention outputs."""


def store_token_cost(model: ModelSpec, gpu: GPUSpec) -> float:
    """Loading one token's KV from host memory over PCIe, in prefill tokens: KV bytes per
    token / the GPU's PCIe bandwidth, over a token's prefill at the BF16 roofline (2 FLOPs per
    parameter / peak BF16 FLOP/s). No measured efficiency, so it overstates the load's
    relative cost by the prefill's shortfall from the peak."""
    load_s = model.kv_bytes_per_token() / gpu.pcie_bw_bytes_per_s
    return load_s / (2.0 * model.num_params / gpu.peak_flops("bf16"))


def query_bytes_per_token(model: ModelSpec, activation_bytes: int = ACTIVATION_BYTES) -> float:
    """What shipping one new token's query to the replica holding its KV moves, all layers:
    the query out and the attention output back (``num_attention_heads x head_dim`` each;
    the model's config.json)."""
    return (2.0 * model.num_attention_heads * model.head_dim * model.num_layers
            * activation_bytes)
