"""Agent.xpu's scheduler as the ``agent_xpu`` batching policy (arXiv:2506.24045): each
mechanism switched off changes what it should, and the repro's system runs it on the SoC."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tests.conftest import make_workload, simulate

from fleetsim.cli import main
from fleetsim.config import config_from_dict, load_config
from fleetsim.core.simulator import Simulator
from fleetsim.models import get_model
from fleetsim.perf.base import ConstantStepModel, LinearStepModel
from fleetsim.perf.soc import ModelCost
from fleetsim.perf.soc_calibration import lunar_lake
from fleetsim.policies import PolicySpec, make_batch_policy, make_ordering
from fleetsim.policies.agent_xpu import AgentXpuPlanner
from fleetsim.policies.agent_xpu_steps import (
    CLASSES,
    PREEMPTIVE_CLASSES,
    class_present,
    urgency,
)
from fleetsim.repro import agent_xpu as repro
from fleetsim.run import run
from fleetsim.serving.contract import StepPlan
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.prefix_cache import PrefixCache
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.replica import PlanError, Replica
from fleetsim.serving.request import Request
from fleetsim.soc_pools import affinity

REACTIVE, PROACTIVE = 0, 1


def _by_id(rec):
    r = rec.requests
    order = np.argsort(r["request_id"])
    return {k: v[order] for k, v in r.items()}


@pytest.mark.parametrize("preemptive", [True, False])
def test_a_reactive_arrival_preempts_proactive_prefill_at_the_next_chunk(preemptive):
    # A 1,000-token proactive prompt (10 chunks of 100, 1 s each) is under way when a
    # reactive request arrives at 0.5 s: with preemption it runs at the next chunk boundary
    # and gets its first token long before the proactive one; without, it waits for it.
    w = make_workload([0.0, 0.5], [1000, 64], [2, 2], priority=[PROACTIVE, REACTIVE])
    policy = AgentXpuPlanner(chunk_tokens=100, preemptive=preemptive)
    rec, _ = simulate(w, step_time_s=1.0, batch_policy=policy, max_batched_tokens=512)
    r = _by_id(rec)
    proactive_ttft, reactive_ttft = r["first_token_s"]
    if preemptive:
        assert reactive_ttft == 2.0  # the chunk in progress (0-1 s), then its own (1-2 s)
        # ten chunks plus the reactive request's chunk and its one decode step in between
        assert proactive_ttft == 12.0
    else:
        assert reactive_ttft > proactive_ttft == 10.0


@pytest.mark.parametrize("slack", [0.0, 0.5])
def test_proactive_decodes_piggyback_within_the_slack_only(slack):
    # A proactive request is prefilled first, then a reactive one arrives and decodes; a
    # decode costs 0.1 of a step's base, so the proactive decode joining a one-request step
    # slows it by about 10% (1 + 2 x 0.1 over 1 + 0.1): within a 50% slack, beyond none.
    w = make_workload([0.0, 0.1], [16, 16], [40, 40], priority=[PROACTIVE, REACTIVE])
    model = LinearStepModel(1.0, 0.1)
    rec, _ = simulate(w, step_model=model, batch_policy=AgentXpuPlanner(reactive_slack=slack),
                      max_batched_tokens=512)
    r = _by_id(rec)
    proactive_end, reactive_end = r["finish_s"]
    if slack:
        assert abs(proactive_end - reactive_end) < 2.0  # decoded alongside
    else:
        # every proactive decode waits for the reactive request to finish
        assert proactive_end - reactive_end > 40.0  # its 39 decodes alone, 1.1 s each


def test_agent_xpu_keeps_its_mechanisms_apart_from_a_fixed_order():
    # The same run with the policy's default order (priority) matches a workload whose
    # priorities are all reactive only when nothing is proactive: the class split matters.
    w = make_workload([0.0, 0.2, 0.4], [300, 300, 40], [5, 5, 5], priority=[1, 1, 0])
    split, _ = simulate(w, step_time_s=1.0, batch_policy=AgentXpuPlanner(chunk_tokens=100))
    same = dataclasses.replace(w, priority=np.zeros(3, dtype=np.int64))
    flat, _ = simulate(same, step_time_s=1.0, batch_policy=AgentXpuPlanner(chunk_tokens=100))
    assert _by_id(split)["first_token_s"][2] < _by_id(flat)["first_token_s"][2]


@pytest.mark.parametrize(("args", "field"), [({"chunk_tokens": 0}, "chunk_tokens"),
                                             ({"reactive_slack": 1.5}, "reactive_slack"),
                                             ({"preemptive": "yes"}, "preemptive"),
                                             ({"bandwidth_aware": 1}, "bandwidth_aware"),
                                             ({"reserve_full_isl": "no"}, "reserve_full_isl")])
def test_bad_args_name_the_field(args, field):
    with pytest.raises(Exception, match=field):
        make_batch_policy(PolicySpec(name="agent_xpu", args=args))


def test_affinity_maps_prefill_to_the_npu_and_decode_to_the_igpu():
    cost = ModelCost(get_model("Llama-3.2-3B"), 4.5)
    assert affinity(lunar_lake(), cost, 256) == ("npu", "igpu")


def _reactive_mean_s(system, setup, cost):
    return repro.summarize(repro.simulate(setup, 2.0, system))["reactive_latency_mean_s"]


def test_the_npu_prefill_igpu_decode_mapping_is_what_cuts_reactive_latency():
    # Agent.xpu's system on the engine (its P/D mapping) against the same scheduler with the
    # stages swapped onto the other accelerators: the affine mapping is faster.
    setup = repro.AgentXpuSetup(duration_s=180.0)
    cost = ModelCost(get_model(setup.model), setup.bits_per_weight)
    system = repro.agent_xpu_system(setup, cost)
    assert [p[1:] for p in system.pools] == [("npu", "prefill"), ("igpu", "decode")]
    swapped = dataclasses.replace(system, pools=(("prefill", "igpu", "prefill"),
                                                 ("decode", "npu", "decode")))
    ours = _reactive_mean_s(system, setup, cost)
    assert ours < 0.8 * _reactive_mean_s(swapped, setup, cost)
    # and the scheduler on the mapping beats an iGPU-only FCFS engine by far
    assert ours < 0.5 * _reactive_mean_s(repro.OnEngine(repro.IGPU), setup, cost)


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_xpu.toml"


def test_the_example_config_runs_the_repro_system():
    """``fleetsim run examples/agent_xpu.toml``: Agent.xpu's traffic (``[agent_traffic]``)
    under its scheduler on the SoC, the same run as the reproduction's agent-xpu system."""
    config = load_config(EXAMPLE, ["agent_traffic.duration_s=180"])
    summary = run(config).summary
    ours = summary["agent_traffic"]
    setup = repro.AgentXpuSetup(duration_s=180.0)
    cost = ModelCost(get_model(setup.model), setup.bits_per_weight)
    theirs = repro.summarize(repro.simulate(setup, 2.0, repro.agent_xpu_system(setup, cost)))
    assert ours["num_reactive"] == theirs["num_reactive"] > 0
    assert ours["reactive_latency_mean_s"] == theirs["reactive_latency_mean_s"]
    assert ours["proactive_per_min"] == theirs["proactive_per_min"] > 0
    assert summary["num_finished"] == ours["num_reactive"] + ours["num_proactive"]


@pytest.mark.parametrize(("override", "needle"), [
    ("agent_traffic.duration_s=0", "agent_traffic.duration_s must be > 0 seconds, got 0"),
    ("until_s=100", "agent_traffic replaces the workload"),
    ("workload.rate_scale=2", "agent_traffic replaces the workload"),
    ("policy.batching.args.chunk_tokens=0", "chunk_tokens"),
    ("policy.batching.args.bandwidth_aware=maybe", "bandwidth_aware"),
])
def test_bad_agent_config_is_one_line_and_exit_2(override, needle, capsys, tmp_path):
    code = main(["run", str(EXAMPLE), "--set", override, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1


def test_one_class_decode_steps_fast_forward_equal_to_stepping():
    # A proactive request decodes alone, then with a reactive one beside it: it piggybacks
    # while the step stays within the slack (1 + 0.1 x 2 + 1e-4 x KV against 1.1 x the
    # reactive step alone), which it leaves as contexts grow, and resumes
    # alone when the reactive answer ends. Alone, the plan repeats (``StepPlan.repeats``): the
    # engine runs windows of many steps. With two classes the plan repeats only under its
    # rule (``PiggybackRepeat``), which ends the window at the step the proactive decode
    # leaves: a plain promise to repeat would keep it in past its exit.
    w = make_workload([0.0, 3.0], [16, 16], [300, 200], priority=[PROACTIVE, REACTIVE])
    out = []
    for ff in (True, False):
        rec, _ = simulate(w, step_model=LinearStepModel(1.0, 0.1, 1e-4),
                          batch_policy=AgentXpuPlanner(), max_batched_tokens=512,
                          fast_forward=ff, timeline=(0.0, 1000.0))
        out.append(rec)
    fast, slow = out
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert fast.timeline["num_steps"].max() > 100  # a window
    assert fast.timeline["num_steps"].sum() == slow.timeline["num_steps"].sum()
    r = _by_id(slow)
    assert r["finish_s"][0] - r["finish_s"][1] > 200.0  # left the reactive steps early


def _soc_pd(roles=("prefill", "decode"), **args):
    """Agent.xpu's P/D pair on the SoC: prefill on the NPU, decode on the iGPU (or other
    ``roles``: two mixed replicas)."""
    return config_from_dict({
        "model": "Llama-3.2-3B", "seed": 0,
        "cluster": {"pools": [{"name": "npu", "gpu": "npu", "role": roles[0]},
                              {"name": "igpu", "gpu": "igpu", "role": roles[1]}],
                    "soc": {}, "link": {"latency_s": 0.0}},
        "engine": {"max_running": 16, "max_batched_tokens": 512},
        "policy": {"ordering": "priority", "batching": {"name": "agent_xpu", "args": args}}})


def _times(config, workload):
    """(first token, finish) of each request, by id."""
    result = run(config, workload=workload)
    r = _by_id(result.records)
    return r["first_token_s"], r["finish_s"]


# A reactive request (200-token prompt, 60 tokens out) and, 50 ms later, a proactive one with
# a 2,000-token prompt: its 256-token chunks on the NPU would run while the reactive answer
# decodes on the iGPU, and a chunk's DDR share slows a decode step by up to 1.26x.
BESIDE = make_workload([0.0, 0.05], [200, 2000], [60, 5], priority=[REACTIVE, PROACTIVE])
ALONE = make_workload([0.0], [200], [60], priority=[REACTIVE])


@pytest.mark.parametrize("slack", [0.1, 0.3])
def test_bandwidth_aware_dispatch_bounds_the_reactive_decode_slowdown_by_the_slack(slack):
    first, finish = _times(_soc_pd(reactive_slack=slack), BESIDE)
    blind_first, blind_finish = _times(_soc_pd(reactive_slack=slack, bandwidth_aware=False),
                                       BESIDE)
    alone_first, alone_finish = _times(_soc_pd(reactive_slack=slack), ALONE)
    alone_s = alone_finish[0] - alone_first[0]  # the reactive answer's decode, nothing beside
    assert first[0] == blind_first[0] == alone_first[0]  # its prefill is first either way
    # Without the mechanism the proactive prefill runs beside the decode (its first token
    # comes before the reactive answer ends) and slows it by more than 10%.
    assert blind_first[1] < blind_finish[0]
    assert blind_finish[0] - blind_first[0] > 1.1 * alone_s
    # With it, the decode is slowed by at most the slack...
    assert finish[0] - first[0] <= (1.0 + slack) * alone_s
    assert finish[0] < blind_finish[0]
    if slack == 0.1:
        # ...which no chunk but the first (short context, small DDR share) fits: the
        # proactive prompt waits for the reactive answer, and nothing stalls after it.
        assert finish[0] < first[1] < finish[1] < np.inf
    else:
        # ...which lets chunks run beside the decode, slowing it beyond the 10% above.
        assert finish[0] - first[0] > 1.1 * alone_s


def test_a_plan_that_waits_with_nobody_to_wake_it_is_a_policy_bug():
    class WaitsAlone:
        splits_prompts = True

        def plan(self, view, now_s):
            # a lone replica: nobody shares its resource
            assert view.co_resident_steps == () and view.co_resident_slowdowns([], 1, 10) == ()
            return StepPlan({}, wait_for_co_resident=True)

    with pytest.raises(PlanError, match="nothing would wake it"):
        simulate(make_workload([0.0], [10], [2]), batch_policy=WaitsAlone())


def test_bandwidth_aware_dispatch_cuts_reactive_latency_in_the_repro():
    # The reproduction's P/D pair at 2 reactive requests per minute (3 minutes): with the
    # mechanism, reactive latency is lower; without it, no replica ever waits.
    setup = repro.AgentXpuSetup(duration_s=180.0)
    cost = ModelCost(get_model(setup.model), setup.bits_per_weight)
    aware = _reactive_mean_s(repro.agent_xpu_system(setup, cost), setup, cost)
    blind = _reactive_mean_s(repro.schedulers(setup, cost)[repro.BANDWIDTH_BLIND], setup, cost)
    assert aware < 0.99 * blind


@settings(max_examples=200, deadline=None)
@given(running=st.lists(st.integers(0, 3), max_size=6),
       waiting=st.lists(st.integers(0, 3), max_size=6), preemptive=st.booleans())
def test_the_classes_tried_are_the_requests_classes_most_urgent_first(running, waiting,
                                                                      preemptive):
    """The plan asks class by class, in a fixed order, whether a request of it is present:
    the classes it finds are the requests' classes (``urgency``), most urgent first."""
    def requests(priorities, first_id):
        return [Request(first_id + i, 0.0, 8, 4, priority=p) for i, p in enumerate(priorities)]

    replica = Replica(Simulator(), step_model=ConstantStepModel(1.0),
                      kv=KVCache(10, 16, None, True, PrefixCache()),
                      batch_policy=AgentXpuPlanner(), order_key=make_ordering("fcfs"),
                      recorder=Recorder(), max_batched_tokens=64, max_running=8)
    replica.running, replica.waiting = requests(running, 0), requests(waiting, 100)
    view = replica.view
    max_reactive = 1
    found = [c for c in (PREEMPTIVE_CLASSES if preemptive else CLASSES)
             if class_present(view, c, max_reactive, preemptive)]
    expected = sorted({urgency(r, True, max_reactive, preemptive) for r in view.running}
                      | {urgency(r, False, max_reactive, preemptive) for r in view.waiting})
    assert found == expected


def test_the_timeline_of_a_cut_window_bins_as_stepping_does():
    """On the SoC a window cut back by the other accelerator's job keeps its step in progress
    (re-timed at the shared rate) on its last row. When that step then ends past a timeline
    bin edge it is a row of its own: the summary splits a row across an edge by time, as one
    step's, and the example's run has such steps (its bins differed from stepping's in the
    7th digit while they were merged)."""
    config = load_config(EXAMPLE)
    timelines = []
    for ff in (True, False):
        engine = dataclasses.replace(config.engine, fast_forward=ff)
        timelines.append(run(dataclasses.replace(config, engine=engine)).summary["timeline"])
    fast, slow = timelines
    for key in ("kv_used_fraction", "busy_fraction", "mean_running", "mean_waiting"):
        assert fast[key] == pytest.approx(slow[key], rel=1e-12, abs=1e-15), key


def _runs(config, workload=None):
    """(requests by id, binned timeline, plans made, plans that gave a reason) of ``config``
    run as is (fast-forward, waits and piggybacked plans saying why: ``StepPlan.wait_rule``,
    ``PiggybackRepeat``) and as the reference: step by step, every plan stripped of its
    reasons, so that a waiting replica is woken at every co-resident step."""
    import fleetsim.policies.agent_xpu as module

    planned = module.plan_step
    out = []
    for reasons in (True, False):
        count = [0, 0]

        def plan_step(*args, reasons=reasons, count=count):
            plan = planned(*args)
            count[0] += 1
            if plan.wait_rule is not None or plan.repeat_rule is not None:
                count[1] += 1
                if not reasons:
                    plan = plan._replace(wait_rule=None, repeat_rule=None)
            return plan

        engine = dataclasses.replace(config.engine, fast_forward=reasons)
        module.plan_step = plan_step
        try:
            result = run(dataclasses.replace(config, engine=engine), workload=workload)
        finally:
            module.plan_step = planned
        out.append((_by_id(result.records), result.summary["timeline"], *count))
    return out


def _same(explained, stepped, bins=True):
    (fast, fast_tl, _, _), (slow, slow_tl, _, _) = explained, stepped
    for col, values in slow.items():
        assert np.array_equal(values, fast[col], equal_nan=True), col
    if not bins:
        return
    for key in ("kv_used_fraction", "busy_fraction", "mean_running", "mean_waiting"):
        assert fast_tl[key] == pytest.approx(slow_tl[key], rel=1e-12, abs=1e-15), key


@pytest.mark.parametrize("per_min", [10.0, 60.0])
def test_waits_and_piggybacked_plans_that_say_why_change_no_result(per_min):
    """The example's reactive traffic beside 4 proactive flows: the NPU's vetoed chunks
    sleep through the iGPU steps their veto holds against (``DispatchVeto``), and the iGPU
    fast-forwards reactive decodes with proactive ones piggybacked while the slack tests
    give the same batch (``PiggybackRepeat``). Every request and time bin equals step by
    step's with every waiting replica woken at every co-resident step, with far fewer plans."""
    config = load_config(EXAMPLE)
    config = dataclasses.replace(config, agent_traffic=dataclasses.replace(
        config.agent_traffic, reactive_per_min=per_min, duration_s=240.0))
    explained, stepped = _runs(config)
    _same(explained, stepped)
    assert explained[3] > 0  # plans with a reason were made...
    assert explained[2] < 0.5 * stepped[2]  # ...and spared most of the planning


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(st.tuples(st.floats(0.0, 4.0), st.integers(1, 1500),
                                   st.integers(1, 120), st.sampled_from([REACTIVE, PROACTIVE])),
                         min_size=1, max_size=10),
       slack=st.sampled_from([0.0, 0.05, 0.1, 0.3]),
       roles=st.sampled_from([("prefill", "decode"), ("mixed", "mixed")]))
def test_reasons_given_change_no_result_on_any_traffic(requests, slack, roles):
    """Any mix of reactive and proactive requests on the SoC's P/D pair, or on two mixed
    replicas (either may then wait on the other): the same records with the plans' reasons
    and fast-forward as step by step without them."""
    from fleetsim.serving.cluster import default_timeline

    arrivals, prompts, outputs, priority = (list(x) for x in zip(*sorted(requests), strict=True))
    workload = make_workload(arrivals, prompts, outputs, priority=priority)
    config = _soc_pd(roles, reactive_slack=slack)
    config = dataclasses.replace(config, engine=dataclasses.replace(config.engine,
                                                                    max_running=6))
    explained, stepped = _runs(config, workload)
    event(f"plans with a reason: {'some' if explained[3] else 'none'}")
    # (Time bins compared where the run has fixed ones: requests arriving at once give
    # none, and the summary then splits each recorded row over the makespan by time.)
    _same(explained, stepped, bins=default_timeline(workload, math.inf)[1] < math.inf)


def test_a_prompt_starts_only_when_its_whole_input_fits():
    """The NPU's KV short (finished prefills hold it until the iGPU, two slots, takes them):
    a prompt started because its first 256-token chunk's blocks were free finds none for
    the next chunk, and is recomputed from its start. Reserving the whole input (vLLM v1's
    ``scheduler_reserve_full_isl``) starts it only when it can finish its prefill."""
    workload = make_workload([0.1 * i for i in range(10)], [1000] * 10, [100] * 10,
                             priority=[REACTIVE] * 10)
    out = {}
    for reserve in (False, True):
        config = _soc_pd(reserve_full_isl=reserve)
        config = dataclasses.replace(config, engine=dataclasses.replace(
            config.engine, max_running=2, num_kv_blocks=300))
        out[reserve] = run(config, workload=workload).records.requests
    thrash, reserved = out[False], out[True]
    assert thrash["num_preemptions"].sum() > 0 and thrash["num_recomputed_tokens"].sum() > 0
    assert reserved["num_preemptions"].sum() == 0 and reserved["num_recomputed_tokens"].sum() == 0
    assert reserved["finish_s"].max() < thrash["finish_s"].max()


class _AbortAt:
    """A controller that aborts one request at one time (its client left)."""

    def __init__(self, at_s, request_id):
        self.at_s, self.request_id = at_s, request_id

    def start(self, cluster):
        return self.at_s

    def on_tick(self, cluster, now_s):
        cluster.abort(self.request_id, "client left")  # (and never wakes again)


class _WhileDecoding:
    """A wait's reason: it holds beside any step that decodes (``WaitRule``)."""

    prefill_chunks, num_decode, decode_kv_tokens = [(256, 0)], 0, 0

    def max_slowdown(self, decodes):
        return 0.0 if decodes else math.inf


class _LongPromptsWait(AgentXpuPlanner):
    """agent_xpu without its own veto, but the NPU idles while its best prompt is long and
    the iGPU decodes: a plan that depends on its own queue and on whether the other decodes,
    and says so."""

    def __init__(self, reasons):
        super().__init__(bandwidth_aware=False)
        self.reasons = reasons

    def plan(self, view, now_s):
        others = view.co_resident_steps
        if (view.replica_id == 0 and view.waiting and not view.running and others
                and others[0].decodes and view.waiting[0].num_prompt_tokens > 100):
            return StepPlan({}, wait_for_co_resident=True,
                            wait_rule=_WhileDecoding() if self.reasons else None)
        return super().plan(view, now_s)


def test_a_sleeping_replica_whose_queue_changes_plans_again_as_stepping_does():
    """The NPU sleeps under a wait's reason (its best prompt is long, the iGPU decodes a
    reactive answer); that prompt's client leaves. Stepping plans again at the iGPU's next
    step and starts the short prompt behind it, so the engine drops the reason at the abort
    (and cuts the iGPU's window there) rather than keep the NPU asleep to the answer's end."""
    from fleetsim.policies.eviction import make_eviction
    from fleetsim.policies.routing import make_router
    from fleetsim.run import build_pools, engine_settings
    from fleetsim.serving.cluster import simulate as simulate_cluster
    from fleetsim.serving.settings import PlugIns

    config = _soc_pd()
    model = get_model(config.model)
    workload = make_workload([0.0, 0.5, 0.6], [200, 600, 16], [400, 5, 5],
                             priority=[REACTIVE, PROACTIVE, PROACTIVE])
    out = []
    for reasons in (True, False):
        pools, _ = build_pools(config, model)
        settings = dataclasses.replace(engine_settings(config, model), fast_forward=reasons)
        plugins = PlugIns(make_batch_policy=lambda reasons=reasons: _LongPromptsWait(reasons),
                          order_key=make_ordering(config.policy.ordering),
                          router=make_router(config.cluster.router),
                          decode_router=make_router(config.cluster.decode_router),
                          eviction_key=make_eviction(config.policy.eviction),
                          rng=np.random.default_rng(0))
        records, _ = simulate_cluster(workload, pools, settings, plugins,
                                      controllers=[_AbortAt(2.0, 1)])
        out.append(_by_id(records))
    explained, stepped = out
    for col, values in stepped.items():
        assert np.array_equal(values, explained[col], equal_nan=True), col
    # The long prompt left (aborted: not among the served); the short one started beside
    # the reactive answer, once the long one had gone.
    assert list(stepped["request_id"]) == [0, 2]
    assert 2.0 < stepped["first_scheduled_s"][1] < stepped["finish_s"][0]
