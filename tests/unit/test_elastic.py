"""Elastic engine: what joining, leaving and flipping cost, and what they refuse."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from tests.conftest import make_workload
from tests.unit.test_cluster import pools, sim

from fleetsim.serving.elastic import RETIRED, SERVING, ElasticCluster, ElasticPool


class At:
    """A controller that calls ``act(elastic, now_s)`` at each of ``times``."""

    def __init__(self, times, act, weight_bytes=1e9, startup_s=0.0):
        self.times = list(times)
        self.act = act
        self.weight_bytes = weight_bytes
        self.startup_s = startup_s
        self.elastic = None

    def start(self, cluster):
        setups = {p.name: p for p in self.setups}
        self.elastic = ElasticCluster(
            cluster, {n: ElasticPool(setup=s, weight_bytes=self.weight_bytes,
                                     num_gpus_per_replica=2) for n, s in setups.items()},
            startup_s=self.startup_s)
        return self.times[0]

    def on_tick(self, cluster, now_s):
        self.act(self.elastic, now_s)
        self.times.pop(0)
        return self.times[0] if self.times else None


def run_with(w, setup, ctl, **kw):
    ctl.setups = setup
    return sim(w, setup, controllers=[ctl], **kw)


def steady(n=40, gap_s=0.05, prompt=200, out=40):
    return make_workload([i * gap_s for i in range(n)], [prompt] * n, [out] * n)


def test_host_load_takes_weight_bytes_over_pcie_then_startup():
    setup = [replace(p, host_bw_bytes_per_s=4e9) for p in pools(mixed=1)]
    ctl = At([0.1], lambda e, t: e.add("m"), weight_bytes=2e9, startup_s=0.25)
    rec, cluster = run_with(steady(), setup, ctl)
    tl = {e["action"]: e for e in ctl.elastic.timeline}
    assert tl["loaded"]["load_s"] == pytest.approx(2e9 / 4e9)
    assert tl["ready"]["time_s"] == pytest.approx(0.1 + 0.5 + 0.25)
    late = rec.requests["arrival_s"] > 0.85
    # Round robin now alternates over two replicas: the new one serves arrivals after ready.
    assert set(rec.requests["replica_id"][late].tolist()) == {0, 1}
    assert (rec.requests["replica_id"][~late] == 0).all()


def test_peer_load_crosses_the_peers_link_not_pcie():
    setup = [replace(p, host_bw_bytes_per_s=1e9) for p in pools(mixed=1, bw=8e9)]
    ctl = At([0.1], lambda e, t: e.add("m", load_from="peer"), weight_bytes=2e9)
    run_with(steady(), setup, ctl, kv_bytes_per_token=0.0)
    tl = {e["action"]: e for e in ctl.elastic.timeline}
    assert tl["loaded"]["load_from"] == "peer 0"
    assert tl["loaded"]["load_s"] == pytest.approx(2e9 / 8e9)


def test_drain_finishes_in_flight_work_on_the_leaving_replica():
    ctl = At([0.5], lambda e, t: e.remove(1, "drain"))
    rec, cluster = run_with(steady(), pools(mixed=2), ctl)
    rep = dict(zip(rec.requests["request_id"].tolist(), rec.requests["replica_id"].tolist(),
                   strict=True))
    arrived_after = [i for i in range(40) if i * 0.05 > 0.5]
    assert all(rep[i] == 0 for i in arrived_after)
    assert rec.requests["num_preemptions"].sum() == 0  # nothing recomputed
    assert ctl.elastic.state[1] == RETIRED
    retired = next(e for e in ctl.elastic.timeline if e["action"] == "retired")
    assert retired["time_s"] > 0.5  # it finished its running requests first
    assert len(rec.requests["request_id"]) == 40


def test_requeue_drops_kv_and_recomputes_elsewhere_at_once():
    w = make_workload([0.0, 0.0], [300, 300], [400, 400])
    ctl = At([0.3], lambda e, t: e.remove(1, "requeue"))
    rec, cluster = run_with(w, pools(mixed=2), ctl)
    retired = next(e for e in ctl.elastic.timeline if e["action"] == "retired")
    # GPUs back once the step in flight ends (its work on the request is lost).
    assert 0.3 < retired["time_s"] < 0.302
    assert ctl.elastic.num_requeued == 1
    moved = rec.requests["request_id"].tolist().index(1)
    assert rec.requests["replica_id"][moved] == 0
    assert rec.requests["num_preemptions"][moved] == 1
    assert rec.requests["num_recomputed_tokens"][moved] > 0
    # GPU-seconds: 2 GPUs each; replica 1 stopped at 0.3 s.
    end_s = float(rec.requests["finish_s"].max())
    assert ctl.elastic.gpu_seconds(end_s) == pytest.approx(2 * retired["time_s"] + 2 * end_s)


def test_flip_turns_a_prefill_replica_into_a_decode_one_after_a_reload():
    setup = [replace(p, host_bw_bytes_per_s=1e10) for p in pools(prefill=2, decode=1)]
    ctl = At([0.2], lambda e, t: e.flip(1, "decode"), weight_bytes=1e9)
    rec, cluster = run_with(steady(), setup, ctl)
    assert cluster.replicas[1].role == "decode"
    assert ctl.elastic.state[1] == SERVING
    actions = [e["action"] for e in ctl.elastic.timeline]
    assert actions == ["flip", "restart", "loaded", "ready"]
    ready = ctl.elastic.timeline[-1]["time_s"]
    decoded_on_1 = rec.requests["replica_id"] == 1
    assert decoded_on_1.any()
    assert (rec.requests["first_token_s"][decoded_on_1] > ready - 1).all()
    assert len(rec.requests["request_id"]) == 40


def test_the_last_serving_stage_replica_never_leaves():
    def act(e, t):
        with pytest.raises(ValueError, match="last serving replica"):
            e.remove(2)  # the only decode replica, while prefill replicas serve
        e.remove(0)
        with pytest.raises(ValueError, match="last serving replica"):
            e.remove(1)  # now the only entry replica
        with pytest.raises(ValueError, match="not serving"):
            e.remove(0)
    ctl = At([0.2], act)
    rec, _ = run_with(steady(), pools(prefill=2, decode=1), ctl)
    assert len(rec.requests["request_id"]) == 40


def test_static_cluster_has_no_elastic_state_and_costs_nothing():
    ctl = At([0.1], lambda e, t: None)
    rec, _ = run_with(steady(), pools(mixed=2), ctl)
    base, _ = sim(steady(), pools(mixed=2))
    for col, values in base.requests.items():
        assert (values == rec.requests[col]).all() or math.isnan(values[0]), col
    assert ctl.elastic.timeline == []


def test_reshape_replaces_a_replica_by_one_of_another_tp_once_its_gpus_are_free():
    from fleetsim.perf.base import LinearStepModel
    from fleetsim.serving.cluster import PoolSetup

    big = PoolSetup(name="tp4", role="mixed", num_replicas=0,
                    step_model=LinearStepModel(0.001, 2e-5, 5e-8), num_kv_blocks=8000,
                    link_bw_bytes_per_s=math.inf, host_bw_bytes_per_s=1e10)
    setup = [*pools(mixed=2), big]
    ctl = At([0.5], lambda e, t: e.reshape(1, "tp4"), weight_bytes=1e9)
    rec, cluster = run_with(steady(), setup, ctl)
    e = ctl.elastic
    retired = next(t for t in e.timeline if t["action"] == "retired")
    add = next(t for t in e.timeline if t["action"] == "add")
    assert add["time_s"] == retired["time_s"] and add["pool"] == "tp4"
    assert [t["action"] for t in e.timeline][0] == "reshape"
    assert cluster.replicas[2].pool == "tp4" and e.state[2] == SERVING and e.state[1] == RETIRED
    assert (rec.requests["replica_id"] == 2).any()
    assert sorted(rec.requests["request_id"].tolist()) == list(range(40))
