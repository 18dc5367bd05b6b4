"""The host-memory KV tier under vLLM's swap preemption: blocks conserved across both tiers,
no request runs while any of its KV is off the GPU, every byte swapped out comes back, and
fast-forward equals stepping one at a time with the tier on."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.conftest import make_workload

from fleetsim.core.simulator import Simulator
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, RoundRobin
from fleetsim.serving.cluster import Cluster, PoolSetup, simulate_cluster
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import RUNNING, SWAPPED, SWAPPING_IN, SWAPPING_OUT, Request

MODEL = LinearStepModel(0.01, 1e-4, 1e-6)
KV_BYTES_PER_TOKEN = 1000.0


def _pool(blocks, host_blocks, replicas=1):
    return [PoolSetup(name="m", role="mixed", num_replicas=replicas, step_model=MODEL,
                      num_kv_blocks=blocks, link_bw_bytes_per_s=1e9,
                      num_host_kv_blocks=host_blocks, host_bw_bytes_per_s=2e7,
                      host_latency_s=1e-4)]


def _sim(workload, blocks, host_blocks, fast_forward, max_running=6):
    return simulate_cluster(
        workload, _pool(blocks, host_blocks), router=RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=lambda: TokenBudgetPlanner(preemption_mode="swap"),
        order_key=make_ordering("fcfs"), rng=np.random.default_rng(0),
        kv_bytes_per_token=KV_BYTES_PER_TOKEN, link_latency_s=0.0, block_size=16,
        max_batched_tokens=128, max_running=max_running, fast_forward=fast_forward,
        debug=True)


@st.composite
def workloads(draw):
    n = draw(st.integers(2, 20))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.005, 0.05, 0.3]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 150), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    return make_workload(np.cumsum(gaps), prompts, outputs)


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), blocks=st.integers(18, 60), host_blocks=st.integers(1, 80))
def test_swapping_conserves_work_and_bytes_and_fast_forward_is_exact(workload, blocks,
                                                                     host_blocks):
    fast, cluster = _sim(workload, blocks, host_blocks, True)
    slow, _ = _sim(workload, blocks, host_blocks, False)
    r = fast.requests
    assert len(r["request_id"]) == len(workload)  # everyone finishes
    replica = cluster.replicas[0]
    assert replica.kv.num_used_blocks == 0 and not replica.swapped
    assert replica.host.num_free_blocks == replica.host.num_blocks
    moved = cluster.transfers.num_bytes_by_client
    assert moved.get("swap_out", 0.0) == moved.get("swap_in", 0.0)
    assert (moved.get("swap_out", 0.0) > 0) == (r["num_swaps"].sum() > 0)
    # Swapped work is kept: only recompute preemptions (host tier full) recompute.
    assert (r["num_recomputed_tokens"] > 0).sum() <= (r["num_preemptions"] > 0).sum()
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col


class SwappingReplica(RuleBasedStateMachine):
    """Arrivals and time advancing in any order on a replica that swaps; after every rule
    the two tiers' blocks add up and no running request has KV off the GPU."""

    def __init__(self):
        super().__init__()
        self.sim = Simulator()
        self.recorder = Recorder(0.0, math.inf)
        pools = _pool(blocks=24, host_blocks=40)

        def make_replica(**kw):
            return Replica(self.sim, batch_policy=TokenBudgetPlanner(preemption_mode="swap"),
                           order_key=make_ordering("fcfs"), recorder=self.recorder,
                           max_batched_tokens=64, max_running=5, debug=True, **kw)

        self.cluster = Cluster(
            self.sim, pools, router=RoundRobin(), decode_router=LeastLoaded(),
            rng=np.random.default_rng(0), kv_bytes_per_token=KV_BYTES_PER_TOKEN,
            link_latency_s=0.0, make_replica=make_replica, hash_block_tokens=None,
            block_size=16, enable_prefix_caching=False, recorder=self.recorder)
        self.replica = self.cluster.replicas[0]
        self.next_id = 0
        self.now = 0.0

    @rule(prompt=st.integers(1, 120), output=st.integers(1, 100))
    def arrive(self, prompt, output):
        req = Request(id=self.next_id, arrival_s=self.now, num_prompt_tokens=prompt,
                      max_output_tokens=output)
        self.next_id += 1
        self.cluster.submit_at(self.now, req)

    @rule(dt=st.sampled_from([0.001, 0.01, 0.05, 0.2]))
    def advance(self, dt):
        self.now += dt
        self.sim.run(self.now)

    @invariant()
    def tiers_conserved_and_running_kv_on_gpu(self):
        if not hasattr(self, "replica"):
            return
        replica = self.replica
        host = replica.host
        moves = replica.moves
        on_host = sum(replica.kv.num_blocks_for(r.num_computed_tokens)
                      for r in [*moves.swapped, *moves.swapping.values()])
        assert host.num_free_blocks + on_host == host.num_blocks
        assert all(r.state == SWAPPED for r in moves.swapped)
        assert all(r.state in (SWAPPING_OUT, SWAPPING_IN) for r in moves.swapping.values())
        for r in replica.running:
            assert r.state == RUNNING
            assert replica.kv.num_held_blocks(r) >= replica.kv.num_blocks_for(
                r.num_computed_tokens)

    def teardown(self):
        self.sim.run()  # drain: everyone finishes, both tiers empty
        if hasattr(self, "replica"):
            assert self.replica.kv.num_used_blocks == 0
            assert self.replica.host.num_free_blocks == self.replica.host.num_blocks
            assert len(self.recorder.records().requests["request_id"]) == self.next_id


SwappingReplica.TestCase.settings = settings(max_examples=40, stateful_step_count=30,
                                             deadline=None)
TestSwappingReplica = SwappingReplica.TestCase
