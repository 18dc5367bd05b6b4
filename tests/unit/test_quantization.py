"""Quantization and the FP8 KV cache: modes, memory, table lookup or roofline, bad combinations."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import ModelSpec, get_model
from fleetsim.models.quantization import QUANT_MODES, modes_for, quant_mode, quantize
from fleetsim.perf import build_step_model, kv_capacity_blocks
from fleetsim.perf.memory import activation_reserve_bytes
from fleetsim.perf.ops import OpTimes
from fleetsim.search.deploy import vllm_serve_commands
from fleetsim.search.plan import enumerate_shapes

LLAMA = get_model("llama-3.1-8b")
# gpt-oss-20b's MoE shape (openai/gpt-oss-20b config.json): the shape aiconfigurator-core
# measured w4a16_mxfp4 experts at
GPT_OSS_20B = ModelSpec(name="gpt-oss-20b", num_layers=24, hidden_size=2880,
                        num_attention_heads=64, num_kv_heads=8, head_dim=64,
                        intermediate_size=2880, vocab_size=201088, max_context_tokens=131072,
                        num_experts=32, num_experts_per_token=4, moe_intermediate_size=2880)


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_defaults_return_the_model_itself():
    """Default settings must not even copy the model: default runs stay bit-identical."""
    assert quantize(LLAMA, None, "auto") is LLAMA
    assert quantize(LLAMA, None, "bfloat16") is LLAMA
    fp8 = quantize(LLAMA, "fp8", "fp8")
    assert quantize(fp8, "fp8", "fp8") == fp8  # idempotent
    assert fp8.quantization is QUANT_MODES["fp8"] and fp8.kv_dtype_bytes == 1


def test_vllm_method_names_map_onto_modes():
    assert quant_mode("awq").name == "int4_wo"
    assert quant_mode("modelopt_fp4").name == "nvfp4"
    assert quant_mode("mxfp4").name == "w4a16_mxfp4"
    with pytest.raises(FleetsimInputError, match="unknown mode"):
        quant_mode("fp9")


def test_weight_memory_follows_the_mode():
    """Linear layers at the mode's bits; embeddings, LM head and norms stay 16-bit."""
    emb = LLAMA.embedding_params_per_gpu(1)
    norms = (2 * LLAMA.num_layers + 1) * LLAMA.hidden_size
    linear = LLAMA.num_params - emb - norms
    assert LLAMA.weight_bytes_per_gpu(1) == LLAMA.num_params * 2
    assert quantize(LLAMA, "fp8").weight_bytes_per_gpu(1) == linear + 2 * (emb + norms)
    assert quantize(LLAMA, "int4_wo").weight_bytes_per_gpu(1) == int(
        linear * 4.125 / 8 + 2 * (emb + norms))
    assert quantize(LLAMA, "nvfp4").weight_bytes_per_gpu(1) == int(
        linear * 4.5 / 8 + 2 * (emb + norms))


def test_experts_only_modes_quantize_only_the_experts():
    m = GPT_OSS_20B
    experts = m.num_moe_layers * 3 * m.hidden_size * m.moe_intermediate_size * m.num_experts
    q = quantize(m, "w4a16_mxfp4")
    assert m.weight_bytes_per_gpu(1) - q.weight_bytes_per_gpu(1) == pytest.approx(
        experts * (2 - 4.25 / 8), abs=1)
    with pytest.raises(FleetsimInputError, match="MoE experts only"):
        quantize(LLAMA, "w4a16_mxfp4")


def test_fp8_kv_cache_doubles_kv_capacity():
    gpu = get_gpu("h100")
    bf16 = kv_capacity_blocks(LLAMA, gpu, 1, 16)
    fp8 = kv_capacity_blocks(quantize(LLAMA, None, "fp8"), gpu, 1, 16)
    free = gpu.hbm_bytes * 0.9 - LLAMA.weight_bytes_per_gpu(1) - activation_reserve_bytes(
        LLAMA, 1)
    assert fp8 == int(free // (16 * LLAMA.kv_bytes_per_token_per_gpu(1) / 2))
    assert 2 * bf16 <= fp8 <= 2 * bf16 + 1


def test_fp8_weights_free_memory_for_kv():
    gpu = get_gpu("h100")
    saved = LLAMA.weight_bytes_per_gpu(1) - quantize(LLAMA, "fp8").weight_bytes_per_gpu(1)
    extra = (kv_capacity_blocks(quantize(LLAMA, "fp8"), gpu, 1, 16)
             - kv_capacity_blocks(LLAMA, gpu, 1, 16))
    assert extra == pytest.approx(saved / (16 * LLAMA.kv_bytes_per_token_per_gpu(1)), abs=1)


@pytest.mark.parametrize(("gpu", "mode", "op", "tag"), [
    ("h100", "fp8", "gemm", "(fp8)"),
    ("h200", "fp8_block", "gemm", "(fp8_block)"),
    ("b200", "nvfp4", "gemm", "(nvfp4)"),
])
def test_measured_tables_price_the_mode(gpu, mode, op, tag):
    sm = build_step_model(quantize(LLAMA, mode), get_gpu(gpu), 1)
    assert any(part.startswith("measured:") and part.endswith(tag)
               for part in sm.sources[op].split(" + ")), sm.sources[op]


@pytest.mark.parametrize(("model", "mode", "tag"), [
    (get_model("mixtral-8x7b"), "fp8", "(fp8)"),
    (get_model("qwen3-235b-a22b"), "fp8_block", "(fp8_block)"),
    (GPT_OSS_20B, "w4a16_mxfp4", "(w4a16_mxfp4)"),
])
def test_measured_moe_tables_price_the_mode(model, mode, tag):
    sm = build_step_model(quantize(model, mode), get_gpu("h100"), 1)
    assert sm.sources["moe"].startswith("measured:") and sm.sources["moe"].endswith(tag)


def test_modes_without_tables_fall_back_to_a_roofline_with_their_bytes():
    """No vLLM table measures int8_wo/int4_wo GEMMs or sq: roofline, said in the sources,
    priced with the mode's weight bytes (memory-bound decode) and compute format."""
    gpu = get_gpu("h100")
    sm = build_step_model(quantize(LLAMA, "int4_wo"), gpu, 1)
    assert "roofline (4.125-bit weights, bf16 compute)" in sm.sources["gemm"]
    m1 = np.array([1.0])
    n, k = 14336, 4096
    t = {q: OpTimes(quantize(LLAMA, q), gpu, 1, use_tables=False).gemm_s(m1, n, k)[0]
         for q in (None, "int8_wo", "int4_wo")}
    weights = {None: 16, "int8_wo": 8, "int4_wo": 4.125}
    for q in ("int8_wo", "int4_wo"):  # memory bound: time ~ bytes moved (weights dominate)
        assert t[q] / t[None] == pytest.approx(weights[q] / 16, rel=0.01)
    big = np.array([16384.0])  # compute bound: the format's peak, not the weights' size
    tc = {q: OpTimes(quantize(LLAMA, q), gpu, 1, use_tables=False).gemm_s(big, n, k)[0]
          for q in (None, "int8_wo", "sq", "fp8")}
    assert tc["int8_wo"] == pytest.approx(tc[None])
    assert tc["sq"] == pytest.approx(tc[None] * gpu.peak_bf16_flops / gpu.peak_int8_ops)
    assert tc["fp8"] == pytest.approx(tc[None] * gpu.peak_bf16_flops / gpu.peak_fp8_flops)


def test_moe_roofline_uses_the_experts_bits():
    gpu = get_gpu("h20")  # no tables: roofline everywhere
    tokens = np.array([1.0])
    bf16 = OpTimes(GPT_OSS_20B, gpu, 1, use_tables=True).moe_s(tokens)[0]
    mx = OpTimes(quantize(GPT_OSS_20B, "w4a16_mxfp4"), gpu, 1, use_tables=True).moe_s(tokens)[0]
    assert mx / bf16 == pytest.approx(4.25 / 16, rel=0.02)


def test_fp8_kv_cache_uses_the_fp8_attention_rows_or_halves_the_roofline_reads():
    h100 = build_step_model(quantize(LLAMA, None, "fp8"), get_gpu("h100"), 1)
    assert h100.sources["attention"].count("(kv fp8)") == 2
    assert "measured" in h100.sources["attention"]
    # A100 tables have no FP8-cache rows: roofline, reading half the bytes per token
    a100 = build_step_model(quantize(LLAMA, None, "fp8"), get_gpu("a100"), 1)
    assert a100.sources["attention"] == "roofline (kv fp8)"
    bf16 = build_step_model(LLAMA, get_gpu("a100"), 1, "roofline")
    fp8 = build_step_model(quantize(LLAMA, None, "fp8"), get_gpu("a100"), 1, "roofline")
    assert fp8._dec_c.at(64) == pytest.approx(bf16._dec_c.at(64) / 2)


def test_gpu_modes_follow_the_datasheets():
    assert "fp8" not in modes_for(get_gpu("a100").compute_formats)
    assert "int4_wo" in modes_for(get_gpu("a100").compute_formats)
    for name in ("h100", "h200", "l40s", "h20"):
        modes = modes_for(get_gpu(name).compute_formats)
        assert "fp8" in modes and "nvfp4" not in modes
    for name in ("b200", "gb200"):
        assert "nvfp4" in modes_for(get_gpu(name).compute_formats)


def test_gpus_command_lists_the_modes(capsys):
    code, out, _ = run_cli(capsys, "gpus", "--format", "json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert "fp8" not in rows["A100-80GB-SXM"]["quantization_modes"]
    assert "nvfp4" in rows["B200"]["quantization_modes"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "quantization=fp8", "--set", "hardware.gpu=a100"], "no FP8 tensor cores"),
    (["--set", "quantization=nvfp4"], "FP4 is Blackwell-only"),
    (["--set", "quantization=fp9"], "unknown mode"),
    (["--set", "quantization=w4a16_mxfp4"], "MoE experts only"),
    (["--set", "engine.kv_cache_dtype=int8"], "engine.kv_cache_dtype"),
])
def test_bad_combinations_are_one_line_exit_2(tmp_path, capsys, args, needle):
    code, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"), *args)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "needle"), [
    (["--gpu", "a100", "--quantization", "fp8"], "--quantization: got 'fp8'"),
    (["--gpu", "h100", "--kv-cache-dtype", "int4"], "--kv-cache-dtype: got 'int4'"),
])
def test_perf_flags_refuse_bad_combinations(capsys, args, needle):
    code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--decode-batch", "8",
                           "--context", "100", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert needle in err


def test_perf_prices_the_quantized_step(capsys):
    base = ["perf", "--model", "llama-3.1-8b", "--gpu", "h100", "--decode-batch", "64",
            "--context", "2000", "--format", "json"]
    _, out, _ = run_cli(capsys, *base)
    _, out8, _ = run_cli(capsys, *base, "--quantization", "fp8", "--kv-cache-dtype", "fp8")
    bf16, fp8 = json.loads(out), json.loads(out8)
    assert "quantization" not in bf16 and "kv_cache_dtype" not in bf16
    assert fp8["quantization"] == "fp8" and fp8["kv_cache_dtype"] == "fp8"
    assert fp8["total_s"] < bf16["total_s"]
    assert fp8["ops"]["gemm"]["source"].endswith("(fp8)")


def test_vllm_serve_lines_carry_the_flags():
    shape = enumerate_shapes(["h100"], [1], 1)[0]
    (plain,) = vllm_serve_commands(load_config(None, []), shape.pools)
    assert "--quantization" not in plain and "--kv-cache-dtype" not in plain
    config = load_config(None, ["quantization=nvfp4", "engine.kv_cache_dtype=fp8"])
    (line,) = vllm_serve_commands(config, shape.pools)
    assert "--quantization modelopt_fp4 --kv-cache-dtype fp8" in line


def test_run_with_fp8_weights_and_cache(tmp_path, capsys):
    """End to end: twice the KV blocks, FP8 tables in the sources, shorter decode steps."""
    fast = ["--set", "workload.max_requests=60"]
    assert run_cli(capsys, "run", "--out", str(tmp_path / "a"), *fast)[0] == 0
    assert run_cli(capsys, "run", "--out", str(tmp_path / "b"), *fast,
                   "--set", "quantization=fp8", "--set", "engine.kv_cache_dtype=fp8")[0] == 0
    a, b = (json.loads((tmp_path / x / "summary.json").read_text()) for x in "ab")
    pa, pb = a["pools"][0], b["pools"][0]
    assert pb["num_kv_blocks"] > 2 * pa["num_kv_blocks"]
    assert b["perf_sources"]["gemm"].endswith("(fp8)")
    assert b["tpot_s"]["mean"] < a["tpot_s"]["mean"]


def test_slo_scale_transfer_moves_the_fp8_cache():
    from fleetsim.search.slo_scale import idle_transfer_s

    pools = ["cluster.pools=[{name='p', gpu='h100', role='prefill'}, "
             "{name='d', gpu='h100', role='decode'}]"]
    tokens = np.array([4096])
    bf16 = load_config(None, pools)
    fp8 = load_config(None, [*pools, "engine.kv_cache_dtype=fp8"])
    latency = bf16.cluster.link.latency_s
    full = idle_transfer_s(bf16, *bf16.pools, tokens)[0] - latency
    half = idle_transfer_s(fp8, *fp8.pools, tokens)[0] - latency
    assert half == pytest.approx(full / 2)


def test_expert_parallelism_refuses_modes_it_cannot_price(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"),
                           "--set", "model=mixtral-8x7b", "--set", "hardware.tp=8",
                           "--set", "hardware.ep={balancer='quota'}",
                           "--set", "quantization=int4_wo", "--set", "workload.max_requests=5")
    assert code == 2 and "expert parallelism prices BF16 and FP8" in err


def test_calibrate_prices_the_configs_quantization():
    from fleetsim.calibrate import fit

    rows = np.array([[64.0, 64 * 2000, 0, 0, 1.0], [0, 0, 2048, 0, 1.0]])
    bf16 = fit.kernel_times_s(load_config(None), rows)
    fp8 = fit.kernel_times_s(load_config(None, ["quantization=fp8"]), rows)
    assert (fp8 < bf16).all()


def test_catalog_gpus_declare_their_formats(tmp_path):
    from fleetsim.hardware import load_gpu_catalog

    path = tmp_path / "gpus.toml"
    path.write_text(
        "[[gpu]]\nname = 'X1'\npeak_bf16_flops = 1e15\npeak_fp8_flops = 2e15\n"
        "peak_fp4_flops = 4e15\nhbm_bytes = 1e11\nhbm_bw_bytes_per_s = 4e12\n"
        "nvlink_bw_bytes_per_s = 4e11\nnetwork_bw_bytes_per_s = 5e10\nnum_gpus_per_node = 8\n"
        "price_per_hour_usd = 1.0\n")
    (gpu,) = load_gpu_catalog(path)
    assert gpu.compute_formats == ("bf16", "fp8", "fp4")
    assert "nvfp4" in modes_for(gpu.compute_formats) and "sq" not in modes_for(
        gpu.compute_formats)
    assert gpu.peak_flops("fp4") == 4e15


@pytest.mark.parametrize(("quant", "mode"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "int4_wo"),
    ({"quant_method": "gptq", "bits": 8}, "int8_wo"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
    ({"quant_method": "fp8"}, None),  # one-byte weights, priced as fleetsim always has
])
def test_hf_checkpoints_carry_their_quantization(tmp_path, quant, mode):
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
           "quantization_config": quant}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = get_model(str(path))
    assert (m.quantization.name if m.quantization else None) == mode
    if mode == "int4_wo":
        assert m.weight_bytes_per_gpu(1) == quantize(LLAMA, "int4_wo").weight_bytes_per_gpu(1)
