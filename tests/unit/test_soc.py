"""The laptop-SoC model behind ``fleetsim repro agent-xpu``: DDR sharing, the device model's
derivation from measurements, Agent.xpu's scheduler on the engine (preemption within one
chunk, against the FCFS baselines), the iGPU engine's reactive rules, determinism and bad
input. The ``agent_xpu`` policy's own mechanism tests are in ``test_agent_xpu_policy.py``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.cli import main
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost, Part, best_npu_share, concurrent_s, part_rates
from fleetsim.perf.soc_calibration import (
    CALIBRATION,
    lunar_lake,
    model_errors,
    predicted_tokens_per_s,
)
from fleetsim.perf.soc_contention import share_bandwidth
from fleetsim.repro import agent_xpu as repro
from fleetsim.soc_pools import affinity
from fleetsim.soc_run import run_agent_traffic
from fleetsim.workloads.agent_traffic import AgentTraffic

SOC = lunar_lake()
COST = ModelCost(get_model("Llama-3.2-3B"), 4.5)
SETUP = repro.AgentXpuSetup()


def run(system: repro.OnEngine, setup: repro.AgentXpuSetup = SETUP, **traffic):
    """``traffic`` served by ``system`` on the engine: its requests by id, as arrays, and
    which were reactive."""
    out = run_agent_traffic(repro.engine_config(setup, system), AgentTraffic(**traffic))
    r = out.records.requests
    order = np.argsort(r["request_id"])
    rows = {k: v[order] for k, v in r.items()}
    rows["reactive"] = np.isin(rows["request_id"], sorted(out.reactive_ids))
    return rows


XPU = repro.agent_xpu_system(SETUP, COST)


# ---- DDR sharing and the device model ------------------------------------------------------

@pytest.mark.parametrize("accelerator", ["npu", "igpu"])
def test_a_steps_split_is_the_roofline_of_its_op(accelerator):
    """``SocSplit`` prices a step from constants kept at construction (the model's attention
    shape, a decode token's attention FLOPs, the accelerator's FLOP rate): the same floats as
    the op cost and ``flops_s`` computed from the specs, for prefill chunks and decodes."""
    from fleetsim.perf.soc import SocSplit, draw_bytes_per_s, flops_s

    m = COST.model
    assert COST.decode_attention_flops == (4.0 * 1 * 1 * m.num_attention_heads * m.head_dim
                                           * m.num_layers)
    split = SocSplit(COST, SOC, accelerator)
    acc = SOC.accelerator(accelerator)
    for chunks, num_decode, kv_tokens in (((), 1, 7), (((256, 0),), 0, 0),
                                          (((100, 900), (3, 0)), 5, 4321), ((), 64, 10**6)):
        op = COST.step(list(chunks), num_decode, kv_tokens)
        private_s = flops_s(acc, op.flops)
        demand = draw_bytes_per_s(private_s, op.bytes, split.max_draw_bytes_per_s)
        assert split.split(chunks, num_decode, kv_tokens) == (private_s, op.bytes, 1.0, demand)
    contexts = [10, 2000, 37]
    assert COST.decode(contexts) == COST.step((), len(contexts), sum(contexts) - len(contexts))


@settings(max_examples=300, deadline=None)
@given(accelerator=st.sampled_from(["npu", "igpu"]), num_decode=st.integers(0, 512),
       kv_tokens=st.integers(0, 4_000_000))
def test_a_decode_step_is_priced_as_the_general_split_prices_it(accelerator, num_decode,
                                                                kv_tokens):
    """A decode window's shortcut (``SocSplit.decode_split``, no walk over prefill chunks)
    gives the general split's floats bit for bit, and so do the step model's decode prices
    (``decode_alone_s``: the split and the price in one, overlapped or not)."""
    from fleetsim.serving.shared_steps import SharedStepModel
    from fleetsim.soc_pools import soc_step_model

    model = soc_step_model(SOC, COST, accelerator)
    split = model.splitter
    assert split.decode_split(num_decode, kv_tokens) == split.split((), num_decode, kv_tokens)
    assert model.decode_parts(num_decode, kv_tokens) == model.parts((), num_decode, kv_tokens)
    serial = SharedStepModel(split, model.resource, model.capacity_per_s, overlap=False)
    if num_decode:
        for m in (model, serial):
            assert m.decode_step_s(num_decode, kv_tokens) == m.step_time_s(
                [], num_decode, kv_tokens)


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
    memory-bound and goes to the iGPU too (then one mixed pool there runs everything)."""
    assert affinity(SOC, COST, 256) == ("npu", "igpu")
    assert affinity(SOC, COST, 8) == ("igpu", "igpu")
    small = repro.agent_xpu_system(dataclasses.replace(SETUP, chunk_tokens=8), COST)
    assert small.pools == (("igpu", "igpu", "mixed"),)


# ---- Agent.xpu's scheduler and the iGPU engine's rules on the engine -----------------------

def test_reactive_request_preempts_proactive_work_within_one_chunk():
    """Two proactive flows prefill 4,096-token prompts in 256-token chunks on the NPU; a
    reactive request arriving mid-prompt gets its first token within a few chunks, not after
    the proactive prompts, as an FCFS iGPU engine gives it."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=2, duration_s=30.0,
                   reactive_times_s=(0.31,), reactive_lengths=(512, 4),
                   proactive_lengths=(4096, 4), max_prompt_tokens=4096)
    setup = dataclasses.replace(SETUP, max_prompt_tokens=4096)
    chunk_s = 256 * 2 * COST.model.num_params / (SOC.npu.peak_fp16_flops * SOC.npu.compute_eff)
    rows = run(XPU, setup, **traffic)
    rx = rows["reactive"]
    wait = float((rows["first_token_s"] - rows["arrival_s"])[rx][0])
    # one proactive chunk under way, then the reactive prompt's two chunks (and slack)
    assert wait < 4 * chunk_s
    # the proactive prompts it overtook were not finished yet
    assert (rows["first_token_s"][~rx] > rows["first_token_s"][rx][0]).all()
    fcfs = run(repro.OnEngine(repro.IGPU), setup, **traffic)
    fcfs_wait = float((fcfs["first_token_s"] - fcfs["arrival_s"])[fcfs["reactive"]][0])
    assert fcfs_wait > 10 * wait


def test_reactive_rules_on_the_igpu_engine():
    """One proactive flow decodes a long answer; a reactive request arrives mid-answer. FCFS
    serves it after the whole proactive request; a priority queue too, since that request
    has started (it only picks the next one to start); priority with pausing stops the
    proactive request between two decode steps, so the reactive one starts within a step."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=1, duration_s=60.0,
                   reactive_times_s=(3.0,), reactive_lengths=(256, 4),
                   proactive_lengths=(256, 2000))

    def reactive_ttft(system):
        rows = run(system, **traffic)
        assert np.isfinite(rows["finish_s"]).all()  # every request ran to its end
        return float((rows["first_token_s"] - rows["arrival_s"])[rows["reactive"]][0])

    fcfs = reactive_ttft(repro.OnEngine(repro.IGPU))
    nxt = reactive_ttft(repro.OnEngine(repro.IGPU, ordering="priority"))
    first = reactive_ttft(repro.OnEngine(repro.IGPU, ordering="priority", pause=True))
    assert fcfs == pytest.approx(nxt) and fcfs > 10.0
    assert first < 1.0


def test_a_priority_queue_starts_the_earliest_reactive_request_once_the_engine_is_free():
    """Two requests wait behind a running one: a proactive one that arrived first and a
    reactive one after it. FCFS starts the proactive one next; the priority queue the
    reactive one (without stopping the request under way)."""
    traffic = dict(reactive_per_min=0.0, num_proactive_flows=2, duration_s=60.0,
                   reactive_times_s=(0.5,), reactive_lengths=(256, 4),
                   proactive_lengths=(256, 400))

    def order_of_starts(ordering):
        rows = run(repro.OnEngine(repro.IGPU, ordering=ordering), **traffic)
        starts = np.argsort(rows["first_scheduled_s"], kind="stable")
        return rows["reactive"][starts].tolist()[:3]

    assert order_of_starts("fcfs") == [False, False, True]
    assert order_of_starts("priority") == [False, True, False]


@pytest.mark.parametrize("system", [XPU, repro.OnEngine(repro.IGPU),
                                    repro.OnEngine(repro.SPLIT),
                                    repro.OnEngine(repro.IGPU, max_running=4)])
def test_every_request_finishes_with_every_token(system):
    traffic = AgentTraffic(reactive_per_min=4.0, num_proactive_flows=3, duration_s=60.0, seed=1)
    rows = run(system, **dataclasses.asdict(traffic))
    assert len(rows["request_id"]) > 5 and np.isfinite(rows["finish_s"]).all()
    assert (rows["arrival_s"] <= rows["first_token_s"]).all()
    assert (rows["first_token_s"] <= rows["finish_s"]).all()


def test_same_seed_same_result_and_seed_matters():
    def summary(seed):
        rows = run(XPU, reactive_per_min=3.0, num_proactive_flows=2, duration_s=30.0,
                   seed=seed)
        return [rows[k].tolist() for k in ("arrival_s", "num_prompt_tokens", "first_token_s",
                                           "finish_s")]
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
