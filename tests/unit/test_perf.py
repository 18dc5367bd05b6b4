"""Step-time model: sources, fallbacks, validation of inputs, memory, breakdowns."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import (
    StepTimeModel,
    breakdown_table,
    breakdown_to_dict,
    build_step_model,
    kv_capacity_blocks,
    predict_breakdown,
)
from fleetsim.perf.base import ConstantStepModel, LinearStepModel

LLAMA8 = get_model("Llama-3.1-8B")
H100 = get_gpu("h100")


@pytest.fixture(scope="module")
def sm():
    return build_step_model(LLAMA8, H100, 1)


def test_implements_protocol(sm):
    assert isinstance(sm.step_time_s((), 1, 100), float)
    model: StepTimeModel = sm  # static check of the Protocol
    assert model.decode_step_times_s(4, np.array([10, 20])).shape == (2,)


def test_measured_sources_on_h100(sm):
    for op in ("gemm", "attention"):
        assert sm.sources[op].startswith("measured: aiconfigurator-core h100_sxm/vllm")
    assert sm.sources["moe"].startswith("none")


def test_tp_uses_measured_allreduce():
    s = build_step_model(get_model("Llama-3.1-70B"), H100, 4).sources
    assert "custom_allreduce_perf.parquet" in s["communication"]


def test_moe_uses_measured_moe_table():
    s = build_step_model(get_model("Mixtral-8x7B"), H100, 2).sources
    assert s["moe"].startswith("measured:")
    assert "moe_perf.parquet" in s["moe"]


def test_h20_falls_back_to_roofline_and_says_so():
    s = build_step_model(LLAMA8, get_gpu("h20"), 1).sources
    assert s["gemm"] == "roofline"
    assert s["attention"] == "roofline"


def test_roofline_backend_forced():
    s = build_step_model(LLAMA8, H100, 1, backend="roofline").sources
    assert s["gemm"] == "roofline"
    assert s["attention"] == "roofline"


def test_mla_attention_is_roofline_and_labelled():
    s = build_step_model(get_model("DeepSeek-V3"), get_gpu("h200"), 8).sources
    assert s["attention"] == "roofline"
    assert s["gemm"].startswith("measured:")


@pytest.mark.parametrize("tp", [3, 16, 0])
def test_bad_tp_rejected(tp):
    with pytest.raises(FleetsimInputError, match="tp"):
        build_step_model(LLAMA8, H100, tp)


def test_tp_must_divide_heads():
    with pytest.raises(FleetsimInputError, match="attention heads"):
        build_step_model(_odd_heads_model(), H100, 4)


def _odd_heads_model():
    from dataclasses import replace

    return replace(LLAMA8, name="odd", num_attention_heads=6, num_kv_heads=2)


def test_bad_backend_rejected():
    with pytest.raises(FleetsimInputError, match="backend"):
        build_step_model(LLAMA8, H100, 1, backend="magic")


def test_more_tokens_never_faster(sm):
    base = sm.step_time_s([(512, 0)], 8, 8000)
    assert sm.step_time_s([(513, 0)], 8, 8000) >= base
    assert sm.step_time_s([(512, 100)], 8, 8000) >= base
    assert sm.step_time_s([(512, 0)], 9, 8001) >= base
    assert sm.step_time_s([(512, 0)], 8, 8001) >= base
    assert sm.step_time_s([(512, 0), (1, 0)], 8, 8000) >= base


def test_plausible_magnitudes(sm):
    """Decode of Llama-3.1-8B at batch 1 reads 16 GB of weights: >= 4.8 ms on 3.35 TB/s."""
    t = sm.step_time_s((), 1, 100)
    assert 4.8e-3 < t < 12e-3
    prefill = sm.step_time_s([(4096, 0)], 0, 0)  # ~66 TFLOP of GEMMs
    assert 66e12 / 989e12 < prefill < 0.3


def test_decode_vector_matches_scalar(sm):
    kv = np.array([0, 1, 17, 4096, 10**6], dtype=np.int64)
    vec = sm.decode_step_times_s(32, kv)
    assert [float(x) for x in vec] == [sm.step_time_s((), 32, int(k)) for k in kv]


def test_kv_capacity_blocks():
    n = kv_capacity_blocks(LLAMA8, H100, 1, block_size=16)
    kv_bytes = 16 * LLAMA8.kv_bytes_per_token_per_gpu(1)
    assert 0 < n * kv_bytes < 0.9 * H100.hbm_bytes - LLAMA8.weight_bytes_per_gpu(1)
    assert n > 20_000  # ~50 GB free for KV on an 80 GB H100
    assert kv_capacity_blocks(LLAMA8, H100, 1, 16, 0.5) < n


def test_weights_do_not_fit_suggests_more_tp():
    with pytest.raises(FleetsimInputError, match=r"Llama-3.1-70B.*H100-SXM.*larger tp"):
        kv_capacity_blocks(get_model("Llama-3.1-70B"), H100, 1, block_size=16)
    assert kv_capacity_blocks(get_model("Llama-3.1-70B"), H100, 4, block_size=16) > 0


def test_predict_breakdown_sums_to_total():
    b = predict_breakdown(get_model("Llama-3.1-70B"), H100, 4, decode_batch=32, context_tokens=2000)
    assert sum(b.by_class_s.values()) == pytest.approx(b.total_s, rel=1e-9)
    assert b.by_class_s["communication"] > 0
    d = breakdown_to_dict(b)
    json.dumps(d)
    assert set(d["ops"]) == {"gemm", "attention", "moe", "communication", "other"}
    assert d["ops"]["gemm"]["source"].startswith("measured")
    assert breakdown_table(b).row_count == 5


def test_predict_breakdown_prefill_and_errors():
    b = predict_breakdown(LLAMA8, H100, 1, prefill_tokens=2048, context_tokens=1024)
    assert b.by_class_s["attention"] > 0
    assert b.prefill_tokens == 2048
    with pytest.raises(FleetsimInputError):
        predict_breakdown(LLAMA8, H100, 1)
    with pytest.raises(FleetsimInputError):
        predict_breakdown(LLAMA8, H100, 1, prefill_tokens=8, prefill_context_tokens=-1)


def test_predict_breakdown_prices_a_mixed_step_as_the_engine_does(sm):
    """A chunk and a decode batch in one step: the engine's step time, not the sum of two."""
    b = predict_breakdown(LLAMA8, H100, 1, prefill_tokens=512, decode_batch=32,
                          context_tokens=2000, prefill_context_tokens=1000)
    assert b.total_s == sm.step_time_s([(512, 1000)], 32, 32 * 2000)
    assert sum(b.by_class_s.values()) == pytest.approx(b.total_s, rel=1e-9)
    alone = (predict_breakdown(LLAMA8, H100, 1, prefill_tokens=512, context_tokens=1000).total_s
             + predict_breakdown(LLAMA8, H100, 1, decode_batch=32, context_tokens=2000).total_s)
    assert b.total_s < alone  # one overhead and one weight read, not two
    assert "decode batch 32" in breakdown_table(b).title and "512 tokens over 1000" in (
        breakdown_table(b).title)


def test_build_is_cached(sm):
    again = build_step_model(LLAMA8, H100, 1)
    assert again._g is sm._g


def test_step_overhead_is_configurable(sm):
    lean = build_step_model(LLAMA8, H100, 1, step_overhead_s=0.0)
    assert sm.step_time_s((), 8, 800) - lean.step_time_s((), 8, 800) == pytest.approx(1.5e-3)
    assert "fixed 0 ms" in lean.sources["other"]
    with pytest.raises(FleetsimInputError, match="step_overhead_s"):
        build_step_model(LLAMA8, H100, 1, step_overhead_s=-1.0)


@pytest.mark.parametrize("model", [LinearStepModel(0.01, 1e-4, 1e-6), ConstantStepModel(0.02),
                                   LinearStepModel(0.003, 2.5e-5, 3.3e-7)])
def test_analytic_models_decode_terms_are_bit_exact(model):
    for n in (0, 1, 7, 300):
        base, per_kv, extra = model.decode_terms_s(n)
        for kv in (0, 1, 4095, 123_457, 2**40):
            assert (base + per_kv * kv) + extra == model.step_time_s((), n, kv)
