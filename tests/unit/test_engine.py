"""Hand-sized scenarios with exact timings (every step takes 1 s unless stated)."""

from __future__ import annotations

import math

import pytest
from tests.conftest import by_id, make_workload, simulate

from fleetsim.perf.base import ConstantStepModel, LinearStepModel
from fleetsim.policies import (
    Capabilities,
    StepPlan,
    TokenBudgetPlanner,
    capabilities_of,
    make_ordering,
)
from fleetsim.serving.driver import simulate_replica
from fleetsim.serving.replica import PlanError


@pytest.mark.parametrize("fast_forward", [False, True])
def test_chunked_prefill_splits_long_prompt(fast_forward):
    """A 300-token prompt under a 128-token budget takes three steps, then decodes."""
    w = make_workload([0.0], [300], [3])
    rec, _ = simulate(w, max_batched_tokens=128, fast_forward=fast_forward)
    assert by_id(rec, "first_token_s") == {0: 3.0}
    assert by_id(rec, "finish_s") == {0: 5.0}
    if not fast_forward:
        assert rec.timeline["num_tokens"].tolist() == [128, 128, 44, 1, 1]
    else:  # the two decode steps are one event
        assert rec.timeline["num_tokens"].tolist() == [128, 128, 44, 2]
    assert rec.num_steps == 5


def test_without_chunking_a_prompt_waits_for_a_whole_budget():
    w = make_workload([0.0, 0.0], [100, 100], [1, 1])
    rec, _ = simulate(w, max_batched_tokens=150, chunked=False)
    assert by_id(rec, "finish_s") == {0: 1.0, 1: 2.0}


def test_same_time_arrivals_share_the_first_step():
    w = make_workload([0.0, 0.0, 0.0], [10, 20, 30], [1, 1, 1])
    rec, _ = simulate(w)
    assert by_id(rec, "finish_s") == {0: 1.0, 1: 1.0, 2: 1.0}
    assert rec.timeline["num_tokens"].tolist() == [60]


@pytest.mark.parametrize("fast_forward", [False, True])
def test_arrival_at_a_step_boundary_joins_the_next_step(fast_forward):
    w = make_workload([0.0, 2.0], [16, 16], [5, 1])
    rec, _ = simulate(w, fast_forward=fast_forward)
    # request 0: prefill [0,1), decodes end at 2, 3, 4, 5; request 1 prefills in [2,3).
    assert by_id(rec, "first_scheduled_s") == {0: 0.0, 1: 2.0}
    assert by_id(rec, "finish_s") == {0: 5.0, 1: 3.0}


def test_fcfs_preempts_the_latest_arrival_and_recomputes_it():
    # 4 blocks of 16 tokens; each request grows to 16 + 39 = 55 tokens (4 blocks) alone.
    w = make_workload([0.0, 0.5], [16, 16], [40, 40])
    rec, _ = simulate(w, kv_blocks=4, block_size=16)
    pre = by_id(rec, "num_preemptions")
    assert pre[0] == 0
    assert pre[1] >= 1
    assert by_id(rec, "finish_s")[0] < by_id(rec, "finish_s")[1]
    r = rec.requests
    assert (r["num_computed_tokens"] == r["num_prompt_tokens"] + r["num_output_tokens"] - 1
            + r["num_recomputed_tokens"] - r["num_prefix_hit_tokens"]).all()
    assert by_id(rec, "num_recomputed_tokens")[1] > 0


def test_prefix_cache_hits_longest_cached_prefix_and_leaves_one_token():
    w = make_workload(
        [0.0, 10.0, 20.0, 30.0], [128, 128, 192, 128], [2, 2, 2, 2],
        hash_ids=[[1, 2], [1, 2], [1, 2, 3], [7, 8]], hash_block_tokens=64,
    )
    rec, _ = simulate(w, block_size=16)
    hits = by_id(rec, "num_prefix_hit_tokens")
    # Full hit on a 128-token prompt keeps one block to compute; a longer one reuses both.
    assert hits == {0: 0, 1: 64, 2: 128, 3: 0}
    assert by_id(rec, "num_computed_tokens") == {0: 129, 1: 65, 2: 65, 3: 129}


def test_prefix_caching_off_means_no_hits():
    w = make_workload([0.0, 10.0], [128, 128], [2, 2], hash_ids=[[1, 2], [1, 2]],
                      hash_block_tokens=64)
    rec, _ = simulate(w, prefix_caching=False)
    assert by_id(rec, "num_prefix_hit_tokens") == {0: 0, 1: 0}


@pytest.mark.parametrize(("ordering", "expected_order"),
                         [("fcfs", [0, 1, 2]), ("sjf", [1, 2, 0]), ("priority", [2, 0, 1])])
def test_ordering_decides_who_runs_first(ordering, expected_order):
    w = make_workload([0.0, 0.0, 0.0], [4, 4, 4], [10, 2, 5], priority=[1, 2, 0])
    rec, _ = simulate(w, max_running=1, ordering=ordering)
    finish = by_id(rec, "finish_s")
    assert sorted(finish, key=finish.get) == expected_order


def test_until_leaves_late_requests_unfinished():
    w = make_workload([0.0, 1.0, 100.0], [16, 16, 16], [3, 3, 3])
    rec, replica = simulate(w, until_s=50.0)
    assert sorted(by_id(rec, "finish_s")) == [0, 1]
    assert not replica.running and not replica.waiting


class _OverBudget:
    fast_forward_safe = False

    def plan(self, view, now_s):
        return StepPlan({r.id: r.num_tokens_to_next_output for r in view.waiting})


class _Unknown:
    fast_forward_safe = False

    def plan(self, view, now_s):
        return StepPlan({12345: 1})


@pytest.mark.parametrize(("policy", "message"),
                         [(_OverBudget(), "budget"), (_Unknown(), "unknown request")])
def test_engine_rejects_bad_plans(policy, message):
    w = make_workload([0.0, 0.0], [100, 100], [1, 1])
    with pytest.raises(PlanError, match=message):
        simulate_replica(w, step_model=ConstantStepModel(1.0), num_kv_blocks=100, block_size=16,
                         batch_policy=policy, order_key=make_ordering("fcfs"),
                         max_batched_tokens=150, max_running=8)


def test_request_latencies_are_consistent():
    w = make_workload([0.0, 0.3], [50, 70], [4, 1])
    rec, _ = simulate(w, step_time_s=0.25)
    r = rec.requests
    assert (r["first_token_s"] >= r["first_scheduled_s"]).all()
    assert (r["finish_s"] >= r["first_token_s"]).all()
    assert not any(math.isnan(x) for x in r["first_token_s"])


def test_arrival_cuts_a_running_window_back_to_the_step_in_progress():
    """Without stopping windows at known arrivals, the arrival at 10.5 s cuts the decode
    window of request 0 at the boundary at 11 s, exactly where step by step admits it."""
    w = make_workload([0.0, 10.5], [16, 16], [50, 2])
    # No timeline bins (they would stop windows every 10.5 / 120 s, shorter than a step).
    fast, replica = simulate(w, fast_forward=True, windows_stop_at_arrivals=False,
                             timeline=(0.0, float("inf")))
    slow, _ = simulate(w, fast_forward=False)
    assert by_id(fast, "first_scheduled_s") == {0: 0.0, 1: 11.0}
    for col, values in slow.requests.items():
        assert (values == fast.requests[col]).all(), col
    # The cut window ended at 11 s: fewer events than steps, and no step was lost.
    assert fast.num_steps == slow.num_steps
    assert len(fast.timeline["end_s"]) < len(slow.timeline["end_s"])


def test_prefill_first_pauses_decodes_while_prompts_wait():
    """vLLM v0: request 1's prefill step runs alone, so request 0's decode waits a step."""
    from fleetsim.policies import PrefillFirstPlanner

    w = make_workload([0.0, 1.5], [16, 16], [4, 2])
    rec, _ = simulate_replica(w, step_model=ConstantStepModel(1.0), num_kv_blocks=100,
                              block_size=16, batch_policy=PrefillFirstPlanner(),
                              order_key=make_ordering("fcfs"), max_batched_tokens=64,
                              max_running=8, debug=True)
    # 0: prefill [0,1), decode [1,2); 1 prefills [2,3) alone; then both decode [3,4), [4,5).
    assert by_id(rec, "first_token_s") == {0: 1.0, 1: 3.0}
    assert by_id(rec, "finish_s") == {0: 5.0, 1: 4.0}


def test_batch_stats_weight_running_requests_by_busy_time():
    from fleetsim.metrics.summary import batch_stats

    # Two 16-token prompts together, then request 0 decodes alone for 2 more steps (1 s each).
    w = make_workload([0.0, 0.0], [16, 16], [3, 1])
    rec, _ = simulate(w, fast_forward=False)
    stats = batch_stats(rec)
    assert stats["mean_running"] == pytest.approx((2 * 1 + 1 * 2) / 3)
    assert stats["mean_tokens_per_step"] == pytest.approx((32 + 1 + 1) / 3)


class _ServesOnlyTheFirst(TokenBudgetPlanner):
    """With nothing waiting, serves only the first running request: it breaks the promise
    its base class declares, but declares nothing itself."""

    def plan(self, view, now_s):
        plan = TokenBudgetPlanner.plan(self, view, now_s)
        if view.waiting or len(plan.tokens_by_request) < 2:
            return plan
        first = next(iter(plan.tokens_by_request))
        return StepPlan({first: plan.tokens_by_request[first]})


class _BrokenPromise(_ServesOnlyTheFirst):
    """The same plans, now declaring the promise they break."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)


def test_capabilities_are_not_inherited():
    assert capabilities_of(TokenBudgetPlanner()).decodes_all_when_idle
    assert capabilities_of(_ServesOnlyTheFirst()) == Capabilities()
    assert capabilities_of(_BrokenPromise()).decodes_all_when_idle


def test_a_subclass_that_declares_nothing_is_planned_every_step():
    """Its plans are followed (one request decodes at a time), with or without
    fast-forward, exactly as step by step."""
    w = make_workload([0.0, 0.0], [20, 20], [6, 6])
    kw = dict(step_model=ConstantStepModel(1.0), num_kv_blocks=100, block_size=16,
              batch_policy=_ServesOnlyTheFirst(), order_key=make_ordering("fcfs"),
              max_batched_tokens=150, max_running=8, debug=True)
    fast, _ = simulate_replica(w, **kw)
    slow, _ = simulate_replica(w, fast_forward=False, **kw)
    assert by_id(fast, "finish_s") == by_id(slow, "finish_s") == {0: 6.0, 1: 11.0}


def test_debug_mode_catches_a_policy_breaking_its_decode_all_promise():
    w = make_workload([0.0, 0.0], [20, 20], [6, 6])
    kw = dict(step_model=ConstantStepModel(1.0), num_kv_blocks=100, block_size=16,
              batch_policy=_BrokenPromise(), order_key=make_ordering("fcfs"),
              max_batched_tokens=150, max_running=8)
    simulate_replica(w, **kw)  # trusted without debug: the engine does not ask
    with pytest.raises(PlanError, match="declares decodes_all_when_idle"):
        simulate_replica(w, debug=True, **kw)


def test_a_run_cut_at_until_counts_the_steps_of_a_window_in_flight():
    """A window still running at ``until_s`` is settled there: its steps done by then are
    recorded, as step by step records them (they were lost before)."""
    w = make_workload([0.0, 0.0], [16, 16], [400, 300])
    kw = dict(step_model=LinearStepModel(0.01, 1e-4, 1e-6), until_s=2.5,
              timeline=(0.0, float("inf")))
    fast, _ = simulate(w, fast_forward=True, **kw)
    slow, _ = simulate(w, fast_forward=False, **kw)
    assert fast.num_steps == slow.num_steps > 100
    assert fast.busy_s_by_replica[0] == pytest.approx(slow.busy_s_by_replica[0], rel=1e-12)
    assert fast.kv_block_seconds_by_replica[0] == pytest.approx(
        slow.kv_block_seconds_by_replica[0], rel=1e-9)
