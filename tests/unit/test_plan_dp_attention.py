"""plan's wide-EP axis (``--dp-attention``, ``search/dp_axis.py``): dp x tp replicas of a MoE
model within --max-gpus, named ``dpN tpT``, deployed with vLLM's DP + EP flags; layouts run
would refuse skipped with a note; a dense model refused in one line."""

from __future__ import annotations

import json

import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.search.dp_axis import parse_dp_attention_axis, servable_wide_ep
from fleetsim.search.plan import enumerate_shapes
from fleetsim.search.quant_axis import with_quantization

DSV3 = {"model": "deepseek-v3", "quantization": "fp8_block", "perf_backend": "roofline",
        "workload": {"max_requests": 200}}
_DSV3 = ["--set", "model=deepseek-v3", "--set", "quantization=fp8_block",
         "--set", "perf_backend=roofline", "--set", "workload.max_requests=200"]


def test_plan_lists_a_dp16_shape_with_its_gpus_price_and_serve_flags(capsys):
    """DeepSeek-V3 FP8 fits no H100 replica of tp 1, nor dp 8 (~100 GB of weights a GPU), but
    16 attention ranks with the experts over 16 GPUs serve it."""
    code = main(["plan", "--json", *_DSV3, "--dp-attention", "1,8,16", "--gpus", "h100",
                 "--max-gpus", "16", "--max-runs", "4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    rows = {r["shape"]: r for r in result["points"]}
    wide = rows["1x H100-SXM dp16 tp1"]
    assert wide["num_gpus"] == 16 and wide["pools"][0]["dp_attention"] == 16
    assert wide["goodput_requests_per_s"] > 0
    assert wide["usd_per_hour"] == pytest.approx(16 * get_gpu("h100").price_per_hour_usd)
    (line,) = wide["vllm_serve"]
    assert "--tensor-parallel-size 1 --data-parallel-size 16 --enable-expert-parallel" in line
    assert result["points"][result["front"][0]]["shape"] == "1x H100-SXM dp16 tp1"
    # the plain tp1 replicas are searched too (and do not fit); dp8 never reaches a search
    assert "infeasible" in rows["16x H100-SXM tp1"]
    assert not any("dp8" in name for name in rows)
    assert any(s.startswith("skipped dp8 tp1 on H100-SXM:") and "weights per GPU" in s
               for s in result["skipped"])
    assert "fleetsim: skipped dp8 tp1" in out.err


def test_dense_model_with_dp_attention_is_one_line_exit_2(capsys):
    code = main(["plan", "--set", "model=llama-3.1-8b", "--dp-attention", "16",
                 "--gpus", "h100", "--max-gpus", "16"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--dp-attention: got '16'" in err and "dense" in err
    # 1 alone is the plain layouts, which a dense model has
    assert parse_dp_attention_axis("1", config_from_dict({"model": "llama-3.1-8b"})) == [1]
    with pytest.raises(FleetsimInputError, match="--dp-attention.*>= 1"):
        parse_dp_attention_axis("0,8", config_from_dict(DSV3))
    with pytest.raises(FleetsimInputError, match="--dp-attention.*integers"):
        parse_dp_attention_axis("8x", config_from_dict(DSV3))


def test_no_wide_ep_layout_at_all_is_one_line_exit_2(capsys):
    """Every wide-EP shape skipped and no plain one asked: say why in one line."""
    code = main(["plan", *_DSV3, "--dp-attention", "8", "--gpus", "h100", "--max-gpus", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--dp-attention" in err and "weights per GPU" in err


def test_wide_ep_only_with_speculation_on_every_shape_is_one_line_exit_2(capsys):
    code = main(["plan", *_DSV3, "--set", "engine.speculative.method=mtp",
                 "--set", "engine.speculative.num_speculative_tokens=1",
                 "--dp-attention", "16", "--gpus", "h100", "--max-gpus", "16"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "--dp-attention: got 16" in err and "speculative" in err


def test_shapes_beyond_max_gpus_pp_and_speculation_are_not_generated():
    spec = SpeculativeConfig(method="mtp", num_speculative_tokens=1)
    shapes = enumerate_shapes(["h100"], [1, 2], 16, pps=[1, 2], dp_attention=[1, 8, 16],
                              speculative=[None, spec])
    wide = [s for s in shapes if s.pools[0].dp_attention > 1]
    assert {s.name for s in wide} == {"1x H100-SXM dp8 tp1", "2x H100-SXM dp8 tp1",
                                      "1x H100-SXM dp8 tp2", "1x H100-SXM dp16 tp1"}
    assert all(s.num_gpus <= 16 and s.speculative is None and s.pools[0].pp == 1 for s in wide)
    assert {s.num_gpus for s in wide} == {8, 16}
    assert any(s.speculative == spec for s in shapes)  # plain shapes keep the spec axis
    # a budget below dp x tp generates no wide shape; without 1 in the axis, no plain one
    assert enumerate_shapes(["h100"], [1], 8, dp_attention=[16]) == []
    only = enumerate_shapes(["h100"], [1], 16, dp_attention=[16])
    assert [s.name for s in only] == ["1x H100-SXM dp16 tp1"]
    # wide and plain shapes of the same GPUs never seed each other's searches
    plain16 = next(s for s in shapes if s.name == "16x H100-SXM tp1")
    assert plain16.num_gpus == only[0].num_gpus and plain16.family() != only[0].family()


def test_the_shape_sets_the_layout_and_the_config_sets_the_default_axis():
    config = config_from_dict({**DSV3, "hardware": {"gpu": "h100", "dp_attention": 16}})
    assert parse_dp_attention_axis(None, config) == [16]
    assert parse_dp_attention_axis(None, config_from_dict(DSV3)) == [1]
    assert parse_dp_attention_axis("16,1,16", config) == [1, 16]
    (shape,) = enumerate_shapes(["h100"], [1], 16, dp_attention=[16])
    applied = shape.apply(config_from_dict(DSV3))
    assert (applied.hardware.dp_attention, applied.hardware.tp) == (16, 1)


def test_skips_follow_the_shapes_quantization_and_the_expert_split():
    """DeepSeek-V3's own FP8 checkpoint does not fit dp8 x tp1 on H100 (~99 GB a GPU) where
    int4 weights (~54 GB) do; 12 GPUs are not whole H100 nodes; 256 experts do not split over
    24; a rank of tp 3 does not tile 8-GPU nodes; plain shapes pass untouched."""
    from fleetsim.models import get_model

    config = config_from_dict(DSV3)
    shapes = enumerate_shapes(["h100"], [1], 8, dp_attention=[1, 8])
    quantized, _ = with_quantization(shapes, ["bf16", "int4_wo"], get_model("deepseek-v3"))
    kept, notes = servable_wide_ep(quantized, config)
    wide = [s.name for s in kept if s.pools[0].dp_attention > 1]
    assert wide == ["1x H100-SXM dp8 tp1 int4_wo"]
    assert len([s for s in kept if s.pools[0].dp_attention == 1]) == 2 * 4
    assert len(notes) == 1 and notes[0].startswith("skipped dp8 tp1 bf16 on H100-SXM:")
    for dp, tp, why in ((12, 1, "must fill whole nodes"), (24, 1, "do not split over"),
                        (8, 3, "must divide 8")):
        (odd,) = enumerate_shapes(["h100"], [tp], dp * tp, dp_attention=[dp])
        kept, notes = servable_wide_ep([odd], config)
        assert kept == [] and notes[0].startswith(f"skipped dp{dp} tp{tp} on H100-SXM: ")
        assert why in notes[0]
