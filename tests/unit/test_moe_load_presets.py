"""The stationary ``ou`` load generator and the measured presets it is calibrated to:
stationarity (the skew does not grow with the run), calibration (each preset's max/mean comes
back from sampled loads), the AR(1) coefficient, determinism, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.load_presets import (
    LOAD_PRESETS,
    calibrate_log_sd,
    get_preset,
    preset_spec,
    stationary_imbalance,
)
from fleetsim.moe.loads import LoadSpec, make_loads, ou_logits
from fleetsim.moe.placement import imbalance

QWEN3 = {"num_experts": 128, "top_k": 8}


def _gpu_imbalance(loads: np.ndarray, ep: int) -> np.ndarray:
    """(micro-batches, layers) max/mean GPU load, experts in order on ``ep`` GPUs."""
    gpu = loads.reshape(*loads.shape[:2], ep, -1).sum(-1)
    return imbalance(gpu)


def test_ou_skew_does_not_grow_with_run_length():
    """The first and the last 16 of 256 micro-batches have the same max/mean; a walk without
    mean reversion (``drift``) more than doubles its log-popularity spread over the same run."""
    spec = LoadSpec(num_microbatches=256, num_layers=32, num_tokens=4096 * 64, log_sd=0.65,
                    autocorr=0.9, **QWEN3)
    imb = _gpu_imbalance(make_loads("ou", spec, seed=3), 64)
    early, late = imb[:16].mean(), imb[-16:].mean()
    assert late == pytest.approx(early, rel=0.08)
    x = ou_logits(spec, np.random.default_rng(0))
    sd_by_step = x.std(axis=(1, 2))
    assert sd_by_step[0] == pytest.approx(0.65, rel=0.05)
    assert sd_by_step[-1] == pytest.approx(0.65, rel=0.05)
    from fleetsim.moe.loads import drift_logits
    walk = drift_logits(spec, np.random.default_rng(0))
    walk = walk - walk.mean(-1, keepdims=True)
    assert walk[-1].std() > 2 * walk[0].std()


def test_ou_consecutive_microbatches_correlate_by_autocorr():
    for rho in (0.3, 0.9):
        spec = LoadSpec(num_microbatches=64, num_layers=8, log_sd=1.0, autocorr=rho, **QWEN3)
        x = ou_logits(spec, np.random.default_rng(1))
        lag1 = np.corrcoef(x[1:].ravel(), x[:-1].ravel())[0, 1]
        assert lag1 == pytest.approx(rho, abs=0.03)


@pytest.mark.parametrize("name", sorted(LOAD_PRESETS))
def test_each_preset_is_calibrated_to_its_published_max_over_mean(name):
    """Sampled loads of the preset's own model at its EP size give its published max/mean."""
    p = get_preset(name)
    spec = LoadSpec(num_microbatches=16, num_layers=16, num_experts=p.num_experts,
                    top_k=p.top_k, num_tokens=4096 * p.ep)
    calibrated = preset_spec(p, spec, tokens_per_gpu=4096)
    assert calibrated.log_sd > 0
    measured = _gpu_imbalance(make_loads("ou", calibrated, seed=7), p.ep).mean()
    assert measured == pytest.approx(p.max_over_mean, rel=0.05)
    # the bisection itself lands on the target
    assert stationary_imbalance(calibrated.log_sd, num_experts=p.num_experts, top_k=p.top_k,
                                ep=p.ep, num_tokens=4096 * p.ep) == pytest.approx(
        p.max_over_mean, abs=1e-3)


def test_more_skew_needs_more_dispersion_and_fewer_gpus_see_less_of_it():
    kw = {"ep": 64, "num_tokens": 4096 * 64, **QWEN3}
    low, high = calibrate_log_sd(1.3, **kw), calibrate_log_sd(4.01, **kw)
    assert 0 < low < high
    at_32 = stationary_imbalance(high, num_experts=128, top_k=8, ep=32, num_tokens=4096 * 32)
    assert 1.0 < at_32 < 4.01


def test_same_seed_same_loads_other_seed_other_loads():
    spec = LoadSpec(num_microbatches=6, num_layers=3, num_tokens=8192, log_sd=0.8, **QWEN3)
    a, b = make_loads("ou", spec, seed=5), make_loads("ou", spec, seed=5)
    assert (a == b).all()
    assert not (make_loads("ou", spec, seed=6) == a).all()
    assert (a.sum(-1) == 8192 * 8).all()
    assert calibrate_log_sd(2.86, ep=64, num_tokens=4096 * 64, **QWEN3) == calibrate_log_sd(
        2.86, ep=64, num_tokens=4096 * 64, **QWEN3)


def test_bad_input_names_the_field():
    with pytest.raises(FleetsimInputError) as err:
        calibrate_log_sd(40.0, ep=64, num_tokens=4096 * 64, **QWEN3)
    assert err.value.where == "max_over_mean"
    with pytest.raises(FleetsimInputError) as err:
        get_preset("zipf")
    assert err.value.where == "preset"
    for field, value in (("autocorr", 1.0), ("autocorr", -0.1), ("log_sd", -1.0)):
        with pytest.raises(FleetsimInputError) as err:
            LoadSpec(**{field: value})
        assert err.value.where == field


def test_ultraep_settings_run_at_the_published_max_over_mean():
    """Every UltraEP setting's loads give Megatron-LM's placement (experts in order over EP64)
    the max/mean its preset publishes, so the sweep spans the paper's 1.30-4.01."""
    from fleetsim.repro.ultraep import SETTINGS, UltraEpSetup, setting_loads
    setup = UltraEpSetup(num_microbatches=4, num_warmup=4, num_layers=16)
    seen = []
    for phase, _, _, preset in SETTINGS.values():
        imb = _gpu_imbalance(setting_loads(setup, phase, preset), setup.ep).mean()
        assert imb == pytest.approx(get_preset(preset).max_over_mean, rel=0.06)
        seen.append(imb)
    assert min(seen) < 1.4 and max(seen) > 3.8


def test_relibra_loads_are_calibrated_at_the_measured_ep():
    """ReLibra runs EP32; its loads keep the routing the preset measured at EP64."""
    from fleetsim.repro.relibra import RelibraSetup, make_workload
    setup = RelibraSetup(num_batches=1, num_warmup_batches=1, microbatches_per_batch=4,
                         num_layers=16)
    w = make_workload(setup, "ultraep-qwen3-235b-train")
    loads = np.concatenate(w.batches)
    assert _gpu_imbalance(loads, 64).mean() == pytest.approx(2.86, rel=0.06)
    assert _gpu_imbalance(loads, 32).mean() < 2.4


def test_serving_ep_model_routes_at_a_presets_measured_skew():
    """``hardware.ep.scenario`` may name a preset: the step model's routing popularity then
    carries the preset's max/mean over experts in order; bare ``ou`` is refused."""
    from fleetsim.moe.compute import MoeLayerSpec
    from fleetsim.moe.serving import PoolEpConfig
    from fleetsim.moe.step_model import ExpertParallelConfig, ExpertParallelStepModel
    ep = ExpertParallelConfig(num_gpus=64, gpus_per_node=8, balancer="none")
    model = ExpertParallelStepModel(ep, spec=MoeLayerSpec(num_experts=128, top_k=8),
                                    scenario="ultraep-qwen3-235b-prefill-stem", num_layers=8)
    p = model.popularity  # (patterns, layers, experts), expected shares
    assert _gpu_imbalance(p, 64).mean() == pytest.approx(3.68, rel=0.06)
    assert PoolEpConfig(scenario="ultraep-qwen3-235b-train").scenario.startswith("ultraep")
    with pytest.raises(ValueError, match="ep.scenario"):
        PoolEpConfig(scenario="ou")


def test_ultraep_gain_over_megatron_grows_with_the_published_skew():
    """A quick slice of the sweep: at DeepSeek-V3's 1.30 UltraEP gains little over Megatron-LM,
    at Qwen3's 2.86 much more, and UltraEP's own share of the ideal barely moves."""
    from fleetsim.repro.ultraep import UltraEpSetup, run_setting
    setup = UltraEpSetup(num_microbatches=2, num_warmup=2, num_layers=4, eplb_window=2)
    gain, share = {}, {}
    for preset in ("ultraep-deepseek-v3-train", "ultraep-qwen3-235b-train"):
        runs = run_setting(setup, "train", "GB200-NVL72", 64, preset)
        total = {p: sum(r.total_s for r in rows) for p, rows in runs.items()}
        gain[preset] = total["megatron"] / total["ultraep"]
        share[preset] = total["force_balanced"] / total["ultraep"]
    low, high = gain["ultraep-deepseek-v3-train"], gain["ultraep-qwen3-235b-train"]
    assert 1.0 < low < 1.3 < high
    assert abs(share["ultraep-deepseek-v3-train"] - share["ultraep-qwen3-235b-train"]) < 0.03
