"""The laptop-SoC model behind ``fleetsim repro agent-xpu``: DDR sharing, the device model's
derivation from measurements, Agent.xpu's mechanisms (preemption within one chunk, backfill that
never jumps a waiting reactive request, piggybacking and bandwidth-aware throttling within the
slack) against the FCFS baselines, determinism and bad input."""

from __future__ import annotations

import pytest

from fleetsim.cli import main
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost
from fleetsim.perf.soc_calibration import (
    CALIBRATION,
    lunar_lake,
    model_errors,
    predicted_tokens_per_s,
)
from fleetsim.perf.soc_contention import share_bandwidth
from fleetsim.soc.agent_xpu import AgentXpu
from fleetsim.soc.baselines import IgpuOnly, StaticPartition, best_npu_share
from fleetsim.soc.engine import (
    Job,
    Part,
    Request,
    SoCEngine,
    SoCResult,
    SoCView,
    concurrent_s,
    part_rates,
)
from fleetsim.workloads.agent_traffic import AgentTraffic

SOC = lunar_lake()
COST = ModelCost(get_model("Llama-3.2-3B"), 4.5)


def run(scheduler, **traffic) -> SoCResult:
    return SoCEngine(SOC, COST, AgentTraffic(**traffic), scheduler).run()


# ---- DDR sharing and the device model ------------------------------------------------------

@pytest.mark.parametrize(("demands", "total", "want"), [
    ([10.0, 100.0], 50.0, [10.0, 40.0]),   # the small asker is served in full
    ([100.0, 100.0], 50.0, [25.0, 25.0]),  # equal askers split evenly
    ([10.0, 20.0], 50.0, [10.0, 20.0]),    # room for both
    ([0.0, 80.0, 30.0], 60.0, [0.0, 30.0, 30.0]),
])
def test_share_bandwidth_is_max_min_fair(demands, total, want):
    alloc = share_bandwidth(demands, total)
    assert alloc == pytest.approx(want)
    assert sum(alloc) == pytest.approx(min(total, sum(demands)))


def test_share_bandwidth_rejects_bad_input():
    with pytest.raises(ValueError, match="total bandwidth must be > 0"):
        share_bandwidth([1.0], 0.0)
    with pytest.raises(ValueError, match="demands must be >= 0"):
        share_bandwidth([-1.0], 10.0)


def test_contention_slows_decode_more_than_prefill():
    """Asymmetric DDR contention: an iGPU decode loses speed to an NPU prefill chunk running
    beside it; the compute-bound chunk keeps (nearly) all of its own."""
    decode = Part("igpu", COST.decode([1024]))
    prefill = Part("npu", COST.prefill(256, 0))
    decode_alone, prefill_alone = part_rates(SOC, [decode])[0], part_rates(SOC, [prefill])[0]
    decode_shared, prefill_shared = part_rates(SOC, [decode, prefill])
    decode_slowdown = decode_alone / decode_shared
    prefill_slowdown = prefill_alone / prefill_shared
    assert decode_slowdown > 1.1
    assert prefill_slowdown == pytest.approx(1.0)
    assert decode_slowdown > prefill_slowdown


def test_two_decodes_share_the_ddr():
    """Two memory-bound halves of one decode step together draw no more than one accelerator
    alone could: splitting decode over NPU and iGPU does not speed it up."""
    op = COST.decode([1024])
    alone = concurrent_s(SOC, [Part("igpu", op)])[0]
    split = max(concurrent_s(SOC, [Part("igpu", op.scaled(0.5)), Part("npu", op.scaled(0.5))]))
    assert split >= alone * 0.999
    assert best_npu_share(SOC, op) == 0.0
    assert 0.0 < best_npu_share(SOC, COST.prefill(1024, 0)) < 1.0


def test_efficiencies_reproduce_their_calibration_measurements():
    for m in CALIBRATION:
        assert predicted_tokens_per_s(SOC, m) == pytest.approx(m.tokens_per_s, rel=1e-9)
    assert 0 < SOC.igpu.compute_eff < 1 and 0 < SOC.npu.memory_eff < SOC.igpu.memory_eff
    # held-out errors are reported, and they are finite figures of the right sign convention
    for m, predicted, err in model_errors(SOC):
        assert err == pytest.approx(predicted / m.tokens_per_s - 1.0)


def test_affinity_follows_the_device_model():
    """Prefill chunks of 256 go to the NPU (more achieved FLOP/s), decode to the iGPU (three
    times the DDR draw); an 8-token chunk streams the weights for little arithmetic, so it is
    memory-bound and goes to the iGPU too."""
    assert AgentXpu(SOC, COST, chunk_tokens=256).prefill_accelerator == "npu"
    assert AgentXpu(SOC, COST, chunk_tokens=256).decode_accelerator == "igpu"
    assert AgentXpu(SOC, COST, chunk_tokens=8).prefill_accelerator == "igpu"


# ---- Agent.xpu's mechanisms ---------------------------------------------------------------

def _reactive_waits(result: SoCResult) -> list[tuple[float, float, str]]:
    """(ready since, job start, accelerator) for every job of every reactive request: ready
    since its arrival, then since the end of its previous job."""
    ready_since = {r.id: r.arrival_s for r in result.requests if r.reactive}
    waits = []
    for job in sorted(result.jobs, key=lambda j: j.start_s):
        for rid in job.request_ids:
            if rid in ready_since:
                waits.append((ready_since[rid], job.start_s, job.accelerators[0]))
                ready_since[rid] = job.end_s
    return waits


def _running_at(result: SoCResult, t: float, acc: str):
    return [j for j in result.jobs if j.start_s <= t < j.end_s and acc in j.accelerators]


def test_reactive_request_preempts_proactive_work_within_one_chunk():
    """Two proactive flows prefill 4,096-token prompts in 256-token chunks, one on the NPU and
    one backfilled on the iGPU; a reactive request arriving mid-prompt starts as soon as the
    first of the two chunks under way ends, not after the proactive prompts."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=2, duration_s=30.0,
                   reactive_times_s=(0.31,), reactive_lengths=(512, 4),
                   proactive_lengths=(4096, 4))
    result = run(AgentXpu(SOC, COST, chunk_tokens=256), **traffic)
    reactive = next(r for r in result.requests if r.reactive)
    first = min((j for j in result.jobs if reactive.id in j.request_ids), key=lambda j: j.start_s)
    under_way = [j for acc in ("npu", "igpu") for j in _running_at(result, reactive.arrival_s, acc)]
    assert len(under_way) == 2 and not any(j.reactive for j in under_way)
    assert all(j.kind == "prefill" for j in under_way)
    assert first.start_s == pytest.approx(min(j.end_s for j in under_way))
    assert first.start_s - reactive.arrival_s <= max(j.end_s - j.start_s for j in under_way)
    # FCFS serves the whole proactive requests first
    baseline = run(IgpuOnly(), **traffic)
    reactive_b = next(r for r in baseline.requests if r.reactive)
    assert reactive_b.first_token_s - reactive_b.arrival_s > 10 * (
        reactive.first_token_s - reactive.arrival_s)


def test_reactive_rules_on_the_igpu_engine():
    """One proactive flow decodes a long answer; a reactive request arrives mid-answer. FCFS
    serves it after the whole proactive request; ``reactive_next`` too, since that request
    has started (it only picks the next one to start); ``reactive_first`` stops the proactive
    request between two decode steps, so the reactive one starts within one step."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=1, duration_s=60.0,
                   reactive_times_s=(3.0,), reactive_lengths=(256, 4),
                   proactive_lengths=(256, 2000))

    def reactive_wait(order):
        res = run(IgpuOnly(order=order), **traffic)
        r = next(r for r in res.requests if r.reactive)
        return r.first_token_s - r.arrival_s, res

    fcfs, _ = reactive_wait("fcfs")
    nxt, _ = reactive_wait("reactive_next")
    first, res = reactive_wait("reactive_first")
    step_s = max(j.end_s - j.start_s for j in res.jobs if j.kind == "decode")
    prefill_s = max(j.end_s - j.start_s for j in res.jobs if j.reactive)
    assert fcfs == pytest.approx(nxt) and fcfs > 10.0
    assert first <= step_s + prefill_s + 1e-9
    assert all(r.done for r in res.requests)


def test_reactive_next_starts_the_earliest_reactive_request_once_the_engine_is_free():
    """Two requests wait behind a running one: a proactive one that arrived first and a
    reactive one after it. FCFS starts the proactive one next; ``reactive_next`` the
    reactive one (without stopping the request under way)."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=2, duration_s=60.0,
                   reactive_times_s=(0.5,), reactive_lengths=(256, 4),
                   proactive_lengths=(256, 400))

    def order_of_starts(order):
        res = run(IgpuOnly(order=order), **traffic)
        firsts = {}
        for j in sorted(res.jobs, key=lambda j: j.start_s):
            for rid in j.request_ids:
                firsts.setdefault(rid, j.start_s)
        by_id = {r.id: r for r in res.requests}
        return [by_id[rid].reactive for rid in sorted(firsts, key=firsts.get)][:3]

    assert order_of_starts("fcfs") == [False, False, True]
    assert order_of_starts("reactive_next") == [False, True, False]


def test_an_unknown_order_is_refused():
    with pytest.raises(ValueError, match="order must be one of fcfs, reactive_first"):
        IgpuOnly(order="lifo")


@pytest.mark.parametrize("chunk", [64, 256])
def test_backfill_never_delays_a_reactive_request_beyond_one_chunk(chunk):
    """Whenever a reactive request is ready, no proactive job starts on the accelerator it is
    waiting for, and it starts once the job under way there ends (unless another reactive
    request took the accelerator first)."""
    traffic = dict(reactive_per_min=6.0, num_proactive_flows=4, duration_s=120.0, seed=3)
    result = run(AgentXpu(SOC, COST, chunk_tokens=chunk), **traffic)
    violations = _backfill_violations(result)
    assert violations == []
    assert len(_reactive_waits(result)) > 100  # the check saw real traffic
    # the FCFS baseline lets proactive work run ahead of waiting reactive requests
    assert _backfill_violations(run(IgpuOnly(), **traffic))


def _backfill_violations(result: SoCResult) -> list[tuple[float, float, str]]:
    bad = []
    for ready, start, acc in _reactive_waits(result):
        if start <= ready + 1e-9:
            continue
        between = [j for j in result.jobs if acc in j.accelerators
                   and ready - 1e-9 <= j.start_s < start - 1e-9]
        if any(not j.reactive for j in between):
            bad.append((ready, start, acc))
            continue
        if between:  # another reactive request went first
            continue
        under_way = _running_at(result, ready, acc)
        if not under_way or start > max(j.end_s for j in under_way) + 1e-9:
            bad.append((ready, start, acc))
    return bad


def test_piggybacking_stays_within_the_slack():
    xpu = AgentXpu(SOC, COST, reactive_slack=0.10)
    reactive = [Request(id=0, reactive=True, arrival_s=0.0, num_prompt_tokens=1000,
                        num_output_tokens=50, num_prefilled=1000, num_generated=1)]
    proactive = [Request(id=i, reactive=False, arrival_s=0.0, num_prompt_tokens=1000,
                         num_output_tokens=50, num_prefilled=1000, num_generated=1, flow=i)
                 for i in range(1, 9)]
    batch = xpu._piggyback(reactive, proactive)
    assert batch[0] is reactive[0] and 1 < len(batch) < 9
    assert xpu._step_s(batch) <= 1.10 * xpu._step_s(reactive)
    assert xpu._step_s(batch + [proactive[len(batch) - 1]]) > 1.10 * xpu._step_s(reactive)
    assert AgentXpu(SOC, COST, reactive_slack=0.0)._piggyback(reactive, proactive) == reactive


@pytest.mark.parametrize(("slack", "throttled"), [(0.10, True), (1.0, False)])
def test_bandwidth_aware_dispatch_throttles_proactive_work_beside_a_reactive_decode(
        slack, throttled):
    xpu = AgentXpu(SOC, COST, reactive_slack=slack)
    talker = Request(id=0, reactive=True, arrival_s=0.0, num_prompt_tokens=1000,
                     num_output_tokens=50, num_prefilled=1000, num_generated=1, busy=True)
    background = Request(id=1, reactive=False, arrival_s=0.0, num_prompt_tokens=2000,
                         num_output_tokens=50, flow=0)
    decoding = Job(parts=(Part("igpu", COST.decode([1001])),), decode=(talker,))
    view = SoCView(now_s=0.0, soc=SOC, cost=COST, idle=frozenset({"npu"}),
                   running=(decoding,), ready=(background,))
    jobs = xpu.plan(view)
    assert (jobs == []) is throttled
    # with no reactive decode running, the same chunk backfills the NPU
    idle_view = SoCView(now_s=0.0, soc=SOC, cost=COST, idle=frozenset({"npu"}), running=(),
                        ready=(background,))
    assert [j.prefill for j in xpu.plan(idle_view)] == [background]


# ---- the engine ----------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: AgentXpu(SOC, COST, chunk_tokens=64), IgpuOnly,
                                  lambda: StaticPartition(SOC, COST),
                                  lambda: IgpuOnly(max_running=4)])
def test_every_request_finishes_with_every_token(make):
    result = run(make(), reactive_per_min=4.0, num_proactive_flows=3, duration_s=60.0, seed=1)
    assert result.requests and all(r.done for r in result.requests)
    for r in result.requests:
        assert r.num_prefilled == r.num_prompt_tokens
        assert r.num_generated == r.num_output_tokens
        assert r.arrival_s <= r.first_token_s <= r.finish_s
    decode_steps = sum(len(j.request_ids) for j in result.jobs if j.kind == "decode")
    assert decode_steps == sum(r.num_output_tokens - 1 for r in result.requests)
    for acc, busy in result.busy_s.items():  # an accelerator never works two jobs at once
        spans = sorted((j.start_s, j.end_s) for j in result.jobs if acc in j.accelerators)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
        assert busy <= result.end_s + 1e-9


def test_same_seed_same_result_and_seed_matters():
    def summary(seed):
        res = run(AgentXpu(SOC, COST), reactive_per_min=3.0, num_proactive_flows=2,
                  duration_s=30.0, seed=seed)
        return [(r.arrival_s, r.num_prompt_tokens, r.first_token_s, r.finish_s)
                for r in res.requests]
    assert summary(5) == summary(5)
    assert summary(5) != summary(6)


def test_traffic_rejects_bad_scripts():
    with pytest.raises(ValueError, match="reactive_times_s"):
        AgentTraffic(reactive_per_min=0, num_proactive_flows=0, duration_s=1.0,
                     reactive_times_s=(2.0,))
    with pytest.raises(ValueError, match="proactive_lengths"):
        AgentTraffic(reactive_per_min=0, num_proactive_flows=1, duration_s=1.0,
                     proactive_lengths=(0, 3))


# ---- fleetsim repro agent-xpu: bad input ---------------------------------------------------

@pytest.mark.parametrize(("setting", "needle"), [
    ("chunk_tokens=0", "chunk_tokens: got 0; must be in 1..8192"),
    ("reactive_slack=2", "reactive_slack"),
    ("num_proactive_flows=-1", "num_proactive_flows"),
    ("model=nosuchmodel", "unknown model"),
    ("chunk_size=8", "did you mean 'chunk_tokens'"),
])
def test_bad_setting_is_one_line_and_exit_2(setting, needle, capsys):
    assert main(["repro", "agent-xpu", "--quick", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
