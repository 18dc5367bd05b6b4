"""One door into the engine: ``EngineSettings`` + ``PlugIns`` -> ``build_cluster``, and ``run``
taking a workload object instead of a trace file written only to be read back."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.conftest import make_workload

from fleetsim.config import config_from_dict
from fleetsim.core.simulator import Simulator
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, RoundRobin
from fleetsim.run import engine_settings, run
from fleetsim.serving.cluster import PoolSetup, build_cluster, simulate, simulate_cluster
from fleetsim.serving.kv_keep import KVRetention
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.settings import EngineSettings, PlugIns
from fleetsim.workloads.loaders import save_generic_csv

STEP = LinearStepModel(0.002, 5e-5, 1e-7)


def _pools():
    return [PoolSetup(name="m", role="mixed", num_replicas=2, step_model=STEP,
                      num_kv_blocks=500, link_bw_bytes_per_s=1e9),
            PoolSetup(name="p", role="prefill", num_replicas=1, step_model=STEP,
                      num_kv_blocks=400, link_bw_bytes_per_s=1e9),
            PoolSetup(name="d", role="decode", num_replicas=1, step_model=STEP,
                      num_kv_blocks=300, link_bw_bytes_per_s=1e9)]


def _plugins(seed=0):
    return PlugIns(make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
                   router=RoundRobin(), decode_router=LeastLoaded(),
                   rng=np.random.default_rng(seed))


def test_every_replica_gets_the_settings():
    settings = EngineSettings(block_size=32, max_batched_tokens=300, max_running=7,
                              fast_forward=False, track_itl=True, kv_bytes_per_token=123.0,
                              until_s=9.0, timeline=(1.0, 2.0),
                              kv_retention=KVRetention(mode="keep", ttl_s=1.0))
    cluster = build_cluster(Simulator(), _pools(), settings, _plugins(),
                            recorder=Recorder(1.0, 2.0))
    assert len(cluster.replicas) == 4
    for r in cluster.replicas:
        assert (r.max_batched_tokens, r.max_running_total, r.until_s) == (300, 7, 9.0)
        assert r.track_itl and not r.fast_forward and r.kv.block_size == 32
        assert r.moves.kv_bytes_per_token == 123.0
        assert isinstance(r.batch_policy, TokenBudgetPlanner)
    # Each replica its own policy; kept KV only where a follow-up can land (mixed).
    assert len({id(r.batch_policy) for r in cluster.replicas}) == 4
    assert [r.kept is not None for r in cluster.replicas] == [True, True, False, False]


def test_simulate_with_settings_equals_the_keyword_form():
    rng = np.random.default_rng(1)
    n = 60
    w = make_workload(np.cumsum(rng.exponential(0.02, n)), rng.integers(1, 500, n),
                      rng.integers(1, 80, n))
    settings = EngineSettings(block_size=16, max_batched_tokens=512, max_running=16,
                              kv_bytes_per_token=1000.0, debug=True)
    a, _ = simulate(w, _pools(), settings, _plugins())
    b, _ = simulate_cluster(
        w, _pools(), router=RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(0), kv_bytes_per_token=1000.0, link_latency_s=0.0,
        block_size=16, max_batched_tokens=512, max_running=16, debug=True)
    for key, col in a.requests.items():
        assert np.array_equal(col, b.requests[key], equal_nan=True), key
    assert a.requests["finish_s"].size == n


@pytest.mark.parametrize(("field", "value"), [("block_size", 0), ("max_batched_tokens", -1),
                                              ("max_running", 0), ("kv_bytes_per_token", -1.0),
                                              ("link_latency_s", math.nan),
                                              ("frontend_overhead_s", -0.5)])
def test_bad_settings_name_the_field_and_value(field, value):
    kw = {"block_size": 16, "max_batched_tokens": 64, "max_running": 4, field: value}
    with pytest.raises(ValueError, match=rf"{field} must be >= \d, got {value}"):
        EngineSettings(**kw)


def test_engine_settings_follow_the_config():
    cfg = config_from_dict({"model": "llama-3.1-8b",
                            "engine": {"block_size": 32, "max_running": 9, "debug": True},
                            "cluster": {"link": {"latency_s": 0.003}}})
    from fleetsim.models import get_model

    model = get_model(cfg.model)
    s = engine_settings(cfg, model)
    assert (s.block_size, s.max_running, s.debug, s.link_latency_s) == (32, 9, True, 0.003)
    assert s.max_batched_tokens == cfg.engine.max_batched_tokens
    assert s.kv_bytes_per_token == model.kv_bytes_per_token()


def test_run_takes_a_workload_object_as_it_would_read_its_trace(tmp_path):
    rng = np.random.default_rng(3)
    n = 80
    # From 0 s, as a trace file is read (the loader rebases arrivals; a given workload's
    # times are kept as they are).
    w = make_workload(np.concatenate([[0.0], np.cumsum(rng.exponential(0.05, n - 1))]),
                      rng.integers(1, 2000, n), rng.integers(1, 300, n))
    path = tmp_path / "w.csv"
    save_generic_csv(w, path)
    base = {"model": "llama-3.1-8b", "workload": {"rate_scale": 2.0, "max_requests": 70}}
    from_file = run(config_from_dict({**base, "workload": {
        **base["workload"], "trace": str(path), "format": "generic"}}))
    given = run(config_from_dict(base), workload=w)
    for key, col in from_file.records.requests.items():
        assert np.array_equal(col, given.records.requests[key], equal_nan=True), key
    assert given.summary["num_requests"] == 70  # the config's scaling and slicing applied
    assert given.config["workload"]["given"] == w.name
    assert given.config["workload"]["trace"] is None


def test_run_refuses_a_workload_with_programs():
    cfg = config_from_dict({"model": "llama-3.1-8b",
                            "programs": {"generator": "tool_chain", "num_programs": 2}})
    w = make_workload(np.zeros(1), np.array([10]), np.array([5]))
    with pytest.raises(ValueError, match="either a workload or a config with programs"):
        run(cfg, workload=w)
