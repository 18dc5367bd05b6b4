"""FastServe's skip-join MLFQ: joining, demotion by attained service, preemption at
iteration boundaries without losing KV, and the baselines on the same engine."""

from __future__ import annotations

import pytest
from tests.conftest import by_id, make_workload

from fleetsim.perf.base import ConstantStepModel, LinearStepModel
from fleetsim.policies import FastServePlanner, make_ordering
from fleetsim.serving.driver import simulate_replica


def _run(workload, policy, model, **kw):
    return simulate_replica(
        workload, step_model=model, num_kv_blocks=kw.pop("blocks", 400), block_size=16,
        batch_policy=policy, order_key=make_ordering("fcfs"), max_batched_tokens=2048,
        max_running=kw.pop("max_running", 64), debug=True, **kw)


class Recording(FastServePlanner):
    """FastServe, noting each running job's level after every plan."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.levels = {}  # request id -> level after each plan

    def plan(self, view, now_s):
        plan = FastServePlanner.plan(self, view, now_s)
        for r in list(view.running) + list(view.waiting):
            self.levels.setdefault(r.id, []).append(r.policy_state.level)
        return plan


def test_skip_join_places_a_job_by_its_prefill_time():
    """A 1,000-token prefill takes 0.005 + 1000 x 2e-5 = 0.025 s: the first queue whose
    quantum covers it is level 2 (0.01 x 2^2 = 0.04 s; level 1's 0.02 s is too short).
    Without skip-join it starts at level 0."""
    for skip_join, level in ((True, 2), (False, 0)):
        policy = Recording(skip_join=skip_join)
        _run(make_workload([0.0], [1000], [1]), policy, LinearStepModel(0.005, 2e-5))
        assert policy.levels[0][0] == level


def test_levels_follow_attained_service():
    """0.25 s steps and a 0.25 s base quantum (exact in binary): a lone job is demoted after
    2, 5, 10, 19 and 36 steps; planned before its 40th step it sits at level 5 (stepping one
    plan at a time, so that every step's level is seen; windows run the steps between
    demotions without a plan)."""
    policy = Recording(base_quantum_s=0.25)
    _run(make_workload([0.0], [10], [40]), policy, ConstantStepModel(0.25), fast_forward=False)
    levels = policy.levels[0]  # one per plan; plan n + 1 sees n steps of service
    assert [levels[n] for n in (1, 2, 4, 5, 9, 10, 18, 19, 35, 36, 39)] == [
        0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]


@pytest.mark.parametrize(("scheduler", "short_done_by"), [("mlfq", 0.6), ("fcfs", None)])
def test_a_new_short_job_preempts_a_long_one_at_an_iteration_boundary(scheduler,
                                                                      short_done_by):
    """Batch of one: the long job (200 outputs) started first; the short one arrives at
    0.5 s. MLFQ runs it at once (the long one has been demoted), pausing the long one with
    its KV kept; FCFS makes it wait for the long one's 2 s."""
    w = make_workload([0.0, 0.5], [10, 10], [200, 3])
    rec, _ = _run(w, FastServePlanner(scheduler=scheduler, max_batch_size=1),
                  ConstantStepModel(0.01))
    finish = by_id(rec, "finish_s")
    if short_done_by is not None:
        assert finish[1] < short_done_by < finish[0]
    else:
        assert finish[1] > finish[0] > 2.0
    assert rec.requests["num_preemptions"].sum() == 0  # paused, never recomputed
    assert rec.requests["num_recomputed_tokens"].sum() == 0


def test_srpt_serves_the_fewest_remaining_outputs_first():
    w = make_workload([0.0, 0.0, 0.0], [10, 10, 10], [30, 5, 15])
    rec, _ = _run(w, FastServePlanner(scheduler="srpt", max_batch_size=1),
                  ConstantStepModel(0.01))
    finish = by_id(rec, "finish_s")
    assert finish[1] < finish[2] < finish[0]


# --- the reproduction's metric, as the paper's artifact computes it ---------------------------

def test_crossing_rate_interpolates_like_the_artifact():
    from fleetsim.metrics.slo import crossing_rate

    rates = (1.0, 2.0, 4.0)
    # 0.1 at 1 req/s, 0.5 at 2 req/s: 0.3 is crossed halfway, at 1.5 req/s
    assert crossing_rate(rates, [0.1, 0.5, 0.9], 0.3) == pytest.approx(1.5)
    assert crossing_rate(rates, [0.1, 0.2, 0.4], 0.3) == pytest.approx(3.0)
    assert crossing_rate(rates, [0.1, 0.2, 0.25], 0.3) == 4.0  # never crossed: a bound
    assert crossing_rate(rates, [0.5, 0.6, 0.7], 0.3) is None  # missed at the lowest rate
    assert crossing_rate(rates, [0.1, None, 0.7], 0.3) == 1.0  # an unfinished run stops it


def test_latency_per_output_token_is_e2e_over_outputs():
    import numpy as np

    from fleetsim.repro.fastserve import latency_per_output_token

    req = {"arrival_s": np.array([0.0, 1.0]), "finish_s": np.array([2.0, 5.0]),
           "num_output_tokens": np.array([4, 2])}
    assert latency_per_output_token(req).tolist() == [0.5, 2.0]


def test_fastserve_beats_vllm_in_the_papers_direction_under_load():
    """Above vLLM's capacity, per-token latency (the paper's metric) is lower under the MLFQ:
    short jobs no longer wait behind long ones."""
    import numpy as np

    from fleetsim.config import config_from_dict
    from fleetsim.repro.fastserve import config, latency_per_output_token
    from fleetsim.run import run

    mean = {}
    for policy in ("fastserve", "vllm"):
        result = run(config_from_dict(config(policy, 3.0, 200)))
        assert result.summary["num_unfinished"] == 0
        mean[policy] = float(np.mean(latency_per_output_token(result.records.requests)))
    assert mean["fastserve"] < 0.8 * mean["vllm"]


# --- the two mechanisms beside the MLFQ: starvation promotion and proactive swapping ----------

@pytest.mark.parametrize("promote", [True, False])
def test_starvation_promotion_bounds_a_demoted_jobs_wait(promote):
    """Batch of one, 0.01 s steps. A long job runs alone for 0.5 s and is demoted; then a
    short job arrives every 0.03 s for 9 s, each needing exactly 0.03 s: higher-priority
    work for every slot. With promotion (checked every 50 iterations, limit 0.5 s) the long
    job is back at the top within 0.5 s + 50 steps of its last run; without it (a period
    never reached) it waits for the whole stream."""
    n = 300
    w = make_workload([0.0] + [0.5 + 0.03 * i for i in range(n)], [10] * (n + 1),
                      [300] + [3] * n)
    policy = FastServePlanner(max_batch_size=1, starvation_limit_s=0.5,
                              starvation_period=50 if promote else 10**9)
    rec, _ = _run(w, policy, ConstantStepModel(0.01), blocks=4000, track_itl=True)
    longest_wait_s = by_id(rec, "itl_max_s")[0]
    if promote:
        assert longest_wait_s <= 0.5 + 50 * 0.01 + 0.01 + 1e-9
    else:
        assert longest_wait_s > 5.0


@pytest.mark.parametrize("swap", [True, False])
def test_proactive_swapping_keeps_kv_instead_of_recomputing(swap):
    """The reproduction's FastServe on a GPU holding only 300 KV blocks (16 tokens each) at
    3 req/s: with proactive swapping, low-priority jobs move to host memory and come back
    with their KV (no token is recomputed) and the per-token latency is lower; without it
    the engine can only preempt by recompute."""
    import numpy as np

    from fleetsim.config import config_from_dict
    from fleetsim.repro.fastserve import config, latency_per_output_token
    from fleetsim.run import run

    mean = {}
    for on in (True, False):
        data = config("fastserve", 3.0, 150)
        data["engine"]["num_kv_blocks"] = 300
        data["policy"]["batching"]["args"]["proactive_swap"] = on
        result = run(config_from_dict(data))
        assert result.summary["num_unfinished"] == 0
        mean[on] = float(np.mean(latency_per_output_token(result.records.requests)))
        if on == swap:
            summary = result.summary
    if swap:
        assert summary["num_swaps"] > 0
        assert summary["num_recomputed_tokens"] == 0
    else:
        assert summary["num_swaps"] == 0
        assert summary["num_recomputed_tokens"] > 0
    assert mean[True] < 0.9 * mean[False]


def test_only_the_artifacts_eager_vllm_runs_pay_the_launch_overhead():
    """vLLM and vLLM+CP ran with --enforce-eager in the artifact; FastServe's engine and
    vllm-graphs did not. The overhead is PR #1440's 1.5 ms per step scaled to 40 layers."""
    from fleetsim.perf.step_model import STEP_OVERHEAD_S
    from fleetsim.repro.fastserve import EAGER_OVERHEAD_S, POLICIES, config

    assert pytest.approx(1.5e-3 * 40 / 32) == EAGER_OVERHEAD_S
    for policy in POLICIES:
        got = config(policy, 1.0, 10)["engine"]["step_overhead_s"]
        eager = policy in ("vllm", "vllm-chunked")
        assert got == pytest.approx(STEP_OVERHEAD_S + (EAGER_OVERHEAD_S if eager else 0.0))
    plain, graphs = config("vllm", 1.0, 10), config("vllm-graphs", 1.0, 10)
    plain["engine"].pop("step_overhead_s")
    graphs["engine"].pop("step_overhead_s")
    assert plain == graphs  # the same vLLM otherwise


def test_the_entry_draws_first_turns_and_its_note_measures_both_length_sources():
    """The artifact's client sends first turns: the entry draws the first-turn histogram
    (every pair already passes the client's filter), and its note gives the first turns'
    means beside what the filter keeps of whole conversations, counted here independently."""
    from fleetsim.repro.fastserve import config, lengths_note
    from fleetsim.workloads.loaders import read_column

    run = config("fastserve", 1.0, 10)["workload"]["lengths"]
    assert run["path"] == "embedded:sharegpt_first_turn_opt"
    assert run["count_column"] == "num_requests"
    p = read_column(run["path"], "num_prefill_tokens")
    o = read_column(run["path"], "num_decode_tokens")
    n = read_column(run["path"], "num_requests")
    assert p.max() <= 1024 and (p + o).max() <= 2048
    first_p, first_o = (p * n).sum() / n.sum(), (o * n).sum() / n.sum()
    prompts = read_column("embedded:sharegpt_lengths", "num_prefill_tokens")
    outputs = read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    kept = (prompts <= 1024) & (prompts + outputs <= 2048)
    note = lengths_note()
    assert f"mean prompt {first_p:.0f} / output {first_o:.0f} tokens" in note
    assert f"keep {kept.sum():,} of {len(prompts):,}" in note
    assert f"mean prompt {prompts[kept].mean():.0f} / output {outputs[kept].mean():.0f}" in note


class EveryJobLooked(FastServePlanner):
    """FastServe's level rules as written: every job is looked at after each iteration
    (the planner looks only at the jobs whose attained service changed)."""

    def _update_levels(self, view, jobs, now_s):
        from fleetsim.policies.fastserve import JobState

        changed = []
        starving = self._iterations % self.starvation_period == 0
        for req in jobs:
            state = req.policy_state
            if not isinstance(state, JobState):
                req.policy_state = JobState(self._join_level(view, req), req.service_s,
                                            req.arrival_s)
                changed.append(req.id)
                continue
            level = state.level
            if req.service_s - state.level_entry_service_s > self._quantum_s(level):
                state.level = level + 1
                state.level_entry_service_s = req.service_s
            if starving and now_s - state.last_run_s >= self.starvation_limit_s:
                state.level = 0
                state.level_entry_service_s = req.service_s
            if state.level != level:
                changed.append(req.id)
        return changed


def test_looking_only_at_jobs_that_ran_equals_looking_at_every_job():
    """The reproduction's FastServe at 3 req/s on 300 KV blocks (jobs swapped out and back,
    paused, demoted) with a starvation check every 25 iterations: the planner, which checks
    the levels of the jobs whose service changed, serves every request exactly as the
    rules as written (every job checked every iteration)."""
    import numpy as np

    from fleetsim.config import config_from_dict
    from fleetsim.repro.fastserve import config
    from fleetsim.run import run

    out = {}
    for name in ("fastserve", "tests.unit.test_fastserve:EveryJobLooked"):
        data = config("fastserve", 3.0, 150)
        data["engine"]["num_kv_blocks"] = 300
        data["policy"]["batching"]["name"] = name
        data["policy"]["batching"]["args"].update(starvation_period=25,
                                                  starvation_limit_s=0.5)
        out[name] = run(config_from_dict(data))
    ours, ref = out.values()
    assert ours.summary["num_swaps"] > 0 and ours.summary["num_unfinished"] == 0
    assert ours.records.requests.keys() == ref.records.requests.keys()
    for column, values in ours.records.requests.items():  # NaNs (none measured) match
        np.testing.assert_array_equal(values, ref.records.requests[column], err_msg=column)


class SortsEveryPlan(FastServePlanner):
    """FastServe shown its queues in the MLFQ's order whatever order the engine keeps."""

    def plan(self, view, now_s):
        return FastServePlanner.plan(self, InMLFQOrder(view), now_s)


class InMLFQOrder:
    """A replica view whose queues are sorted by the MLFQ's key (as the planner keeps it)."""

    def __init__(self, view):
        self._view = view

    def __getattr__(self, name):
        return getattr(self._view, name)

    @property
    def running(self):
        from fleetsim.policies.fastserve import mlfq_key

        return sorted(self._view.running, key=lambda r: mlfq_key(r, 0.0))

    @property
    def waiting(self):
        from fleetsim.policies.fastserve import mlfq_key

        return sorted(self._view.waiting, key=lambda r: mlfq_key(r, 0.0))

    @property
    def order_key(self):
        from fleetsim.policies.fastserve import mlfq_key

        return mlfq_key


class SwitchOrdering:
    """At 0.5 s, a controller orders the replica's queues by shortest job first."""

    def start(self, cluster):
        return 0.5

    def on_tick(self, cluster, now_s):
        from fleetsim.policies import make_ordering

        cluster.set_policies(order_key=make_ordering("sjf"))


def test_the_mlfq_sorts_the_queues_itself_when_a_controller_reorders_them():
    """Under the MLFQ the planner takes the engine's queue order as its own only while the
    engine sorts by the MLFQ's key: after a controller switches the queues to SJF it sorts
    them itself, and serves every job as a planner shown its queues in MLFQ order."""
    import numpy as np
    from tests.unit.test_cluster import pools

    from fleetsim.policies.routing import LeastLoaded, RoundRobin
    from fleetsim.serving.cluster import simulate_cluster

    n = 12
    w = make_workload(np.linspace(0.0, 0.2, n), [30] * n, [120, 8, 60, 15, 90, 30] * 2)
    out = []
    for cls in (FastServePlanner, SortsEveryPlan):
        rec, _ = simulate_cluster(
            w, pools(mixed=1), router=RoundRobin(), decode_router=LeastLoaded(),
            make_batch_policy=lambda cls=cls: cls(max_batch_size=2, base_quantum_s=0.02),
            order_key=make_ordering("fcfs"), rng=np.random.default_rng(0),
            kv_bytes_per_token=0.0, link_latency_s=0.0, block_size=16, max_batched_tokens=512,
            max_running=64, debug=True, controllers=[SwitchOrdering()])
        out.append(rec)
    ours, ref = out
    for column, values in ref.requests.items():
        np.testing.assert_array_equal(values, ours.requests[column], err_msg=column)


@pytest.mark.parametrize(("args", "field", "needle"), [
    # a reserve above the whole cache: swapped jobs could never come back (the run stopped
    # with a PlanError traceback before)
    ("{min_free_blocks = 1000000000}", "min_free_blocks", "leaves no room"),
    ("{max_batch_size = 1000000}", "max_batch_size", "leaves no room"),
    # 1 - 1e-300 rounds to 1: no prefill could start even with the host tier empty
    ("{host_full_share = 1e-300}", "host_full_share", "must be in [1e-06, 1]"),
])
def test_a_reserve_or_host_share_that_would_stall_the_run_is_one_line_exit_2(
        tmp_path, capsys, args, field, needle):
    from fleetsim.cli import main

    out = tmp_path / "o"
    code = main(["run", "--out", str(out), "--set", "model=llama-3.1-8b",
                 "--set", "hardware.gpu=h100-sxm", "--set", "engine.swap_space_gib=4",
                 "--set", "engine.gpu_memory_utilization=0.3",
                 "--set", f"policy.batching={{name='fastserve', args={args}}}",
                 "--set", "workload.trace=synthetic", "--set", "workload.rate_per_s=30",
                 "--set", "workload.num_requests=150",
                 "--set", "workload.prompt_tokens={kind='uniform', low=50, high=900}",
                 "--set", "workload.output_tokens={kind='uniform', low=20, high=600}"])
    err = capsys.readouterr()[1]
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: ")
    assert field in err and needle in err
    assert not out.exists()
