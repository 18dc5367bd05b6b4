"""Goodput search on the real engine: monotone in the SLO and in the hardware."""

from __future__ import annotations

import dataclasses

import pytest

from fleetsim.config import load_config
from fleetsim.metrics.summary import SLOConfig
from fleetsim.search.goodput import (
    base_rate_per_s,
    config_at_scale,
    goodput_search,
    goodput_to_dict,
    probe_config,
)

SMALL = ["workload.max_requests=150"]


def search(config, **kw):
    return goodput_search(config, rel_tol=0.1, max_runs=12, **kw)


def test_rate_scaling_is_exact_for_a_request_cut():
    config = load_config(None, SMALL)
    base = base_rate_per_s(config)
    _, extra = probe_config(config_at_scale(config, 3.0))
    assert extra["measured_rate_per_s"] == pytest.approx(3.0 * base)
    assert extra["num_requests"] == 150


def test_stricter_slo_never_gives_higher_goodput():
    config = load_config(None, SMALL)
    loose = search(config).goodput_rate_per_s
    strict = search(dataclasses.replace(config, slo=SLOConfig(ttft_s=0.25, tpot_s=0.03)))
    assert strict.goodput_rate_per_s is not None
    assert strict.goodput_rate_per_s <= loose
    assert search(config, target=0.99).goodput_rate_per_s <= loose


def test_more_capable_gpu_never_gives_lower_goodput():
    a100 = search(load_config(None, [*SMALL, "hardware.gpu=a100"]))
    h200 = search(load_config(None, [*SMALL, "hardware.gpu=h200"]))
    assert h200.goodput_rate_per_s >= a100.goodput_rate_per_s
    assert h200.usd_per_hour > a100.usd_per_hour


def test_synthetic_workload_and_report():
    config = load_config(None, [
        "workload.trace='synthetic'", "workload.rate_per_s=2.0", "workload.num_requests=80",
        "workload.prompt_tokens={kind='fixed', value=512}",
        "workload.output_tokens={kind='fixed', value=64}"])
    r = goodput_to_dict(search(config))
    assert r["base_rate_per_s"] == pytest.approx(2.0, rel=0.5)
    assert r["goodput_requests_per_s"] > r["base_rate_per_s"]
    assert r["usd_per_million_tokens"] == pytest.approx(
        r["usd_per_hour"] / (r["goodput_requests_per_s"] * 576 * 3600) * 1e6)


def test_two_replicas_never_give_lower_goodput_than_one():
    one = search(load_config(None, ["workload.max_requests=300"]))
    two = search(load_config(None, ["workload.max_requests=300", "hardware.num_replicas=2"]))
    assert two.goodput_rate_per_s >= one.goodput_rate_per_s
    assert two.usd_per_hour == pytest.approx(2 * one.usd_per_hour)
