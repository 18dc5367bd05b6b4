"""The engine's seams for research policies: swap to host memory, migration between
replicas, request sources told of finishes, controllers that change policies at run time,
and the online metrics they read."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.conftest import by_id, make_workload
from tests.unit.test_cluster import PREFILL, pools, random_workload

from fleetsim.errors import PlanError
from fleetsim.policies import StepPlan, TokenBudgetPlanner, make_ordering
from fleetsim.policies.batch_steps import admit_waiting
from fleetsim.policies.routing import LeastLoaded, RoundRobin
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.request import Request

KV_BYTES_PER_TOKEN = 1000.0
PCIE_BYTES_PER_S = 1e8  # 100 KB per ms: a 64-token swap takes 0.64 ms


class SwapOnPressure:
    """Decode-first planner that swaps the worst running request out to host memory when
    KV runs short (instead of recomputing it), and swaps the oldest back in when there is
    room again (before admitting anyone new)."""

    splits_prompts = True

    def plan(self, view, now_s):
        kv = view.kv
        avail, budget = kv.num_available_blocks, view.max_batched_tokens
        tokens, swap_out, swap_in = {}, (), ()
        running = list(view.running)
        for req in running:
            n = min(req.num_tokens_to_next_output, budget)
            need = kv.blocks_needed(req, n)
            if need > avail:
                victim = running[-1]
                if view.num_free_host_blocks >= kv.num_blocks_for(victim.num_computed_tokens):
                    swap_out = (victim.id,)
                    tokens.pop(victim.id, None)
                break
            tokens[req.id] = n
            budget -= n
            avail -= need
            if not budget:
                break
        if not swap_out and view.swapped:
            back = view.swapped[0]
            need = kv.num_blocks_for(back.num_computed_tokens) + 1
            if need <= avail and len(running) < view.max_running:
                swap_in = (back.id,)
        elif not swap_out:
            admit_waiting(view, tokens, budget, avail, budget, chunked=True)
        return StepPlan(tokens, swap_out=swap_out, swap_in=swap_in)


def _run(workload, policy, *, host_blocks, blocks=40, router=None, replicas=1, max_running=8,
         **kw):
    setup = [PoolSetup(name="m", role="mixed", num_replicas=replicas, step_model=PREFILL,
                       num_kv_blocks=blocks, link_bw_bytes_per_s=1e9,
                       num_host_kv_blocks=host_blocks, host_bw_bytes_per_s=PCIE_BYTES_PER_S)]
    return simulate_cluster(
        workload, setup, router=router or RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=lambda: policy() if isinstance(policy, type) else policy,
        order_key=make_ordering("fcfs"), rng=np.random.default_rng(0),
        kv_bytes_per_token=KV_BYTES_PER_TOKEN, link_latency_s=0.0, block_size=16,
        max_batched_tokens=256, max_running=max_running, debug=True, **kw)


def test_swapping_keeps_work_instead_of_recomputing_it():
    """KV too small for all at once: requests are swapped out and back, none recomputed,
    all finish, and GPU and host blocks all come back."""
    w = make_workload([0.0] * 6, [100] * 6, [80] * 6)
    rec, cluster = _run(w, SwapOnPressure, host_blocks=200)
    r = rec.requests
    assert len(r["request_id"]) == 6
    assert r["num_swaps"].sum() > 0
    assert r["num_recomputed_tokens"].sum() == 0 and r["num_preemptions"].sum() == 0
    assert (r["num_computed_tokens"] == r["num_prompt_tokens"] + r["num_output_tokens"]
            - 1).all()
    moved = cluster.transfers.num_bytes_by_client
    assert moved["swap_out"] == moved["swap_in"] > 0
    replica = cluster.replicas[0]
    assert replica.kv.num_used_blocks == 0 and not replica.swapped
    assert replica.host.num_free_blocks == replica.host.num_blocks


def test_a_swap_takes_its_bytes_over_the_pcie_link():
    """A request swapped out right after its first token and straight back in finishes
    later by exactly two copies of its 64 computed tokens' KV over the PCIe link."""
    calls = []

    class SwapAfterFirstToken:
        splits_prompts = True

        def plan(self, view, now_s):
            running = view.running
            if not calls and running and running[0].num_output_tokens > 0:
                calls.append(now_s)
                return StepPlan({}, swap_out=(running[0].id,))
            if view.swapped:
                return StepPlan({}, swap_in=(view.swapped[0].id,))
            return TokenBudgetPlanner().plan(view, now_s)

    w = make_workload([0.0], [64], [3])
    rec, cluster = _run(w, SwapAfterFirstToken(), host_blocks=10)
    plain, _ = _run(w, TokenBudgetPlanner(), host_blocks=10)
    copy_s = 64 * KV_BYTES_PER_TOKEN / PCIE_BYTES_PER_S
    delay = by_id(rec, "finish_s")[0] - by_id(plain, "finish_s")[0]
    assert delay == pytest.approx(2 * copy_s, rel=1e-9)
    assert by_id(rec, "first_token_s") == by_id(plain, "first_token_s")
    assert by_id(rec, "num_swaps")[0] == 1
    assert cluster.transfers.num_bytes_by_client["swap_out"] == 64 * KV_BYTES_PER_TOKEN


def test_swap_without_a_host_tier_is_a_plan_error():
    class SwapAlways(SwapOnPressure):
        def plan(self, view, now_s):
            if view.running:
                return StepPlan({}, swap_out=(view.running[0].id,))
            return SwapOnPressure.plan(self, view, now_s)

    w = make_workload([0.0], [64], [8])
    with pytest.raises(PlanError, match="no host KV tier"):
        _run(w, SwapAlways(), host_blocks=0)


class MigrateEvenIds:
    """Token-budget planning, but every even request that is decoding on replica 0 is
    moved to replica 1 (a stand-in for a load-balancing migration policy)."""

    splits_prompts = True

    def __init__(self):
        self.inner = TokenBudgetPlanner()

    def plan(self, view, now_s):
        if view.replica_id == 0:
            movers = tuple((r.id, 1) for r in view.running
                           if r.id % 2 == 0 and r.num_output_tokens > 0)
            if movers:
                return StepPlan({}, migrate=movers)
        return self.inner.plan(view, now_s)


class ToZero:
    def route(self, view, req, now_s):
        return 0


def test_migration_moves_running_requests_and_their_kv():
    w = make_workload([0.0, 0.0, 0.1, 0.2], [40, 40, 40, 40], [20, 20, 20, 20])
    rec, cluster = _run(w, MigrateEvenIds, host_blocks=0, blocks=100, replicas=2,
                        router=ToZero())
    finished_on = by_id(rec, "replica_id")
    assert finished_on == {0: 1, 1: 0, 2: 1, 3: 0}
    assert by_id(rec, "prefill_replica_id") == {0: 0, 1: 0, 2: 0, 3: 0}
    assert cluster.transfers.num_bytes_by_client["kv_handoff"] > 0
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0


class FollowUps:
    """A two-call program per seed request: when a first call finishes, its follow-up
    arrives after a 0.5 s tool call, with the first call's prompt and output as prefix."""

    wants_finishes = True

    def __init__(self, seeds):
        self.seeds = seeds
        self.parent_of = {}
        self.log = []

    @property
    def num_requests(self):
        return None

    def start(self, ctx):
        for t, prompt in self.seeds:
            ctx.submit_at(t, Request(id=ctx.new_request_id(), arrival_s=t,
                                     num_prompt_tokens=prompt, max_output_tokens=4))

    def on_arrival(self, req, ctx):
        self.log.append(("arrive", req.id, ctx.now_s))

    def on_finish(self, req, ctx):
        self.log.append(("finish", req.id, ctx.now_s))
        if req.id in self.parent_of:
            return
        t = ctx.now_s + 0.5
        child = Request(id=ctx.new_request_id(), arrival_s=t,
                        num_prompt_tokens=req.num_prompt_tokens + req.num_output_tokens + 10,
                        max_output_tokens=2)
        self.parent_of[child.id] = req.id
        ctx.submit_at(t, child)


def test_a_source_hears_of_finishes_and_adds_requests():
    source = FollowUps([(0.0, 30), (0.2, 50)])
    w = make_workload([0.0], [1], [1])  # ignored: the source feeds the cluster
    rec, _ = simulate_cluster(
        w, pools(mixed=1), router=RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
        block_size=16, max_batched_tokens=512, max_running=8, debug=True, source=source)
    finish = by_id(rec, "finish_s")
    arrival = by_id(rec, "arrival_s")
    assert sorted(finish) == [0, 1, 2, 3]  # ids from the simulation, in creation order
    for child, parent in source.parent_of.items():
        assert arrival[child] == pytest.approx(finish[parent] + 0.5)
        assert finish[child] > arrival[child]


class SwitchToSJF:
    """At 1 s, switch every replica to shortest-job-first and note what finished by then."""

    def __init__(self):
        self.seen = []

    def start(self, cluster):
        return 1.0

    def on_tick(self, cluster, now_s):
        self.seen.append((now_s, cluster.metrics.num_finished,
                          [v.load_tokens for v in cluster.views]))
        cluster.set_policies(order_key=make_ordering("sjf"))
        return


def test_a_controller_changes_the_ordering_at_run_time():
    """Four long and four short requests all arrive by 0.05 s on a replica that runs one at
    a time: FCFS serves them in arrival order; switched to SJF at 1 s, the waiting shorts
    go first."""
    n = 8
    outputs = [200, 200, 200, 200, 5, 5, 5, 5]
    w = make_workload(np.linspace(0, 0.05, n), [16] * n, outputs)
    controller = SwitchToSJF()
    kw = dict(router=RoundRobin(), decode_router=LeastLoaded(),
              make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
              rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
              block_size=16, max_batched_tokens=512, max_running=1, debug=True)
    fcfs, _ = simulate_cluster(w, pools(mixed=1), **kw)
    switched, _ = simulate_cluster(w, pools(mixed=1), controllers=[controller], **kw)
    order = lambda rec: [int(i) for i in rec.requests["request_id"]]  # noqa: E731
    assert order(fcfs) == list(range(n))
    first_done = [i for i in order(switched) if by_id(switched, "finish_s")[i] <= 1.0]
    after = [i for i in order(switched) if i not in first_done]
    # The long request running at the switch finishes (no preemption for ordering), then
    # the shorts jump ahead of the longs still waiting.
    assert outputs[after[0]] == 200 and after[1:5] == [4, 5, 6, 7]
    assert all(outputs[i] == 200 for i in after[5:]) and after[5:]
    (tick_s, finished_then, loads), = controller.seen
    assert tick_s == 1.0 and finished_then == len(first_done) and sum(loads) > 0


def test_event_kinds_are_open_and_collisions_are_named():
    from fleetsim.core.simulator import Simulator

    sim = Simulator()
    sim.on(7, lambda p: None, "my_component")
    with pytest.raises(ValueError, match="my_component"):
        sim.on(7, lambda p: None, "another")


def test_a_router_returning_a_bad_index_is_named():
    from fleetsim.errors import FleetsimInputError

    class Broken:
        def route(self, view, req, now_s):
            return len(view.replicas)

    with pytest.raises(FleetsimInputError, match=r"cluster.router \(Broken\).*0 to 1"):
        _run(random_workload(5), TokenBudgetPlanner(), host_blocks=0, replicas=2,
             router=Broken())


def test_online_metrics_match_the_final_records():
    class Reader:
        def __init__(self):
            self.metrics = None

        def start(self, cluster):
            self.metrics = cluster.metrics
            return

    reader = Reader()
    rec, _ = _run(random_workload(40), TokenBudgetPlanner(), host_blocks=0, replicas=2,
                  blocks=200,
                  controllers=[reader])
    r = rec.requests
    assert reader.metrics.num_finished == len(r["request_id"])
    assert reader.metrics.mean_e2e_s("m") == pytest.approx(
        float(np.mean(r["finish_s"] - r["arrival_s"])))
    assert math.isnan(reader.metrics.mean_ttft_s("nowhere"))


class MoveEverythingAt:
    """At ``at_s``, a controller moves every request of replica 0 to replica 1."""

    def __init__(self, at_s):
        self.at_s = at_s
        self.moved = []

    def start(self, cluster):
        return self.at_s

    def on_tick(self, cluster, now_s):
        r0 = cluster.replicas[0]
        ids = [r.id for r in [*r0.running, *r0.waiting]]
        self.moved = ids
        cluster.migrate(ids, 1)
        return


def test_a_controller_migrates_running_and_waiting_requests():
    """Everything on replica 0 at 0.1 s (two running, four waiting: two slots) moves to
    replica 1: running requests with their KV at the next step boundary, waiting ones at
    once; all finish there, KV freed on both."""
    w = make_workload([0.0] * 6, [40] * 6, [300] * 6)
    controller = MoveEverythingAt(0.1)
    rec, cluster = _run(w, TokenBudgetPlanner(), host_blocks=0, blocks=200, replicas=2,
                        router=ToZero(), controllers=[controller], max_running=2)
    finished_on = by_id(rec, "replica_id")
    assert controller.moved and all(finished_on[i] == 1 for i in controller.moved)
    assert len(finished_on) == 6
    assert cluster.transfers.num_bytes_by_client.get("kv_handoff", 0) > 0
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0
