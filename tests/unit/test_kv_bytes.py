"""One KV-bytes function, on the model: every KV copy, the transfer costs and the SoC's DDR
traffic use ``ModelSpec.kv_bytes_per_token`` (MLA and the KV dtype included)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fleetsim.models import get_model
from fleetsim.perf.soc import KV_DTYPE_BYTES, ModelCost


@pytest.mark.parametrize("name", ["llama-3.1-8b", "DeepSeek-V3", "Llama-3.2-3B"])
def test_unsharded_kv_bytes_is_one_ranks_at_tp1(name):
    m = get_model(name)
    assert m.kv_bytes_per_token() == m.kv_bytes_per_token_per_gpu(1) > 0


def test_kv_dtype_scales_the_bytes_and_can_be_overridden():
    m = get_model("llama-3.1-8b")
    assert m.kv_bytes_per_token() == 131072  # 2 * 32 layers * 8 heads * 128 * 2 B
    fp8 = replace(m, kv_dtype_bytes=1)
    assert fp8.kv_bytes_per_token() == 65536
    assert fp8.kv_bytes_per_token(kv_dtype_bytes=2) == m.kv_bytes_per_token()
    assert m.kv_bytes_per_token_per_gpu(8, kv_dtype_bytes=1) == 131072 // 8 // 2


def test_soc_kv_traffic_is_the_models_at_fp16():
    gqa = get_model("Llama-3.2-3B")
    # GQA: what the SoC's own formula gave (K and V of every KV head, FP16).
    expected = 2 * gqa.num_layers * gqa.num_kv_heads * gqa.head_dim * 2
    assert ModelCost(gqa, 4.5).kv_bytes_per_token == expected
    # MLA: the compressed latent and RoPE key, not K and V per head.
    mla = get_model("DeepSeek-V3")
    cost = ModelCost(mla, 4.5)
    assert cost.kv_bytes_per_token == mla.num_layers * (512 + 64) * KV_DTYPE_BYTES
    # The SoC runtime keeps an FP16 cache whatever the checkpoint's KV dtype.
    assert ModelCost(replace(gqa, kv_dtype_bytes=1), 4.5).kv_bytes_per_token == expected
