"""The expert-parallel layer-time model and its compute back-ends."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import (
    EpHardware,
    ExpertParallelConfig,
    ExpertParallelStepModel,
    MoeLayerSpec,
    RooflineExpertCompute,
    TableExpertCompute,
    ideal_times,
    layer_times,
    load_moe_table,
    moe_layer_time_s,
)
from fleetsim.moe.placement import even_split, static_phy2log

SPEC = MoeLayerSpec()
HW = EpHardware()


def test_roofline_hand_checked():
    """One GPU, 4 active experts, 4096 routed tokens each (DeepSeek-V3 shapes, fp8, H200)."""
    compute = RooflineExpertCompute(SPEC, HW)
    tokens = np.array([[[4096.0, 4096.0, 4096.0, 4096.0, 0.0]]])
    flops_s = 4 * 4096 * 6 * 7168 * 2048 / 1979e12
    bytes_s = (4 * 3 * 7168 * 2048 + 4 * 4096 * 7168 * 4) / 4.8e12
    assert compute.gpu_time_s(tokens)[0, 0] == pytest.approx(max(flops_s, bytes_s) + 20e-6)
    assert compute.gpu_time_s(np.zeros((1, 1, 5)))[0, 0] == 0.0


def test_table_interpolates_and_extrapolates():
    table = TableExpertCompute(np.array([10.0, 20.0]), np.array([1.0, 2.0]))
    got = table.gpu_time_s(np.array([[[5.0, 10.0], [30.0, 10.0], [0.0, 0.0]]]))
    assert got.tolist() == [[1.5, 4.0, 0.0]]


def test_aiconfigurator_table_for_deepseek_v3_if_installed():
    pytest.importorskip("aiconfigurator_core")
    pytest.importorskip("pandas")
    table = load_moe_table(SPEC, 64)
    assert table is not None
    assert (np.diff(table.routed_tokens) > 0).all()
    assert (table.seconds > 0).all()


def test_layer_time_grows_with_imbalance_and_ideal_is_a_lower_bound():
    ep = ExpertParallelConfig(num_gpus=8, gpus_per_node=4)
    compute = RooflineExpertCompute(SPEC, HW)
    assert moe_layer_time_s(ep, 0, compute=compute) == 0.0
    base = moe_layer_time_s(ep, 8 * 4096, compute=compute)
    assert moe_layer_time_s(ep, 8 * 4096, imbalance=1.5, compute=compute) > base
    load = np.zeros((1, 256))
    load[0, :8] = 4096.0  # all hot experts on GPU 0 with the static placement
    placement = even_split(static_phy2log(1, 256, 8, 33), 256, 33)
    actual = layer_times(placement, load, ep, SPEC, HW, compute).total_s
    ideal = ideal_times(load, ep, SPEC, HW, compute).total_s
    assert (actual > ideal).all()


def test_closed_form_matches_placement_model_when_balanced():
    ep = ExpertParallelConfig(num_gpus=8, gpus_per_node=4, num_spare_slots_per_gpu=0)
    compute = RooflineExpertCompute(SPEC, HW)
    load = np.full((1, 256), 128.0)
    ideal = ideal_times(load, ep, SPEC, HW, compute).total_s[0]
    assert moe_layer_time_s(ep, 256 * 128 // 8, compute=compute) == pytest.approx(ideal)


def test_step_model_runs_every_builtin_balancer():
    for name in ("none", "eplb", "eplb_stale", "quota", "two_timescale"):
        ep = ExpertParallelConfig(num_gpus=16, gpus_per_node=8, balancer=name)
        model = ExpertParallelStepModel(
            ep, num_layers=2, scenario="rl", num_patterns=4, compute=RooflineExpertCompute(SPEC, HW)
        )
        times = [model.moe_time_s(16 * 512) for _ in range(3)]
        assert all(t > 0 for t in times)
        assert model.moe_time_s(0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "where"),
    [
        ({"num_gpus": 0}, "num_gpus"),
        ({"num_gpus": 12, "gpus_per_node": 8}, "gpus_per_node"),
        ({"num_gpus": 8, "num_spare_slots_per_gpu": -1}, "num_spare_slots_per_gpu"),
    ],
)
def test_ep_config_validation(kwargs, where):
    with pytest.raises(FleetsimInputError) as err:
        ExpertParallelConfig(**kwargs)
    assert err.value.where == where


def test_num_experts_must_tile_the_gpus():
    with pytest.raises(FleetsimInputError) as err:
        ExpertParallelConfig(num_gpus=48).slots_per_gpu(256)
    assert err.value.where == "num_experts"
    with pytest.raises(FleetsimInputError):
        moe_layer_time_s(ExpertParallelConfig(num_gpus=8), 100, imbalance=0.5)


def test_ep_config_from_toml_style_dict_and_bad_balancer():
    from fleetsim.configutil import from_dict

    ep = from_dict(
        ExpertParallelConfig,
        {"num_gpus": 64, "balancer": "quota", "balancer_args": {"tolerance": 0.05}},
        "pool.ep",
    )
    assert ep.slots_per_gpu(256) == 5
    with pytest.raises(FleetsimInputError) as err:
        ExpertParallelConfig(num_gpus=8, balancer="eplbb")
    assert err.value.where == "balancer"
    with pytest.raises(FleetsimInputError) as err:
        from_dict(ExpertParallelConfig, {"num_gpus": 8, "balancer_args": {"nope": 1}}, "pool.ep")
    assert "nope" in str(err.value)


def test_specs_from_the_model_and_gpu_catalogs():
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model, list_models

    spec = MoeLayerSpec.from_model(get_model("DeepSeek-V3"))
    assert spec == MoeLayerSpec()
    hw = EpHardware.from_gpu(get_gpu("H200"))
    assert hw.peak_flops == 1979e12
    assert hw.inter_node_bytes_per_s == 50e9
    with pytest.raises(FleetsimInputError) as err:
        MoeLayerSpec.from_model(next(m for m in list_models() if not m.is_moe))
    assert err.value.where == "model"
