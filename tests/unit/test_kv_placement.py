"""The KV placement service (``serving/kv_placement.py``): a prefix copy between replicas
pays the link and lands installed; a pooled replica holds an arriving request until what its
pool policy fetches has landed. Its clients (Heddle's migrations, TokenLake's pool reads) are
covered end to end in test_heddle.py and test_tokenlake.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.conftest import make_workload

from fleetsim.core.simulator import Simulator
from fleetsim.perf.base import ConstantStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import RoundRobin
from fleetsim.serving.cluster import PoolSetup, build_cluster, simulate
from fleetsim.serving.kv_placement import PoolFetch
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request
from fleetsim.serving.settings import EngineSettings, PlugIns

SEG = 64
BW = 1e6  # bytes/s per replica link
KV_BYTES = 100.0  # per token


def _settings(**kw):
    return EngineSettings(block_size=16, max_batched_tokens=512, max_running=8,
                          kv_bytes_per_token=KV_BYTES, debug=True, **kw)


def _plugins():
    return PlugIns(make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
                   router=RoundRobin())


def _cluster(blocks=(100, 100), hash_block_tokens=SEG):
    sim = Simulator()
    pools = [PoolSetup(name=f"r{i}", role="mixed", num_replicas=1,
                       step_model=ConstantStepModel(0.01), num_kv_blocks=b,
                       link_bw_bytes_per_s=BW) for i, b in enumerate(blocks)]
    cluster = build_cluster(sim, pools, _settings(), _plugins(), recorder=Recorder(),
                            hash_block_tokens=hash_block_tokens)
    return sim, cluster


def test_a_prefix_copy_pays_the_link_and_lands_cached():
    sim, cluster = _cluster()
    ids = (11, 12, 13)
    cluster.replicas[0].kv.install(ids)
    placement = cluster.kv_placement
    assert placement.num_cached(0, ids) == 3 and placement.num_cached(1, ids) == 0
    landed = []
    placement.copy_prefix(0, 1, ids, lambda n, b: landed.append((sim.now_s, n, b)))
    sim.run()
    num_bytes = 3 * SEG * KV_BYTES
    assert landed == [(pytest.approx(num_bytes / BW), 3, num_bytes)]
    assert placement.num_cached(1, ids) == 3
    assert cluster.transfers.num_bytes_by_client["kv_migrate"] == num_bytes
    # Installed as unreferenced entries: the blocks are taken but evictable.
    assert cluster.replicas[1].kv.num_available_blocks == 100


def test_a_copy_installs_only_what_the_destination_holds():
    sim, cluster = _cluster(blocks=(100, 8))  # 8 blocks = 2 segments of 4 blocks
    ids = (1, 2, 3)
    cluster.replicas[0].kv.install(ids)
    landed = []
    cluster.kv_placement.copy_prefix(0, 1, ids, lambda n, b: landed.append(n))
    sim.run()
    assert landed == [2] and cluster.kv_placement.num_cached(1, ids) == 2


def test_a_copy_needs_hash_blocks():
    _, cluster = _cluster(hash_block_tokens=None)
    with pytest.raises(ValueError, match="no hash blocks"):
        cluster.kv_placement.copy_prefix(0, 1, (1,), lambda n, b: None)


class _FetchFromZero:
    """A pool policy: every request arriving at replica 1 first reads 1 MB from replica 0."""

    def __init__(self):
        self.calls = []

    def plan_fetch(self, kv, replica_id, req, now_s):
        return PoolFetch(((0, 1e6),)) if replica_id == 1 else None

    def landed(self, replica_id, req, num_copied, num_without_room, now_s):
        self.calls.append((replica_id, req.id, num_copied, num_without_room, now_s))


def test_a_pooled_replica_queues_a_request_once_its_fetch_lands():
    policy = _FetchFromZero()

    class Joining(RoundRobin):
        def attach(self, cluster):
            cluster.kv_placement.join_pool([0, 1], policy)

    w = make_workload(np.array([0.0, 0.0]), np.array([32, 32]), np.array([2, 2]),
                      hash_ids=[[1], [2]], hash_block_tokens=SEG)
    pools = [PoolSetup(name="m", role="mixed", num_replicas=2,
                       step_model=ConstantStepModel(0.01), num_kv_blocks=50,
                       link_bw_bytes_per_s=BW)]
    plugins = PlugIns(make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
                      router=Joining())
    records, _ = simulate(w, pools, _settings(), plugins)
    req = records.requests
    row = {int(r): i for i, r in enumerate(req["request_id"])}
    first = req["first_scheduled_s"]
    assert first[row[0]] == 0.0  # replica 0: no fetch
    assert first[row[1]] == pytest.approx(1.0)  # replica 1: 1 MB at 1 MB/s first
    assert policy.calls == [(1, 1, 0, 0, pytest.approx(1.0))]
    assert not math.isnan(req["finish_s"][row[1]])


def test_the_request_waits_in_no_queue_while_its_fetch_runs():
    policy = _FetchFromZero()
    sim, cluster = _cluster()
    cluster.kv_placement.join_pool([0, 1], policy)
    req = Request(id=5, arrival_s=0.0, num_prompt_tokens=32, max_output_tokens=2)
    cluster.replicas[1].submit(req)
    replica = cluster.replicas[1]
    assert replica.holds(5) and not replica.waiting and not replica.running
    sim.run(0.5)
    assert not replica.waiting and not replica.running
    sim.run(1.0 + 1e-9)
    assert policy.calls == [(1, 5, 0, 0, pytest.approx(1.0))]
    assert replica.running == [req] and req.first_scheduled_s == pytest.approx(1.0)
