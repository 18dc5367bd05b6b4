"""Chunk runs (``serving/chunk_runs.py``): what they save, where they stop, what cuts them."""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import make_workload, simulate

from fleetsim.errors import PlanError
from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import TokenBudgetPlanner
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.chunk_runs import MIN_RUN_STEPS, RunCap

MODEL = LinearStepModel(0.004, 3e-5, 2e-7)


def _run(workload, fast_forward, **kw):
    kw = {"step_model": MODEL, "kv_blocks": 400, "max_batched_tokens": 16, **kw}
    return simulate(workload, fast_forward=fast_forward, batch_policy=TokenBudgetPlanner(),
                    **kw)


def test_a_long_prompt_is_a_few_events_not_a_step_each():
    # 4,000 prompt tokens in 16-token chunks: 250 steps, the first 249 of them the same plan
    w = make_workload([0.0], [4000], [1])
    slow, stepped = _run(w, False)
    fast, replica = _run(w, True)
    assert slow.num_steps == fast.num_steps == 250
    assert slow.requests["first_token_s"][0] == fast.requests["first_token_s"][0]
    # runs of 16, 32, 64, 128 steps (``RunCap`` doubles while runs end at it), then the
    # last steps one by one
    assert stepped.sim.num_events >= 250
    assert replica.sim.num_events <= 12


def test_an_arrival_cuts_the_run_back_and_the_rest_runs_again():
    # the second request arrives inside the long prompt's run: it waits (the running prompt
    # takes the whole budget), and the long prompt's chunks after the cut form a new run
    w = make_workload([0.0, 0.1], [2000, 40], [2, 2])
    slow, _ = _run(w, False)
    fast, replica = _run(w, True)
    for col in ("first_token_s", "finish_s", "first_scheduled_s"):
        assert np.array_equal(slow.requests[col], fast.requests[col]), col
    assert fast.num_steps == slow.num_steps
    assert replica.sim.num_events < slow.num_steps / 4


def test_decodes_ride_a_long_prompts_run():
    # two requests decode while a 3,000-token prompt is prefilled beside them in 30-token
    # chunks (the budget less their two tokens): 99 mixed steps, in three runs (16, 32,
    # 51 steps: ``RunCap`` doubles, the prompt's last chunk planned as usual)
    w = make_workload([0.0, 0.0, 0.01], [10, 12, 3000], [400, 300, 5])
    kw = {"max_batched_tokens": 32, "kv_blocks": 1000}
    slow, stepped = _run(w, False, **kw)
    fast, replica = _run(w, True, **kw)
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert np.array_equal(slow.itl_counts, fast.itl_counts)
    assert fast.num_steps == slow.num_steps == 400
    assert stepped.sim.num_events - replica.sim.num_events >= 99 - 3
    # stopped inside a run: settled to the step in progress, every running request as
    # stepping left it (service seconds added step by step, to the bit)
    _, stepped = _run(w, False, until_s=0.3, **kw)
    _, replica = _run(w, True, until_s=0.3, **kw)

    def state(rep):
        return [(r.id, r.num_computed_tokens, r.num_output_tokens, r.service_s,
                 r.num_private_blocks) for r in rep.running]

    assert len(replica.running) == 3 and state(replica) == state(stepped)
    assert replica.kv.num_used_blocks == stepped.kv.num_used_blocks


def test_a_decodes_last_token_ends_the_run_and_commits_as_stepping():
    # the decode beside the prompt has 20 tokens left: the run stops at its last one, which
    # finishes it as a step would, and the prompt's next chunks (now the whole budget) run
    w = make_workload([0.0, 0.01], [8, 2000], [21, 1])
    kw = {"max_batched_tokens": 16, "kv_blocks": 400}
    slow, stepped = _run(w, False, **kw)
    fast, replica = _run(w, True, **kw)
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert replica.sim.num_events < stepped.sim.num_events / 4


def test_no_run_where_the_plan_could_change():
    kw = {"step_model": MODEL, "kv_blocks": 400, "max_batched_tokens": 16}
    # a prompt of two chunks: its second completes it (a first token, a hand-off)
    w = make_workload([0.0], [32], [1])
    _, stepped = simulate(w, fast_forward=False, batch_policy=TokenBudgetPlanner(), **kw)
    _, replica = simulate(w, fast_forward=True, batch_policy=TokenBudgetPlanner(), **kw)
    assert replica.sim.num_events == stepped.sim.num_events
    # a chunk cap below the budget: the chunk leaves budget that admission may take
    w = make_workload([0.0], [400], [1])
    _, stepped = simulate(w, fast_forward=False,
                          batch_policy=TokenBudgetPlanner(long_prefill_token_threshold=8), **kw)
    _, replica = simulate(w, fast_forward=True,
                          batch_policy=TokenBudgetPlanner(long_prefill_token_threshold=8), **kw)
    assert replica.sim.num_events == stepped.sim.num_events
    # a prompt admitted by the plan that sorts ahead of the decode beside it (fewer outputs
    # left, ``sjf``): at the next step it takes the whole budget
    w = make_workload([0.0, 0.001], [1, 400], [30, 1])
    _, stepped = simulate(w, fast_forward=False, batch_policy=TokenBudgetPlanner(),
                          ordering="sjf", **kw)
    _, replica = simulate(w, fast_forward=True, batch_policy=TokenBudgetPlanner(),
                          ordering="sjf", **kw)
    assert replica.sim.num_events == stepped.sim.num_events


def test_the_cap_follows_the_cuts():
    cap = RunCap()
    assert cap.steps == MIN_RUN_STEPS
    cap.ended(MIN_RUN_STEPS)  # ended at its cap: twice as many next time
    assert cap.steps == 2 * MIN_RUN_STEPS
    cap.ended(3)  # ended before it (the prompt's rest): unchanged
    assert cap.steps == 2 * MIN_RUN_STEPS
    cap.cut(40)  # cut with 40 steps done: twice the steps to the one in progress
    assert cap.steps == 82
    cap.cut(0)  # never below the floor
    assert cap.steps == MIN_RUN_STEPS


def test_debug_checks_the_promise_at_each_run_boundary():
    class HalvesLongPrompts(TokenBudgetPlanner):
        """Declares the promise, then breaks it: past 64 computed tokens, half the budget."""

        capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True,
                                    prefill_chunks_repeat=True)

        def plan(self, view, now_s):
            plan = super().plan(view, now_s)
            tokens = dict(plan.tokens_by_request)
            for r in view.running:
                if r.num_computed_tokens >= 64 and tokens.get(r.id, 0) > 8:
                    tokens[r.id] = 8
            return plan._replace(tokens_by_request=tokens)

    w = make_workload([0.0], [400], [1])
    kw = {"step_model": MODEL, "kv_blocks": 400, "max_batched_tokens": 16}
    simulate(w, fast_forward=True, batch_policy=HalvesLongPrompts(), debug=False, **kw)
    with pytest.raises(PlanError, match="declares prefill_chunks_repeat"):
        simulate(w, fast_forward=True, batch_policy=HalvesLongPrompts(), debug=True, **kw)
