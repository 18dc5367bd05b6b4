"""ReqX SLO scale: the percentile of latency / standalone latency, on arrays with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fleetsim.config import load_config
from fleetsim.search.slo_scale import req_slo_scale, slo_scales, standalone_for_run


def test_known_answer_on_ratios_one_to_hundred():
    ratios = np.arange(1, 101, dtype=np.float64)  # request i takes i x its standalone time
    standalone = np.linspace(0.5, 3.0, 100)
    rng = np.random.default_rng(0)
    perm = rng.permutation(100)
    latency = (ratios * standalone)[perm]
    standalone = standalone[perm]
    assert req_slo_scale(latency, standalone, 90) == pytest.approx(90.0)
    assert req_slo_scale(latency, standalone, 95) == pytest.approx(95.0)
    assert req_slo_scale(latency, standalone, 99) == pytest.approx(99.0)
    assert req_slo_scale(latency, standalone, 100) == pytest.approx(100.0)
    # Not interpolated: 90.5% of 100 requests needs the 91st ratio.
    assert req_slo_scale(latency, standalone, 90.5) == pytest.approx(91.0)


def test_scale_is_smallest_covering_x_percent():
    rng = np.random.default_rng(1)
    standalone = rng.uniform(0.1, 5.0, 257)
    latency = standalone * rng.uniform(1.0, 8.0, 257)
    for pct in (50, 90, 95, 99):
        s = req_slo_scale(latency, standalone, pct)
        within = np.mean(latency <= s * standalone * (1 + 1e-12))
        assert within >= pct / 100
        below = np.mean(latency < s * standalone * (1 - 1e-9))
        assert below < pct / 100  # any smaller scale covers too few


def test_unfinished_requests_count_as_infinitely_slow():
    latency = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    standalone = np.ones(9)
    assert req_slo_scale(latency, standalone, 90, num_unfinished=1) == pytest.approx(9.0)
    assert math.isinf(req_slo_scale(latency, standalone, 95, num_unfinished=1))
    assert math.isnan(req_slo_scale(np.array([]), np.array([]), 90))


@pytest.mark.parametrize("pct", [0, -5, 100.1])
def test_bad_percentile(pct):
    with pytest.raises(ValueError, match="pct"):
        req_slo_scale(np.ones(3), np.ones(3), pct)


def test_run_scales_are_at_least_one_and_ordered():
    config = load_config(None, ["workload.max_requests=120", "workload.rate_scale=2.0",
                                "engine.enable_prefix_caching=false"])
    out = slo_scales(config, (50, 90, 99))
    s = out["slo_scale"]
    assert out["num_finished"] == 120
    assert 1.0 - 1e-6 <= s["req50"] <= s["req90"] <= s["req99"]
    assert out["ratio_min"] >= 1.0 - 1e-6  # nobody beats running alone


def test_standalone_uses_the_serving_pool_step_model():
    """A request that ran on an A100 pool is measured against A100 standalone latency."""
    req = {"num_prompt_tokens": np.array([1000, 1000]), "num_output_tokens": np.array([50, 50]),
           "replica_id": np.array([0, 1])}
    config = load_config(None, [
        "cluster.pools=[{name='a', gpu='a100'}, {name='h', gpu='h200'}]"])
    a100, h200 = standalone_for_run(config, req)
    assert a100 > h200 > 0


def test_pd_standalone_matches_an_idle_cluster():
    """P/D on different GPUs: the fastest request runs exactly its standalone latency."""
    config = load_config(None, [
        "cluster.pools=[{name='p', gpu='h100', role='prefill'}, "
        "{name='d', gpu='a100', role='decode', num_replicas=2}]",
        "workload.max_requests=60"])
    out = slo_scales(config, (50, 99))
    assert out["ratio_min"] == pytest.approx(1.0, abs=1e-6)
    assert out["slo_scale"]["req50"] <= out["slo_scale"]["req99"]
