"""A speculating pipeline (``PipelineStepModel.with_speculation``) against the event-by-event
batch-queue simulation of ``test_pipeline_reference.py``: two requests, each its own
micro-batch, cycle through the CPU and two stages; each stage serves the verify pass of its
layers (k + 1 positions per request) and the last one the drafter's k passes too (vLLM keeps
the draft model on the last PP rank). The stage times come from the stage tables by hand."""

from __future__ import annotations

import pytest
from tests.golden.test_pipeline_reference import reference_period_s

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.perf.pipeline import build_pipeline_step_model, p2p_s
from fleetsim.perf.speculative import speculative_step_model

CPU_S = 1e-4  # small, so that the busiest stage (not the trip) sets the period


def _hand_stage_times_s(pipe, k: int, kv: int) -> tuple[list[float], float]:
    """One request's micro-batch: each stage's verify kernels (the first without the LM head
    and sampler), the last with the drafter's passes, and the send between them."""
    first, last = pipe.stages
    v = k + 1
    stage0 = first.step_parts_s((), v, v, 1, kv) - first.per_sequence_s(v)
    layers = last.model.num_layers
    draft = last.layer_pass_s(v, 1, kv, layers) + (k - 1) * last.layer_pass_s(1, 1, kv, layers)
    stage1 = last.step_parts_s((), v, v, 1, kv) + draft
    return [stage0, stage1], p2p_s(pipe.send_bytes_per_token * v, pipe.send_bw[0])


@pytest.mark.parametrize(("k", "kv"), [(7, 2000), (3, 30_000), (1, 500)])
def test_two_speculating_requests_cycle_as_the_simulation_says(k, kv):
    pipe = build_pipeline_step_model(
        get_model("llama-3.1-70b"), get_gpu("h100-sxm"), 4, 2, "roofline",
        step_overhead_s=CPU_S, step_overhead_per_seq_s=0.0, kernel_time_scale=1.0,
        async_scheduling=False, async_step_gap_s=0.0)
    spec = speculative_step_model(
        pipe, get_model("llama-3.1-70b"),
        SpeculativeConfig(method="eagle3", num_speculative_tokens=k))
    stages, send = _hand_stage_times_s(pipe, k, kv)
    expected = reference_period_s(stages, CPU_S, [send], 2)
    assert spec.step_time_s((), 2, 2 * kv) == pytest.approx(expected, rel=1e-9)
    if k == 7:  # the last stage, drafting, is the bottleneck: where the drafter runs matters
        assert 2 * stages[1] > CPU_S + sum(stages) + send
