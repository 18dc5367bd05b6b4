"""Elastic clusters under random reconfiguration schedules: every request finishes exactly
once, all KV comes back, and decode fast-forward equals stepping one at a time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_cluster import pools, random_workload, sim

from fleetsim.serving.elastic import LEAVING, SERVING, ElasticCluster, ElasticPool

OPS = st.tuples(
    st.floats(0.0, 4.0), st.sampled_from(["add", "remove", "flip", "reshape"]),
    st.integers(0, 7), st.sampled_from(["drain", "requeue"]),
    st.sampled_from(["host", "peer"]), st.sampled_from(["mixed", "prefill", "decode"]))


class RandomSchedule:
    """Applies ``ops`` (time, verb, which, rule, load_from, role) in time order, skipping
    the ones that do not apply (no such replica, the last of its stage)."""

    def __init__(self, ops, weight_bytes):
        self.ops = sorted(ops, key=lambda op: op[0])
        self.weight_bytes = weight_bytes
        self.elastic: ElasticCluster | None = None
        self.applied: list[tuple] = []

    def start(self, cluster):
        setups = {r.pool: r for r in cluster.replicas}
        self._pools = {name: ElasticPool(setup=self._setups[name], weight_bytes=self.weight_bytes,
                                         num_gpus_per_replica=1) for name in setups}
        self.elastic = ElasticCluster(cluster, self._pools, startup_s=0.01)
        return self.ops[0][0] if self.ops else None

    def on_tick(self, cluster, now_s):
        e = self.elastic
        while self.ops and self.ops[0][0] <= now_s:
            _, verb, which, rule, load_from, role = self.ops.pop(0)
            serving = e.replicas_in(SERVING)
            if verb == "add":
                pool = sorted(self._pools)[which % len(self._pools)]
                # A mixed cluster stays mixed; a P/D one adds either stage in either pool.
                e.add(pool, None if pool == "m" or role == "mixed" else role, load_from)
                self.applied.append((now_s, verb))
            elif serving:
                r = serving[which % len(serving)]
                if not e.can_leave(r.replica_id):
                    continue
                if verb == "remove":
                    e.remove(r.replica_id, rule)
                elif verb == "reshape":  # (into its own pool: the mechanics are the same)
                    e.reshape(r.replica_id, r.pool, rule, load_from)
                elif r.role != role and r.pool != "m" and role != "mixed":
                    e.flip(r.replica_id, role, rule)
                else:
                    continue
                self.applied.append((now_s, verb))
        return max(self.ops[0][0], now_s + 1e-9) if self.ops else None


def run_elastic(w, setup, ops, fast_forward, weight_bytes=5e6):
    sched = RandomSchedule(ops, weight_bytes)
    sched._setups = {p.name: p for p in setup}
    rec, cluster = sim(w, setup, max_running=8, fast_forward=fast_forward,
                       controllers=[sched])
    return rec, cluster, sched


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 80), rate=st.sampled_from([20.0, 200.0]),
       shape=st.sampled_from(["mixed", "pd"]), blocks=st.sampled_from([80, 2000]),
       ops=st.lists(OPS, max_size=8))
def test_reconfigured_runs_finish_every_request_once_and_match_stepping(
        seed, n, rate, shape, blocks, ops):
    w = random_workload(n, seed=seed, rate=rate)
    base = (pools(mixed=2, blocks=blocks) if shape == "mixed"
            else pools(prefill=1, decode=1, blocks=blocks, bw=1e9))
    setup = [replace(p, host_bw_bytes_per_s=1e8) for p in base]
    fast, cluster, sched = run_elastic(w, setup, ops, True)
    slow, _, _ = run_elastic(w, setup, ops, False)
    ids = fast.requests["request_id"]
    assert sorted(ids.tolist()) == list(range(n))  # each exactly once
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
        assert replica.load_tokens == 0
        assert sched.elastic.state[replica.replica_id] != LEAVING
    out = fast.requests["num_output_tokens"]
    assert np.array_equal(out, np.asarray(w.num_output_tokens)[ids])
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert sched.elastic.timeline == run_elastic(w, setup, ops, True)[2].elastic.timeline


def run_planned(w, setup, schedule, planner_name, rule, fast_forward):
    from fleetsim.policies.planners import make_planner, make_trigger
    from fleetsim.registry import PolicySpec
    from fleetsim.serving.elastic_control import (
        ControlSettings,
        ElasticController,
        GpuChange,
        elastic_pools,
    )

    config = ControlSettings(
        schedule=tuple(GpuChange(at_s=t, pool=setup[i % len(setup)].name, num_gpus=g)
                       for t, i, g in schedule),
        monitor_interval_s=0.5, leave_rule=rule)
    ctl = ElasticController(
        config, elastic_pools(setup, {p.name: 1e6 for p in setup}, {p.name: 1 for p in setup}),
        planner=make_planner(PolicySpec(name=planner_name)),
        trigger=make_trigger(PolicySpec(name="always")), block_size=16, max_running=8)
    rec, cluster = sim(w, setup, max_running=8, fast_forward=fast_forward, controllers=[ctl])
    return rec, cluster, ctl


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 80), rate=st.sampled_from([20.0, 200.0]),
       shape=st.sampled_from(["mixed", "pd"]), planner=st.sampled_from(["sla", "concurrency"]),
       rule=st.sampled_from(["drain", "requeue"]),
       schedule=st.lists(st.tuples(st.floats(0.0, 3.0), st.integers(0, 1), st.integers(1, 4)),
                         max_size=4))
def test_planned_runs_finish_every_request_once_and_match_stepping(
        seed, n, rate, shape, planner, rule, schedule):
    w = random_workload(n, seed=seed, rate=rate)
    base = (pools(mixed=1, blocks=2000) if shape == "mixed"
            else pools(prefill=1, decode=1, blocks=2000, bw=1e9))
    setup = [replace(p, host_bw_bytes_per_s=1e8) for p in base]
    fast, cluster, ctl = run_planned(w, setup, schedule, planner, rule, True)
    slow, _, ctl_slow = run_planned(w, setup, schedule, planner, rule, False)
    assert sorted(fast.requests["request_id"].tolist()) == list(range(n))
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert ctl.elastic.timeline == ctl_slow.elastic.timeline
