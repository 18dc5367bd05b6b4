"""Properties of shared fluid resources: the allocation is feasible, work conserving and
max-min fair; the event-driven service equals an independent reference loop and conserves
work; replicas sharing a resource give the same results with and without fast-forward."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.conftest import by_id, make_workload

from fleetsim.core.simulator import Simulator
from fleetsim.metrics.summary import timeline_bins
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, RoundRobin
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.resources import (
    Job,
    SharedResources,
    _one_resource_rates,
    _progressive_filling,
    max_min_rates,
    two_job_rates,
)
from fleetsim.serving.shared_steps import SharedStepModel, StepDemand

RESOURCES = ("a", "b", "c")
TOL = 1e-9


@st.composite
def job_specs(draw, max_jobs=6):
    n = draw(st.integers(1, max_jobs))
    out = []
    for _ in range(n):
        used = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=3, unique=True))
        uses = {r: draw(st.sampled_from([0.5, 1.0, 2.0])) for r in used}
        weight = draw(st.sampled_from([0.5, 1.0, 3.0]))
        cap = draw(st.sampled_from([math.inf, math.inf, 0.7, 2.5]))
        out.append((uses, weight, cap))
    return out


capacities = st.fixed_dictionaries({r: st.sampled_from([1.0, 3.0, 10.0]) for r in RESOURCES})


def _jobs(specs):
    return [Job(1.0, dict(uses), w, cap, lambda j: None, None, "") for uses, w, cap in specs]


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 7), data=st.data(),
       capacity=st.sampled_from([0.0, 1.0, 3.0, 10.0, 1e-9, 123.456, math.inf]))
def test_one_resource_path_equals_the_general_one_bit_for_bit(n, data, capacity):
    # The single-resource path (an SoC's DDR) must repeat the general rounds' float
    # operations exactly: results downstream are compared bit for bit across builds.
    def spec():
        use = data.draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 0.3, 7.25]))
        weight = data.draw(st.sampled_from([0.5, 1.0, 3.0, 0.1]))
        cap = data.draw(st.sampled_from([math.inf, math.inf, 0.7, 2.5, 1e-3, 1.0 / 3.0]))
        return ({"ddr": use}, weight, cap)

    jobs = _jobs([spec() for _ in range(n)])
    general = _progressive_filling(jobs, {"ddr": capacity})
    assert _one_resource_rates(jobs, "ddr", capacity) == general
    assert max_min_rates(jobs, {"ddr": capacity, "other": 5.0}) == general


def test_a_lone_job_takes_the_one_round_the_general_path_takes():
    """A lone job's rate (``one_job_rate``, the shortcut of the single-resource path) is
    the general rounds' answer for every use, weight, cap and capacity tried, bit for bit."""
    # (7.0 and 0.912: a cap whose ``weight * (cap / weight)`` is not the cap, so a rate
    # computed the long way round differs in its last bit)
    for use in (0.0, 0.5, 1.0, 2.0, 0.3, 7.25):
        for weight in (0.5, 1.0, 3.0, 0.1, 7.0):
            for cap in (math.inf, 0.7, 2.5, 1e-3, 1.0 / 3.0, 0.912):
                for capacity in (0.0, 1.0, 3.0, 10.0, 1e-9, 123.456, math.inf):
                    jobs = _jobs([({"ddr": use}, weight, cap)])
                    general = _progressive_filling(jobs, {"ddr": capacity})
                    assert _one_resource_rates(jobs, "ddr", capacity) == general, (
                        use, weight, cap, capacity)


@settings(max_examples=200, deadline=None)
@given(specs=job_specs(), capacity=capacities)
def test_busy_on_one_resource_is_busy_on_it(specs, capacity):
    """A port's question (``busy_on_one``, no list built) answers as ``busy_on`` does, for
    jobs on one resource or several (uses of 0 included), and for a hold."""
    sim = Simulator()
    svc = SharedResources(sim)
    for r, c in capacity.items():
        svc.add(r, c)
    for uses, weight, cap in specs:
        svc.start(1.0, {r: (0.0 if a == 2.0 else a) for r, a in uses.items()},
                  lambda job: None, weight=weight, max_rate=min(cap, 5.0))
    sim.run(0.0)  # every job active, none done (each takes at least 0.2 s)
    assert len(svc.active) == len(specs)
    for r in RESOURCES:
        assert svc.busy_on_one(r) == svc.busy_on({r: 1.0}), r
    idle = SharedResources(Simulator())
    for r in RESOURCES:
        idle.add(r, 1.0)
    idle.hold({"a": 1.0, "b": 0.0}, lambda: None)
    assert [idle.busy_on_one(r) for r in RESOURCES] == [True, False, False]
    assert [idle.busy_on({r: 1.0}) for r in RESOURCES] == [True, False, False]


def test_two_jobs_take_the_rounds_the_general_path_takes():
    """Two jobs on one resource (``two_job_rates``, the unrolled rounds: an SoC's NPU and
    iGPU, and every step of a window beside another job) get the general rounds' rates for
    every pair of uses, weights and caps tried, at every capacity, bit for bit."""
    one = [({"ddr": use}, weight, cap) for use in (0.0, 1.0, 0.3, 7.25)
           for weight in (0.5, 1.0, 7.0) for cap in (math.inf, 0.7, 1.0 / 3.0, 0.912)]
    for a in one:
        for b in one:
            for capacity in (0.0, 1.0, 3.0, 1e-9, 123.456, math.inf):
                jobs = _jobs([a, b])
                general = _progressive_filling(jobs, {"ddr": capacity})
                assert list(two_job_rates(*jobs, capacity)) == general, (a, b, capacity)
                assert _one_resource_rates(jobs, "ddr", capacity) == general


@settings(max_examples=300, deadline=None)
@given(specs=job_specs(), capacity=capacities)
def test_allocation_is_feasible_work_conserving_and_max_min_fair(specs, capacity):
    jobs = _jobs(specs)
    rates = max_min_rates(jobs, capacity)
    draw = {r: sum(x * j.uses.get(r, 0.0) for j, x in zip(jobs, rates, strict=True))
            for r in RESOURCES}
    for r in RESOURCES:
        assert draw[r] <= capacity[r] * (1 + TOL)
    full = {r for r in RESOURCES if draw[r] >= capacity[r] * (1 - TOL)}
    for j, x in zip(jobs, rates, strict=True):
        assert 0 < x <= j.max_rate * (1 + TOL)
        if x >= j.max_rate * (1 - TOL):
            continue
        # Not capped: it must use a full resource on which no job has a larger rate per
        # weight (its bottleneck) -- the characterisation of weighted max-min fairness, and
        # work conservation (no job could go faster on idle capacity).
        level = x / j.weight
        bottlenecks = [r for r in j.uses if r in full and all(
            y / k.weight <= level * (1 + TOL)
            for k, y in zip(jobs, rates, strict=True) if k.uses.get(r, 0.0) > 0)]
        assert bottlenecks, (specs, capacity, rates)


def _reference_finish_times(arrivals, specs, works, capacity):
    """An independent fluid loop: from one change to the next (an arrival or a finish),
    rates from the same allocation function."""
    t = 0.0
    pending = sorted(range(len(arrivals)), key=lambda i: (arrivals[i], i))
    active: list[int] = []
    left = list(works)
    finish = [math.nan] * len(arrivals)
    while pending or active:
        jobs = _jobs([specs[i] for i in active])
        rates = max_min_rates(jobs, capacity) if active else []
        next_arrival = arrivals[pending[0]] if pending else math.inf
        next_finish = min((left[i] / x for i, x in zip(active, rates, strict=True)),
                          default=math.inf)
        dt = min(next_arrival - t, next_finish)
        for i, x in zip(active, rates, strict=True):
            left[i] -= x * dt
        t += dt
        still = []
        for i, x in zip(active, rates, strict=True):
            if left[i] <= x * 1e-9:
                finish[i] = t
            else:
                still.append(i)
        active = still
        while pending and arrivals[pending[0]] <= t:
            active.append(pending.pop(0))
    return finish


@settings(max_examples=150, deadline=None)
@given(specs=job_specs(), capacity=capacities, data=st.data())
def test_service_equals_reference_loop_and_conserves_work(specs, capacity, data):
    n = len(specs)
    arrivals = [data.draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0])) for _ in range(n)]
    works = [data.draw(st.sampled_from([0.1, 1.0, 2.0, 5.0])) for _ in range(n)]
    sim = Simulator()
    svc = SharedResources(sim)
    for r, c in capacity.items():
        svc.add(r, c)
    finish = [math.nan] * n
    calls = [0] * n

    def done(i):
        def fn(job):
            finish[i] = sim.now_s
            calls[i] += 1
        return fn

    for i, ((uses, w, cap), work) in enumerate(zip(specs, works, strict=True)):
        svc.start(work, uses, done(i), weight=w, max_rate=cap, delay_s=arrivals[i],
                  client=f"c{i % 2}")
    sim.run()
    assert calls == [1] * n
    ref = _reference_finish_times(arrivals, specs, works, capacity)
    assert finish == pytest.approx(ref, rel=1e-9, abs=1e-9)
    for r in RESOURCES:
        expected = sum(work * uses.get(r, 0.0)
                       for (uses, _, _), work in zip(specs, works, strict=True))
        assert svc.used_by_resource[r] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert sum(svc.work_by_client.values()) == pytest.approx(sum(works), rel=1e-9)
    assert not svc.active


class Split:
    def __init__(self, private_per_token_s, work_per_token, weight):
        self.p, self.w, self.weight = private_per_token_s, work_per_token, weight

    def split(self, chunks, num_decode, kv_tokens):
        tokens = sum(n for n, _ in chunks) + num_decode
        return StepDemand(0.001 + self.p * tokens + 1e-7 * kv_tokens,
                          0.002 + self.w * tokens, self.weight)


def _sms_run(w, pools, fast_forward, until_s=math.inf, budget=1024):
    """``w`` on ``pools`` (round robin, then least loaded to decode), checked as it runs."""
    return simulate_cluster(
        w, pools, router=RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
        block_size=16, max_batched_tokens=budget, max_running=32, fast_forward=fast_forward,
        debug=True, until_s=until_s)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40),
       rate=st.sampled_from([5.0, 50.0, 500.0]),
       weights=st.tuples(st.sampled_from([1.0, 4.0]), st.sampled_from([1.0, 4.0])),
       overlap=st.booleans(), layout=st.sampled_from(["pd", "mixed2"]))
def test_shared_pool_fast_forward_equals_stepping(seed, n, rate, weights, overlap, layout):
    rng = np.random.default_rng(seed)
    w = make_workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 700, n),
                      rng.integers(1, 150, n))
    a = SharedStepModel(Split(2e-5, 3e-5, weights[0]), "sms", 1.5, overlap=overlap)
    b = SharedStepModel(Split(1e-5, 5e-5, weights[1]), "sms", 1.5, overlap=overlap)
    roles = ("prefill", "decode") if layout == "pd" else ("mixed", "mixed")
    pools = [PoolSetup(name=f"x{i}", role=role, num_replicas=1, step_model=m,
                       num_kv_blocks=3000, link_bw_bytes_per_s=math.inf)
             for i, (role, m) in enumerate(zip(roles, (a, b), strict=True))]
    out = []
    for ff in (True, False):
        rec, cluster = _sms_run(w, pools, ff)
        assert len(rec.requests["request_id"]) == n  # every request finishes
        assert cluster.resources is not None and not cluster.resources.active
        out.append(rec)
    for col in ("first_token_s", "finish_s", "replica_id"):
        ff, step = by_id(out[0], col), by_id(out[1], col)
        assert ff.keys() == step.keys()
        for k in ff:
            assert ff[k] == pytest.approx(step[k], rel=1e-9, abs=1e-12), (col, k)


@settings(max_examples=200, deadline=None)
@given(demands=st.lists(st.floats(0.01, 50.0), min_size=1, max_size=5),
       total=st.floats(0.5, 100.0))
def test_ddr_sharing_of_the_soc_is_a_special_case(demands, total):
    """Agent.xpu's DDR (``perf/soc_contention.share_bandwidth``: max-min of bytes/s, each op
    capped at its demand) is one resource here: jobs drawing 1 byte per unit, capped at their
    demand, equal weights -- so the SoC can move onto this service unchanged."""
    from fleetsim.perf.soc_contention import share_bandwidth

    jobs = [Job(1.0, {"ddr": 1.0}, 1.0, d, lambda j: None, None, "") for d in demands]
    assert max_min_rates(jobs, {"ddr": total}) == pytest.approx(
        share_bandwidth(demands, total), rel=1e-9)


def _soc_pools(layout):
    """An SoC's NPU and iGPU pools (Llama-3.2-3B at 4.5 bits on Lunar Lake), P/D or two mixed."""
    from fleetsim.models import get_model
    from fleetsim.perf.soc import ModelCost
    from fleetsim.perf.soc_calibration import lunar_lake
    from fleetsim.soc_pools import soc_step_model

    soc, cost = lunar_lake(), ModelCost(get_model("Llama-3.2-3B"), 4.5)
    roles = ("prefill", "decode") if layout == "pd" else ("mixed", "mixed")
    return [PoolSetup(name=acc, role=role, num_replicas=1,
                      step_model=soc_step_model(soc, cost, acc), num_kv_blocks=3000,
                      link_bw_bytes_per_s=math.inf)
            for acc, role in zip(("npu", "igpu"), roles, strict=True)]


def _soc_run(w, pools, make_batch_policy, ordering, fast_forward):
    """``w`` on the SoC's pools (round robin, then least loaded to decode), checked: everyone
    finishes and the DDR ends idle. Returns (records, cluster)."""
    rec, cluster = simulate_cluster(
        w, pools, router=RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=make_batch_policy, order_key=make_ordering(ordering),
        rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
        block_size=16, max_batched_tokens=512, max_running=16, fast_forward=fast_forward,
        debug=True)
    assert len(rec.requests["request_id"]) == len(w)
    assert cluster.resources is not None and not cluster.resources.active
    return rec, cluster


def _same_bins(fast, slow, num_replicas):
    """The summary's timeline, in the bins the run recorded with (windows stop at their
    edges), of a fast-forward run equals stepping's, but for the order floats are added in.
    (A workload arriving at one instant has none: its summary's bins are approximate.)"""
    if not math.isfinite(slow.timeline_bin_s):
        return
    end_s = float(slow.requests["finish_s"].max())
    bins = [timeline_bins(rec, 0.0, end_s, 6000, num_replicas, 10_000) for rec in (fast, slow)]
    for key in ("kv_used_fraction", "busy_fraction", "mean_running", "mean_waiting"):
        assert bins[0][key] == pytest.approx(bins[1][key], rel=1e-9, abs=1e-12), key


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30),
       rate=st.sampled_from([0.5, 5.0, 50.0]), layout=st.sampled_from(["pd", "mixed2"]))
def test_soc_pools_fast_forward_equal_stepping(seed, n, rate, layout):
    """An SoC's NPU and iGPU (``cluster.soc``): steps capped at their own DDR demand, windows
    priced vectorized. Everyone finishes, the DDR ends idle, fast-forward equals stepping."""
    rng = np.random.default_rng(seed)
    w = make_workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 1500, n),
                      rng.integers(1, 120, n))
    pools = _soc_pools(layout)
    out = [_soc_run(w, pools, TokenBudgetPlanner, "fcfs", ff)[0] for ff in (True, False)]
    for col in ("first_token_s", "finish_s", "replica_id"):
        ff, step = by_id(out[0], col), by_id(out[1], col)
        assert ff.keys() == step.keys()
        for k in ff:
            assert ff[k] == pytest.approx(step[k], rel=1e-9, abs=1e-12), (col, k)
    _same_bins(out[0], out[1], len(pools))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30),
       rate=st.sampled_from([0.5, 5.0, 50.0]), layout=st.sampled_from(["pd", "mixed2"]),
       igpu=st.sampled_from(["agent_xpu", "token_budget"]), slack=st.sampled_from([0.0, 0.1]))
def test_bandwidth_aware_dispatch_fast_forward_equals_stepping(seed, n, rate, layout, igpu,
                                                               slack):
    """Agent.xpu's bandwidth-aware dispatch on the NPU (``agent_xpu``, reactive and proactive
    requests) beside an iGPU under the same policy (whose one-class decode steps fast-forward,
    ``StepPlan.repeats``) or under one that fast-forwards all its decode windows: the NPU's
    vetoes and wake-ups cut those windows, so fast-forward equals stepping request by
    request, bit for bit; everyone finishes (a vetoed replica is always woken) and the DDR
    ends idle."""
    from fleetsim.policies.agent_xpu import AgentXpuPlanner

    rng = np.random.default_rng(seed)
    w = make_workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 1500, n),
                      rng.integers(1, 120, n), priority=rng.integers(0, 2, n))
    pools = _soc_pools(layout)
    out = []
    for ff in (True, False):
        made = []

        def make_policy(made=made):  # replica 0 (the NPU) first, then the iGPU
            made.append(AgentXpuPlanner(chunk_tokens=256, reactive_slack=slack)
                        if not made or igpu == "agent_xpu" else TokenBudgetPlanner())
            return made[-1]

        rec, cluster = _soc_run(w, pools, make_policy, "priority", ff)
        assert not any(r.shared.waiting for r in cluster.replicas)
        out.append(rec)
    for col, values in out[1].requests.items():
        assert np.array_equal(values, out[0].requests[col], equal_nan=True), col
    for col in ("num_tokens", "num_steps"):  # (a window's row holds many steps)
        assert out[0].timeline[col].sum() == out[1].timeline[col].sum(), col
    _same_bins(out[0], out[1], len(pools))


class CappedSplit(Split):
    """``Split`` whose steps draw at most ``max_rate`` and whose ``split`` has no side
    effect (``scalar_windows``): decode windows may run beside another pool's job."""

    scalar_windows = True

    def __init__(self, private_per_token_s, work_per_token, weight, max_rate, fixed_s):
        super().__init__(private_per_token_s, work_per_token, weight)
        self.max_rate, self.fixed_s = max_rate, fixed_s

    def split(self, chunks, num_decode, kv_tokens):
        d = super().split(chunks, num_decode, kv_tokens)
        # the KV read grows the work: later decode steps take longer beside the same job;
        # a long fixed private part outlasts the shared one (the step ends after its work)
        return StepDemand(d.private_s + self.fixed_s, d.work + 2e-6 * kv_tokens, d.weight,
                          self.max_rate)


def _service_totals(cluster):
    svc = cluster.resources
    return (dict(svc.work_by_client), dict(svc.used_by_resource), svc.num_jobs,
            svc.num_changes, [r.shared.num_shared_steps for r in cluster.replicas])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40),
       rate=st.sampled_from([5.0, 50.0, 500.0]),
       weights=st.tuples(st.sampled_from([1.0, 4.0]), st.sampled_from([1.0, 4.0])),
       caps=st.tuples(st.sampled_from([0.4, 1.0, math.inf]),
                      st.sampled_from([0.4, 1.0, math.inf])),
       fixed=st.tuples(st.sampled_from([0.0, 0.004]), st.sampled_from([0.0, 0.004])),
       layout=st.sampled_from(["pd", "mixed2", "mixed3"]),
       until=st.one_of(st.just(math.inf), st.floats(0.02, 3.0)),
       budget=st.sampled_from([1024, 96]))
# (chains whose successors' advances come after the window's step's, as the service lists
# them; in the other order the resource's use differs in its last bits)
@example(seed=0, n=6, rate=50.0, weights=(1.0, 4.0), caps=(math.inf, math.inf),
         fixed=(0.0, 0.0), layout="pd", until=math.inf, budget=96)
@example(seed=1, n=3, rate=50.0, weights=(1.0, 4.0), caps=(1.0, 0.4), fixed=(0.0, 0.0),
         layout="pd", until=math.inf, budget=96)
# (both replicas' jobs done at one check, the decode window's first end event at that very
# time: stale, it must not come before the prefill's end, which hands a request over)
@example(seed=6818, n=35, rate=50.0, weights=(1.0, 4.0), caps=(0.4, math.inf),
         fixed=(0.0, 0.0), layout="pd", until=math.inf, budget=1024)
def test_windows_beside_a_job_equal_stepping_bit_for_bit(seed, n, rate, weights, caps, fixed,
                                                         layout, until, budget):
    """Decode windows run beside another replica's job (``serving/beside.py``) replay the
    service's events: every request's times, the work each client did, the resource's use
    and the service's counts of jobs and allocations equal step by step's bit for bit,
    also when the run stops mid-window (``until_s``), when a third replica's job comes
    (``mixed3``: three replicas on the resource) and when prompts are prefilled in chunks
    (``budget`` 96: the windows run on through the chunks the replay predicts, and are cut
    where the prefill replica runs another step, two prompts' chunks packed in one)."""
    rng = np.random.default_rng(seed)
    w = make_workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 700, n),
                      rng.integers(1, 150, n))
    a = SharedStepModel(CappedSplit(2e-5, 3e-5, weights[0], caps[0], fixed[0]), "sms", 1.5,
                        overlap=True)
    b = SharedStepModel(CappedSplit(1e-5, 5e-5, weights[1], caps[1], fixed[1]), "sms", 1.5,
                        overlap=True)
    roles = {"pd": ("prefill", "decode"), "mixed2": ("mixed", "mixed"),
             "mixed3": ("mixed", "mixed", "mixed")}[layout]
    models = (a, b, SharedStepModel(CappedSplit(3e-5, 2e-5, 2.0, caps[1], fixed[0]), "sms",
                                    1.5, overlap=True))
    pools = [PoolSetup(name=f"x{i}", role=role, num_replicas=1, step_model=m,
                       num_kv_blocks=3000, link_bw_bytes_per_s=math.inf)
             for i, (role, m) in enumerate(zip(roles, models[:len(roles)], strict=True))]
    out, totals = [], []
    for ff in (True, False):
        rec, cluster = _sms_run(w, pools, ff, until, budget)
        if until == math.inf:
            assert len(rec.requests["request_id"]) == n
            assert not cluster.resources.active
        out.append(rec)
        totals.append(_service_totals(cluster))
    for col, values in out[1].requests.items():
        assert np.array_equal(values, out[0].requests[col], equal_nan=True), col
    assert totals[0] == totals[1]
    for col in ("num_tokens", "num_steps"):  # (a window's row holds many steps)
        assert out[0].timeline[col].sum() == out[1].timeline[col].sum(), col


def test_a_decode_replica_beside_a_prefill_job_fast_forwards():
    """An SoC's iGPU decoding while the NPU prefills (the P/D pair on one DDR): its decode
    steps run as windows beside the NPU's job, not one job each, and the results are step by
    step's. Mutations that skip one of the replay's advances, or its count of allocations,
    fail here or in the property test above."""
    rng = np.random.default_rng(3)
    n = 40
    w = make_workload(np.cumsum(rng.exponential(1 / 2.0, n)), rng.integers(500, 1500, n),
                      rng.integers(50, 120, n))
    pools = _soc_pools("pd")
    runs = [_soc_run(w, pools, TokenBudgetPlanner, "fcfs", ff) for ff in (True, False)]
    (rec_ff, ff), (rec_step, step) = runs
    igpu_ff, igpu_step = ff.replicas[1].shared, step.replicas[1].shared
    assert igpu_ff.num_windows_beside > 10 and igpu_step.num_windows_beside == 0
    # every decode step stepping ran as a job beside the NPU's ran so in the windows too
    assert igpu_ff.num_shared_steps == igpu_step.num_shared_steps > 100
    assert ff.sim.num_events < step.sim.num_events / 2
    for col, values in rec_step.requests.items():
        assert np.array_equal(values, rec_ff.requests[col], equal_nan=True), col
    assert _service_totals(ff) == _service_totals(step)


def test_a_decode_window_runs_on_through_the_prefills_next_chunks(monkeypatch):
    """Agent.xpu's NPU prefills each prompt in 256-token chunks beside the iGPU's decodes: an
    iGPU window beside one chunk's job runs on through the prompt's next chunks (a chain,
    ``serving/beside.py``: each successor the NPU starts is checked against the one the
    replay priced), so it opens less than half the windows it does without (no successor
    predicted), and every request, the work each accelerator did, the DDR's use and the
    service's counts of jobs and allocations equal step by step's, bit for bit, with chains
    and without."""
    from fleetsim import native
    from fleetsim.policies.agent_xpu import AgentXpuPlanner
    from fleetsim.serving.shared_steps import SharedSteps

    rng = np.random.default_rng(5)
    n = 40
    w = make_workload(np.cumsum(rng.exponential(1 / 0.5, n)), rng.integers(600, 2000, n),
                      rng.integers(50, 200, n))
    pools = _soc_pools("pd")

    def runs():
        return [_soc_run(w, pools, lambda: AgentXpuPlanner(chunk_tokens=256), "fcfs", ff)
                for ff in (True, False)]

    chained = runs()
    both = [chained]
    if native.engine().startswith("python"):  # (a compiled class's method stays its own)
        monkeypatch.setattr(SharedSteps, "chunk_successors", lambda self: None)
        both.append(runs())
    windows = []
    for (rec_ff, ff), (rec_step, step) in both:
        for col, values in rec_step.requests.items():
            assert np.array_equal(values, rec_ff.requests[col], equal_nan=True), col
        assert _service_totals(ff) == _service_totals(step)
        assert step.replicas[1].shared.num_links == 0
        windows.append(ff.replicas[1].shared.num_windows_beside)
    npu, igpu = chained[0][1].replicas[0].shared, chained[0][1].replicas[1].shared
    chunks = npu.num_shared_steps + npu.num_alone_steps
    # (232 chunks: 177 links and 117 windows; 268 windows without chains)
    assert igpu.num_links > chunks / 2
    if len(both) == 2:
        assert windows[0] < windows[1] / 2
        assert both[1][0][1].replicas[1].shared.num_links == 0
