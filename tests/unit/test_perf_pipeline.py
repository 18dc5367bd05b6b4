"""``fleetsim perf --pp N``: each stage's time, the sends between stages, and the step time the
engine uses (the pipeline's period), equal bit for bit to the run's step model."""

from __future__ import annotations

import json

import pytest

from fleetsim.cli import main
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf.pipeline import stage_layer_ranges
from fleetsim.perf.pipeline_breakdown import predict_pipeline_breakdown
from fleetsim.perf.plugins import make_step_model

STEPS = [  # (prefill chunk or None, its cached tokens, decode batch or None, decode context)
    (2048, 0, None, 0), (512, 4096, None, 4096), (None, 0, 1, 512), (None, 0, 64, 2048),
    (512, 0, 32, 1024), (256, 0, 3, 300),
]


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize(("prefill", "cached", "batch", "context"), STEPS)
def test_step_time_is_the_engines(prefill, cached, batch, context, async_scheduling):
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100")
    engine = make_step_model("table", {}, model, gpu, 4, pp=3,
                             async_scheduling=async_scheduling)
    b = predict_pipeline_breakdown(model, gpu, 4, 3, prefill_tokens=prefill,
                                   context_tokens=context if batch else cached,
                                   decode_batch=batch, async_scheduling=async_scheduling)
    chunks = [(prefill, cached)] if prefill else []
    n = batch or 0
    assert b.step_time_s == engine.step_time_s(chunks, n, n * context)
    assert b.num_micro_batches == min(n + len(chunks), 3)
    # the trip is the CPU on it, every stage and every send; the period is at least the trip
    # and at least m x the slowest stage
    sends = sum(s.send_s for s in b.stages[:-1])
    assert b.trip_s == pytest.approx(b.trip_cpu_s + sends + sum(s.kernel_s for s in b.stages))
    m = b.num_micro_batches
    assert b.step_time_s == max(b.trip_s, m * max(s.kernel_s for s in b.stages), m * b.cpu_s)
    assert b.trip_cpu_s == (engine.async_step_gap_s if async_scheduling else b.cpu_s)


def test_stages_follow_vllms_split_and_the_links_their_nodes():
    b = predict_pipeline_breakdown(get_model("llama-3.1-70b"), get_gpu("h100"), 4, 2,
                                   decode_batch=8, context_tokens=1024)
    assert [(s.first_layer, s.end_layer) for s in b.stages] == stage_layer_ranges(80, 2)
    assert [s.link for s in b.stages] == ["nvlink", None]  # 8 GPUs: one node
    wide = predict_pipeline_breakdown(get_model("llama-3.1-405b"), get_gpu("h100"), 8, 2,
                                      decode_batch=8, context_tokens=1024)
    assert [s.link for s in wide.stages] == ["network", None]
    assert [s.send_s is None for s in wide.stages] == [False, True]
    # the same 8-token message is slower over the NIC than over NVLink (same size per GPU:
    # 405B's hidden is 16384 over tp 8, 70B's 8192 over tp 4)
    assert wide.stages[0].send_s > b.stages[0].send_s


def test_bound_says_what_sets_the_period():
    model, gpu = get_model("llama-3.1-70b"), get_gpu("h100")
    one = predict_pipeline_breakdown(model, gpu, 4, 2, decode_batch=1, context_tokens=512)
    assert one.num_micro_batches == 1 and one.bound == "trip"  # the bubble: half the pipe idle
    full = predict_pipeline_breakdown(model, gpu, 4, 2, prefill_tokens=512, decode_batch=32,
                                      context_tokens=1024, async_scheduling=True)
    assert full.bound == "slowest stage"
    assert full.step_time_s == 2 * max(s.kernel_s for s in full.stages) > full.trip_s


def test_cli_table_and_json(capsys):
    args = ["perf", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--pp", "2",
            "--decode-batch", "64", "--context", "2048"]
    assert main(args) == 0
    out = capsys.readouterr().out
    b = predict_pipeline_breakdown(get_model("llama-3.1-70b"), get_gpu("h100"), 4, 2,
                                   decode_batch=64, context_tokens=2048)
    assert "tp4 x pp2" in out and "2 micro-batch(es)" in out
    assert f"= {b.step_time_s * 1e3:.3f} ms a step" in out
    assert "0-39" in out and "40-79" in out and "send ms" in out and "nvlink" in out
    assert main([*args, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pp"] == 2 and d["step_time_s"] == b.step_time_s
    assert [s["layers"] for s in d["stages"]] == [[0, 40], [40, 80]]
    assert d["stages"][0]["link"] == "nvlink" and d["stages"][1]["send_s"] is None
    # pp 1 keeps the per-op breakdown
    assert main([*args[:7], "--pp", "1", *args[9:], "--json"]) == 0
    assert "ops" in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("extra", "needle"), [
    (["--pp", "0"], "--pp: got 0"),
    (["--pp", "200"], "--pp: got 200; Llama-3.1-70B has 80 layers"),
    (["--tp", "1", "--pp", "2", "--model", "llama-3.1-405b"], "--pp: got 2; stage 0"),
    (["--pp", "2", "--decode-batch", "100000", "--context", "8000"], "--decode-batch"),
])
def test_cli_bad_pipelines_are_one_line_exit_2(capsys, extra, needle):
    args = ["perf", "--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4",
            "--decode-batch", "8", "--context", "1024", *extra]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
