"""Speculative decoding composed with pipeline and expert parallelism: the step models wrap one
another (``perf/speculative.speculative_step_model``). The reductions (no speculation, one
stage) give back the existing models; the combined cases are checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.moe.serving import EpStepModel, PoolEpConfig
from fleetsim.perf import build_step_model
from fleetsim.perf.pipeline import build_pipeline_step_model, p2p_s
from fleetsim.perf.speculative import SpeculativeStepModel, speculative_step_model

H100 = get_gpu("h100-sxm")
H200 = get_gpu("h200")
LLAMA_8B = get_model("llama-3.1-8b")
LLAMA_70B = get_model("llama-3.1-70b")
MIXTRAL = get_model("mixtral-8x7b")
OVERHEADS = {"step_overhead_s": 1.5e-3, "step_overhead_per_seq_s": 0.0,
             "kernel_time_scale": 1.0, "async_scheduling": False, "async_step_gap_s": 160e-6}
EAGLE3 = SpeculativeConfig(method="eagle3", num_speculative_tokens=3)
SHAPES = [((), 1, 500), ((), 2, 4000), ((), 7, 7 * 900), ((), 64, 64 * 1000),
          (((512, 0),), 0, 0), (((300, 100), (20, 0)), 5, 5 * 700)]


@pytest.fixture(scope="module")
def pp2():
    return build_pipeline_step_model(LLAMA_70B, H100, 4, 2, "roofline", **OVERHEADS)


def test_no_speculation_is_the_pipeline_bit_for_bit(pp2):
    """k = 0 (one verified position, no draft pass) prices exactly as the plain pipeline."""
    same = pp2.with_speculation(0, 0, "k=0")
    for chunks, n, kv in SHAPES:
        assert same.step_time_s(chunks, n, kv) == pp2.step_time_s(chunks, n, kv)
    kv = np.array([0, 17, 123_457], dtype=np.int64)
    assert same.decode_step_times_s(9, kv).tolist() == pp2.decode_step_times_s(9, kv).tolist()


def test_one_stage_is_the_speculative_table_model():
    """pp = 1: the pipeline's verify and draft pricing is the single replica's."""
    one = build_pipeline_step_model(LLAMA_8B, H100, 1, 1, "roofline", **OVERHEADS)
    table = build_step_model(LLAMA_8B, H100, 1, "roofline", step_overhead_s=1.5e-3)
    for method in ("eagle3", "ngram"):
        cfg = SpeculativeConfig(method=method, num_speculative_tokens=3, acceptance=0.6)
        piped = speculative_step_model(one, LLAMA_8B, cfg)
        flat = SpeculativeStepModel(table, LLAMA_8B, cfg)
        for chunks, n, kv in SHAPES:
            assert piped.step_time_s(chunks, n, kv) == pytest.approx(
                flat.step_time_s(chunks, n, kv), rel=1e-12)


def _stage_times_s(pp2, k: int, n: int, kv: int) -> tuple[list[float], float]:
    """By hand, for a micro-batch of ``n`` decodes verifying ``k + 1`` positions each: every
    stage's kernels (the first without the LM head), the drafter's ``k`` one-layer passes on
    the last stage, and the send of the verified positions' activations between them."""
    first, last = pp2.stages
    v = n * (k + 1)
    stage0 = first.step_parts_s((), v, v, n, kv) - first.per_sequence_s(v)
    layers = last.model.num_layers
    draft = (last.layer_pass_s(v, n, kv, layers)
             + (k - 1) * last.layer_pass_s(n, n, kv, layers))
    stage1 = last.step_parts_s((), v, v, n, kv) + draft
    send = p2p_s(pp2.send_bytes_per_token * v, pp2.send_bw[0])
    return [stage0, stage1], send


def test_a_lone_request_pays_every_stage_and_the_draft_on_the_last(pp2):
    """One request: the step is its trip: CPU + both stages' verify pass + the drafter (on the
    last stage, vLLM's) + the send of k + 1 positions' activations."""
    spec = speculative_step_model(pp2, LLAMA_70B, EAGLE3)
    stages, send = _stage_times_s(pp2, 3, 1, 500)
    assert spec.step_time_s((), 1, 500) == pytest.approx(1.5e-3 + sum(stages) + send,
                                                         rel=1e-12)
    # the drafter runs on the last stage only: a second request rides in the other
    # micro-batch, and the step is then the cycle of the two
    assert spec.step_time_s((), 2, 1000) >= spec.step_time_s((), 1, 500)


def test_vectorized_decode_is_bit_exact(pp2):
    spec = speculative_step_model(pp2, LLAMA_70B, EAGLE3)
    for n in (1, 2, 5, 64):
        kv = np.array([0, 1, 999, 123_456], dtype=np.int64)
        assert spec.decode_step_times_s(n, kv).tolist() == [
            spec.step_time_s((), n, int(x)) for x in kv]


@pytest.fixture(scope="module")
def mixtral_ep():
    table = build_step_model(MIXTRAL, H200, 2, "roofline")
    return table, EpStepModel(table, MIXTRAL, H200, 2, PoolEpConfig(), seed=0)


def test_speculation_over_expert_parallelism_routes_the_verified_positions(mixtral_ep):
    """Speculation over EP: the table's speculative step plus the EP change of the MoE layers
    at the verified token count, and for each draft pass one layer's share of it."""
    table, ep = mixtral_ep
    over_ep = speculative_step_model(ep, MIXTRAL, EAGLE3)
    over_table = SpeculativeStepModel(table, MIXTRAL, EAGLE3)
    layers = MIXTRAL.num_layers
    for n, kv in [(1, 500), (16, 16 * 2000), (128, 128 * 1000)]:
        v = n * 4
        expected = (over_table.step_time_s((), n, kv) + ep._moe_delta_s(v)
                    + ep._moe_delta_s(v) / layers + 2 * ep._moe_delta_s(n) / layers)
        assert over_ep.step_time_s((), n, kv) == pytest.approx(expected, rel=1e-12)
    # prefill-only steps are not speculated: the EP model's own price
    assert over_ep.step_time_s(((512, 0),), 0, 0) == pytest.approx(
        ep.step_time_s(((512, 0),), 0, 0), rel=1e-12)
    assert over_ep.ep_balance_ratio == ep.balance_ratio


def test_ep_without_speculation_is_the_ep_model(mixtral_ep):
    """k = 0 over EP (one verified position, no draft): the EP model's step."""
    _, ep = mixtral_ep
    same = SpeculativeStepModel(ep, MIXTRAL, EAGLE3)
    same.num_verify, same.num_draft_passes = 1, 0
    for chunks, n, kv in SHAPES:
        assert same.step_time_s(chunks, n, kv) == pytest.approx(ep.step_time_s(chunks, n, kv),
                                                                rel=1e-12)


# ---- end to end ----------------------------------------------------------------------------
def _summary(*sets):
    from fleetsim.config import load_config
    from fleetsim.run import run

    config = load_config(None, ["workload.trace='synthetic'", "workload.arrival='at_once'",
                                "workload.num_requests=8",
                                "workload.prompt_tokens={kind='fixed', value=200}",
                                "workload.output_tokens={kind='fixed', value=60}",
                                "workload.max_concurrency=1", *sets])
    return run(config).summary


@pytest.mark.parametrize("layout", [
    ["model=llama-3.1-70b", "hardware.gpu=h100-sxm", "hardware.tp=4", "hardware.pp=2"],
    ["model=mixtral-8x7b", "hardware.gpu=h200", "hardware.tp=2", "hardware.ep={}"],
    ["model=mixtral-8x7b", "hardware.gpu=h200", "hardware.tp=2", "hardware.pp=2",
     "hardware.ep={}"],
])
def test_speculation_runs_with_pipeline_and_expert_parallelism(layout):
    """Formerly refused; now batch-one decoding speeds up as it does on one replica, every
    request finishes."""
    base = _summary(*layout)
    fast = _summary(*layout, "engine.speculative.method=eagle3",
                    "engine.speculative.num_speculative_tokens=3")
    assert fast["num_finished"] == base["num_finished"] == 8
    assert fast["tpot_s"]["mean"] < 0.7 * base["tpot_s"]["mean"]


def test_plan_tries_pipeline_shapes_with_speculation():
    """``fleetsim plan --pp 1,2 --speculative``: pipeline shapes get the speculative twin too
    (they used to run without it); wide-EP shapes still do not."""
    from fleetsim.search.plan import enumerate_shapes

    shapes = enumerate_shapes(["h100"], [4], 8, pps=(1, 2), speculative=(None, EAGLE3),
                              dp_attention=(1, 2))
    piped = [s for s in shapes if s.pools[0].pp == 2]
    assert piped and {s.speculative for s in piped} == {None, EAGLE3}
    assert all(s.speculative is None for s in shapes if s.pools[0].dp_attention > 1)
