"""Model catalog, derived sizes and the Hugging Face config.json loader."""

from __future__ import annotations

import json

import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.models import ModelSpec, get_model, list_models

REQUIRED = (
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Llama-2-7B",
    "Llama-2-70B",
    "Qwen2.5-72B",
    "Mixtral-8x7B",
    "Qwen3-235B-A22B",
    "DeepSeek-V3",
)


def test_catalog_has_required_models():
    assert set(REQUIRED) <= {m.name for m in list_models()}


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("Llama-3.1-8B", 8.03),
        ("Llama-3.1-70B", 70.6),
        ("Llama-2-7B", 6.74),
        ("Mixtral-8x7B", 46.7),
        ("Qwen3-235B-A22B", 235.1),
        ("DeepSeek-V3", 671.0),
        ("OPT-13B", 12.85),  # facebook/opt-13b: 12.85B with its biases, which we omit
        ("OPT-66B", 65.7),  # facebook/opt-66b (OPT paper, arXiv:2205.01068, Table 1: 66B)
    ],
)
def test_param_counts_match_published_sizes(name, billions):
    assert get_model(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_active_params_of_moe():
    assert get_model("Qwen3-235B-A22B").num_active_params / 1e9 == pytest.approx(22.2, rel=0.02)
    assert get_model("DeepSeek-V3").num_active_params / 1e9 == pytest.approx(37.5, rel=0.03)


def test_lookup_is_case_insensitive():
    assert get_model("llama-3.1-8b").name == "Llama-3.1-8B"
    assert get_model("MIXTRAL-8X7B").is_moe


def test_unknown_model_lists_catalog():
    with pytest.raises(FleetsimInputError, match="Llama-3.1-8B"):
        get_model("gpt-5")


def test_kv_bytes_per_token_llama31_8b():
    m = get_model("Llama-3.1-8B")
    assert m.kv_bytes_per_token_per_gpu(1) == 131072  # 2 * 32 layers * 8 heads * 128 * 2 B
    assert m.kv_bytes_per_token_per_gpu(8) == 131072 // 8
    assert m.kv_bytes_per_token_per_gpu(16) == 131072 // 8  # KV heads replicated past tp=8


def test_kv_bytes_per_token_mla():
    m = get_model("DeepSeek-V3")
    assert m.uses_mla
    assert m.kv_bytes_per_token_per_gpu(1) == 61 * (512 + 64) * 2
    assert m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token_per_gpu(1)  # replicated


def test_weight_bytes_shard_with_tp():
    m = get_model("Llama-3.1-70B")
    assert m.weight_bytes_per_gpu(1) / 1e9 == pytest.approx(141.1, rel=0.01)
    assert m.weight_bytes_per_gpu(4) == pytest.approx(m.weight_bytes_per_gpu(1) / 4, rel=0.01)


def test_modelspec_validates():
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelSpec(
            name="x",
            num_layers=2,
            hidden_size=64,
            num_attention_heads=6,
            num_kv_heads=4,
            head_dim=8,
            intermediate_size=128,
            vocab_size=100,
            max_context_tokens=128,
        )


LLAMA_CFG = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def test_hf_config_llama(tmp_path):
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_CFG))
    m = get_model(str(path))
    assert m.name == "my-llama"
    ref = get_model("Llama-3.1-8B")
    assert m.kv_bytes_per_token_per_gpu(1) == ref.kv_bytes_per_token_per_gpu(1)
    assert m.num_params == ref.num_params
    assert get_model(str(path.parent)).num_params == ref.num_params  # a directory works too


def test_hf_config_moe_and_mla(tmp_path):
    mix = dict(
        LLAMA_CFG,
        model_type="mixtral",
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        max_position_embeddings=32768,
    )
    p = tmp_path / "mixtral.json"
    p.write_text(json.dumps(mix))
    assert get_model(str(p)).num_params == get_model("Mixtral-8x7B").num_params
    ds = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_attention_heads": 128,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "quantization_config": {"quant_method": "fp8"},
    }
    p2 = tmp_path / "dsv3.json"
    p2.write_text(json.dumps(ds))
    m = get_model(str(p2))
    ref = get_model("DeepSeek-V3")
    assert (m.num_params, m.weight_dtype_bytes, m.kv_bytes_per_token_per_gpu(1)) == (
        ref.num_params,
        1,
        ref.kv_bytes_per_token_per_gpu(1),
    )


def test_hf_config_missing_key_names_file_and_key(tmp_path):
    bad = dict(LLAMA_CFG)
    del bad["num_hidden_layers"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(FleetsimInputError, match=r"bad.json.*num_hidden_layers"):
        get_model(str(path))


def test_hf_config_not_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(FleetsimInputError, match="config.json"):
        get_model(str(path))


def test_plain_mlp_has_two_matrices_and_prices_fewer_flops_than_gated():
    """OPT's fc1/fc2 MLP: two matrices, so the step model's MLP GEMMs and the weights are
    two thirds of a SwiGLU MLP of the same width."""
    import dataclasses

    from fleetsim.hardware import get_gpu
    from fleetsim.perf import build_step_model

    opt = get_model("opt-13b")
    assert not opt.gated_mlp and opt.dense_mlp_matrices == 2
    gated = dataclasses.replace(opt, gated_mlp=True)
    assert opt.mlp_params_per_gpu() * 3 == gated.mlp_params_per_gpu() * 2
    gpu = get_gpu("a100")
    plain_s = build_step_model(opt, gpu, 1).step_time_s([(2048, 0)], 0, 0)
    gated_s = build_step_model(gated, gpu, 1).step_time_s([(2048, 0)], 0, 0)
    assert plain_s < gated_s
