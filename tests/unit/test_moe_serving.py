"""Expert parallelism wired into the serving step time (MoE models)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.moe.serving import EpStepModel, PoolEpConfig
from fleetsim.perf import build_step_model
from fleetsim.run import run


@pytest.fixture(scope="module")
def mixtral_models():
    model, gpu = get_model("mixtral-8x7b"), get_gpu("h100")
    base = build_step_model(model, gpu, 8)
    ep = EpStepModel(base, model, gpu, 8, PoolEpConfig(balancer="none", scenario="zipf",
                                                       num_calibration_steps=4))
    return base, ep


def test_ep_keeps_the_bit_exact_decode_contract(mixtral_models):
    _, ep = mixtral_models
    kv = np.array([0, 17, 4096, 123457], dtype=np.int64)
    for n in (1, 7, 64, 300):
        vec = ep.decode_step_times_s(n, kv)
        assert [ep.step_time_s((), n, int(k)) for k in kv] == vec.tolist()
        base, per_kv, extra = ep.decode_terms_s(n)
        assert [(base + per_kv * int(k)) + extra for k in kv] == vec.tolist()


def test_ep_replaces_only_the_moe_part(mixtral_models):
    base, ep = mixtral_models
    assert ep.balance_ratio >= 1.0
    assert "expert parallel over 8 GPUs" in ep.sources["moe"]
    # More tokens never make a step faster, and the dense part is untouched: the difference
    # between EP and TP experts depends on the token count only, not on the KV length.
    times = [ep.step_time_s([(t, 0)], 0, 0) for t in (1, 64, 512, 4096)]
    assert times == sorted(times)
    d1 = ep.step_time_s((), 32, 1000) - base.step_time_s((), 32, 1000)
    d2 = ep.step_time_s((), 32, 90000) - base.step_time_s((), 32, 90000)
    assert d1 == pytest.approx(d2, rel=1e-9, abs=1e-12)


def test_balancer_choice_changes_the_run():
    def tpot(balancer: str) -> float:
        cfg = config_from_dict({
            "model": "mixtral-8x7b", "workload": {"max_requests": 60},
            "hardware": {"gpu": "h100", "tp": 8,
                         "ep": {"balancer": balancer, "scenario": "rl",
                                "num_calibration_steps": 6}},
        })
        s = run(cfg).summary
        assert s["pools"][0]["ep_balance_ratio"] >= 1.0
        return s["tpot_s"]["p50"]

    # EPLB replanned on stale load every step moves expert weights each step: slower.
    assert tpot("eplb_stale") > tpot("none")


def test_ep_on_a_dense_model_is_a_clear_error():
    cfg = config_from_dict({"model": "llama-3.1-8b", "workload": {"max_requests": 5},
                            "hardware": {"ep": {"balancer": "quota"}}})
    with pytest.raises(FleetsimInputError, match="MoE model"):
        run(cfg)


def test_unknown_balancer_and_scenario_are_clear_errors():
    with pytest.raises(FleetsimInputError, match="scenario"):
        config_from_dict({"hardware": {"ep": {"scenario": "sunny"}}})
    cfg = config_from_dict({"model": "mixtral-8x7b", "workload": {"max_requests": 5},
                            "hardware": {"tp": 8, "ep": {"balancer": "magic"}}})
    with pytest.raises(FleetsimInputError, match="magic"):
        run(cfg)
