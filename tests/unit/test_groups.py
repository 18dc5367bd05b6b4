"""Instance groups (serving/groups.py): a group of one member at a fixed degree is today's
replica, request by request, stepping and fast-forwarding; allocations that change at run
time stay exact under fast-forward, conserve KV and are checked."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from tests.conftest import make_workload

from fleetsim.errors import FleetsimInputError, PlanError
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_group_planner, make_ordering
from fleetsim.policies.group_planners import FixedGroup
from fleetsim.policies.routing import RoundRobin
from fleetsim.registry import PolicySpec
from fleetsim.serving.cluster import PoolSetup, simulate
from fleetsim.serving.contract import GroupPlan, GroupView
from fleetsim.serving.groups import GroupSetup
from fleetsim.serving.settings import EngineSettings, PlugIns

BLOCKS = 300  # per instance


def model_for(degree: int) -> LinearStepModel:
    """A member of k instances: linear terms k times faster, the fixed cost unchanged."""
    return LinearStepModel(0.002, 5e-5 / degree, 1e-7 / degree)


def workload(n=150, seed=0, rate=30.0, long_every=0):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 600, n)
    if long_every:
        prompts[::long_every] = 3000
    fam = rng.integers(0, 4, n)
    hashes = [[int(f) * 1000 + j for j in range(-(-int(p) // 64))]
              for p, f in zip(prompts, fam, strict=True)]
    return make_workload(np.cumsum(rng.exponential(1 / rate, n)), prompts,
                         rng.integers(1, 150, n), hash_ids=hashes, hash_block_tokens=64)


def run(wl, *, num_instances=1, blocks=BLOCKS, degree=1, group=None, fast_forward=True,
        max_running=32):
    settings = EngineSettings(block_size=16, max_batched_tokens=512, max_running=max_running,
                              fast_forward=fast_forward, debug=True)
    plugins = PlugIns(make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
                      router=RoundRobin())
    pool = PoolSetup(name="g", role="mixed", num_replicas=num_instances,
                     step_model=model_for(degree), num_kv_blocks=blocks,
                     link_bw_bytes_per_s=1e12)
    return simulate(wl, [pool], settings, plugins, group=group)


COLUMNS = ("request_id", "replica_id", "first_scheduled_s", "first_token_s", "finish_s",
           "num_preemptions", "num_prefix_hit_tokens")


def same_requests(a, b) -> None:
    for col in COLUMNS:
        assert np.array_equal(a.requests[col], b.requests[col]), col


@pytest.mark.parametrize("fast_forward", [True, False])
def test_group_of_one_instance_is_the_replica(fast_forward):
    """The golden test of the port: one instance at degree 1 equals today's replica."""
    wl = workload()
    plain, _ = run(wl, fast_forward=fast_forward)
    grouped, cluster = run(wl, fast_forward=fast_forward,
                           group=GroupSetup(planner=FixedGroup(1), step_model_for=model_for))
    same_requests(plain, grouped)
    assert cluster.group is not None and cluster.group.num_regroups == 0  # nothing to change


@pytest.mark.parametrize("fast_forward", [True, False])
def test_group_at_a_fixed_degree_is_one_wider_replica(fast_forward):
    """Two instances as one member of degree 2: a replica with both instances' blocks and
    the degree-2 step model."""
    wl = workload(seed=1, rate=60.0)
    plain, _ = run(wl, blocks=2 * BLOCKS, degree=2, fast_forward=fast_forward)
    grouped, _ = run(wl, num_instances=2, fast_forward=fast_forward,
                     group=GroupSetup(planner=FixedGroup(2), step_model_for=model_for))
    same_requests(plain, grouped)


@dataclass
class WidenForLongPrompts:
    """A test planner with run-time changes: one member per instance; when a prompt of
    ``long_tokens`` or more waits, the group merges into one member of every instance,
    which takes it (the others' requests move along with their KV); when the wide member
    has nothing left, the group splits back."""

    long_tokens: int = 2000

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        n = view.num_instances
        wide = tuple(range(n))
        narrow = tuple((i,) for i in range(n))
        current = view.instances_by_member
        if any(r.num_prompt_tokens >= self.long_tokens for r in view.waiting):
            alloc = (wide,) + ((),) * (n - 1)
            return GroupPlan(alloc, tuple((r.id, 0) for r in view.waiting))
        if current[0] == wide and not view.members[0].running and not view.members[0].waiting:
            alloc = narrow
        else:
            alloc = current
        active = [m for m in range(n) if alloc[m]]
        load = {m: view.members[m].load_tokens for m in active}
        assign = []
        for r in view.waiting:
            m = min(active, key=lambda x: (load[x], x))
            assign.append((r.id, m))
            load[m] += r.num_tokens
        return GroupPlan(alloc, tuple(assign))


def test_changing_allocations_fast_forward_equals_stepping():
    wl = workload(n=200, seed=2, rate=8.0, long_every=17)
    setup = GroupSetup(planner=WidenForLongPrompts(), step_model_for=model_for)
    fast, c_fast = run(wl, num_instances=2, group=setup, fast_forward=True)
    slow, c_slow = run(wl, num_instances=2, group=setup, fast_forward=False)
    same_requests(fast, slow)
    assert c_fast.group.num_regroups == c_slow.group.num_regroups > 4
    assert len(fast.requests["request_id"]) == 200
    for member in c_fast.replicas:  # every block back, every queue empty
        assert member.kv.num_used_blocks == 0 and not member.running and not member.waiting


def test_widening_serves_long_prompts_faster_than_fixed_narrow_members():
    wl = workload(n=120, seed=3, rate=10.0, long_every=10)
    narrow, _ = run(wl, num_instances=2,
                    group=GroupSetup(planner=FixedGroup(1), step_model_for=model_for))
    wide, _ = run(wl, num_instances=2,
                  group=GroupSetup(planner=WidenForLongPrompts(), step_model_for=model_for))
    long = wl.num_prompt_tokens >= 2000

    def ttft(rec):
        order = np.argsort(rec.requests["request_id"])
        return (rec.requests["first_token_s"] - rec.requests["arrival_s"])[order]

    assert ttft(wide)[long].mean() < ttft(narrow)[long].mean()


@dataclass
class PackOntoOne:
    """A test planner that merges: arrivals alternate between two one-instance members;
    every tenth arrival, member 1's requests (and KV) merge into member 0, whose instance
    then holds both, and member 1 is off until the group is next idle."""

    num_arrivals: int = 0

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        current = view.instances_by_member
        members = view.members
        idle = all(not m.running and not m.waiting for m in members)
        if current[1] == () and idle:
            return GroupPlan(((0,), (1,)), tuple((r.id, 0) for r in view.waiting))
        assign, merge = [], ()
        alloc = current
        for r in view.waiting:
            self.num_arrivals += 1
            if alloc[1] and self.num_arrivals % 10 == 0:
                alloc, merge = ((0,), ()), ((1, 0),)
            assign.append((r.id, 1 if alloc[1] and self.num_arrivals % 2 else 0))
        return GroupPlan(alloc, tuple(assign), None, merge)


def test_merges_move_requests_with_their_kv_exactly():
    # members are 2x the golden test's size, so member 0 can hold member 1's KV
    wl = workload(n=160, seed=6, rate=8.0)
    fast, c_fast = run(wl, num_instances=2, blocks=2 * BLOCKS, group=GroupSetup(
        planner=PackOntoOne(), step_model_for=model_for), fast_forward=True)
    slow, _ = run(wl, num_instances=2, blocks=2 * BLOCKS, group=GroupSetup(
        planner=PackOntoOne(), step_model_for=model_for), fast_forward=False)
    same_requests(fast, slow)
    assert len(fast.requests["request_id"]) == 160
    assert c_fast.group.num_regroups >= 20  # merges, then splits back when idle
    for member in c_fast.replicas:
        assert member.kv.num_used_blocks == 0 and not member.running


@dataclass
class Bad:
    plan_to_return: GroupPlan

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        return self.plan_to_return


@pytest.mark.parametrize(("plan", "match"), [
    (GroupPlan(((0, 1), (1,))), "instance 1 twice"),
    (GroupPlan(((0,),)), "gives 1 members"),
    (GroupPlan(((0, 5), ())), "out of 0..1"),
    (GroupPlan(((0, 1), ()), ((0, 1),)), "assigns request 0 to member 1"),
    (GroupPlan(((0, 1), ()), ((7, 0),)), "assigns request 7 to member 0"),  # not waiting
    (GroupPlan(((0,), (1,)), (), None, ((1, 1),)), "merges member 1 into 1"),
    (GroupPlan(((0, 1), ()), (), None, ((0, 1),)), "merges member 0 into 1"),
])
def test_bad_group_plans_fail_loudly(plan, match):
    wl = workload(n=5)
    with pytest.raises(PlanError, match=match):
        run(wl, num_instances=2, group=GroupSetup(planner=Bad(plan), step_model_for=model_for))


@dataclass
class InBatches:
    """Assigns the queue to member 0 (of both instances) once ``size`` requests wait (or no
    more arrived since the last plan), the latest first, then ``extra``: assignments read
    from deep in the queue, out of order."""

    size: int
    extra: tuple[tuple[int, int], ...] = ()
    last: int = 0  # the queue's length at the last plan

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        ids = [r.id for r in view.waiting]
        grew, self.last = len(ids) > self.last, len(ids)
        if len(ids) < self.size and grew:  # (the rest of the queue once arrivals stop)
            return GroupPlan(((0, 1), ()), (), now_s + 0.05)
        if not ids:
            return GroupPlan(((0, 1), ()))
        self.last = 0
        extra = tuple((ids[0] if rid < 0 else rid, m) for rid, m in self.extra)
        return GroupPlan(((0, 1), ()), tuple((rid, 0) for rid in reversed(ids)) + extra)


def test_a_plan_may_assign_many_waiting_requests_in_any_order():
    wl = workload(n=40, rate=200.0)
    records, cluster = run(wl, num_instances=2,
                           group=GroupSetup(planner=InBatches(3), step_model_for=model_for))
    assert sorted(records.requests["request_id"]) == list(range(40))
    assert np.isfinite(records.requests["finish_s"]).all()
    assert cluster.group is not None and not cluster.group.waiting


@pytest.mark.parametrize(("extra", "match"), [
    (((-1, 0),), r"assigns request \d+ to member 0"),  # the queue's first, twice
    (((99, 0),), "assigns request 99 to member 0"),  # not in the queue
])
def test_a_plan_assigning_a_request_twice_or_not_waiting_fails_loudly(extra, match):
    with pytest.raises(PlanError, match=match):
        run(workload(n=40, rate=200.0), num_instances=2,
            group=GroupSetup(planner=InBatches(3, extra), step_model_for=model_for))


def test_group_planner_registry_checks_its_args():
    assert isinstance(make_group_planner(PolicySpec(name="fixed", args={"degree": 2})),
                      FixedGroup)
    with pytest.raises(FleetsimInputError, match="degree"):
        make_group_planner(PolicySpec(name="fixed", args={"degree": 0}))
    with pytest.raises(FleetsimInputError, match="known policies"):
        make_group_planner(PolicySpec(name="nope"))
