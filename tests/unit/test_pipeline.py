"""Pipeline parallelism: vLLM's layer split, the batch-queue period, per-stage memory, and the
layouts refused (``perf/pipeline.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.config import config_from_dict, load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.perf import build_step_model, kv_capacity_blocks
from fleetsim.perf.pipeline import (
    build_pipeline_step_model,
    crosses_node,
    pipeline_kv_capacity_blocks,
    stage_layer_ranges,
)
from fleetsim.perf.plugins import make_step_model

H100 = get_gpu("h100")
LLAMA_70B = get_model("llama-3.1-70b")
OVERHEADS = {"step_overhead_s": 1.5e-3, "step_overhead_per_seq_s": 0.0,
             "kernel_time_scale": 1.0, "async_scheduling": False, "async_step_gap_s": 160e-6}


def _vllm_get_pp_indices(num_layers: int, rank: int, pp: int) -> tuple[int, int]:
    """An independent transcription of vLLM's rule (vllm/distributed/utils.py): the remainder
    goes to partitions[-2], partitions[-3], ..."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    start = sum(parts[:rank])
    return start, start + parts[rank]


@pytest.mark.parametrize(("num_layers", "pp"), [(80, 2), (126, 4), (61, 4), (32, 3), (7, 7),
                                                (126, 16), (94, 8)])
def test_stage_split_is_vllms(num_layers, pp):
    ranges = stage_layer_ranges(num_layers, pp)
    assert ranges == [_vllm_get_pp_indices(num_layers, r, pp) for r in range(pp)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_layers
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def test_uneven_split_spares_the_last_stage():
    """126 layers on 4 stages: 31, 32, 32, 31 (vLLM's log line for Llama-3.1-405B, pp=4)."""
    assert [b - a for a, b in stage_layer_ranges(126, 4)] == [31, 32, 32, 31]


def test_boundaries_cross_nodes_only_on_node_edges():
    assert crosses_node(H100, 8, 0)  # tp=8: each stage is a node
    assert not crosses_node(H100, 4, 0)  # tp=4 pp=2: both stages in one node
    assert [crosses_node(H100, 4, b) for b in range(3)] == [False, True, False]


@pytest.fixture(scope="module")
def pp2():
    return build_pipeline_step_model(LLAMA_70B, H100, 4, 2, "roofline", **OVERHEADS)


def test_decode_vectorized_equals_scalar_bit_for_bit(pp2):
    for n in (1, 2, 3, 7, 64, 255):
        kv = np.array([0, 1, 17, 1000, 123_457, 2_000_000], dtype=np.int64)
        vec = pp2.decode_step_times_s(n, kv)
        assert vec.tolist() == [pp2.step_time_s((), n, int(k)) for k in kv]


def test_a_second_request_fills_the_bubble(pp2):
    """One request leaves one of two stages idle (vLLM's bubble); a second one rides in the
    other micro-batch at no cost, so the step (the time between a request's tokens) is the
    same and the replica's throughput doubles."""
    assert pp2.step_time_s((), 2, 2000) == pp2.step_time_s((), 1, 1000)
    assert pp2.step_time_s((), 4, 4000) > pp2.step_time_s((), 2, 2000)


def test_latency_is_the_sum_over_stages(pp2):
    """A lone request's step is the CPU cost plus every stage plus the activation send."""
    stage = pp2.stages[0]  # 40 layers; the last stage adds the LM head and sampler
    last = pp2.stages[1]
    expected = (1.5e-3 + stage.step_time_s((), 1, 500) - stage.per_sequence_s(1)
                + last.step_time_s((), 1, 500) + 10e-6 + 2 * 8192 * 2 / 4 / (450e9 * 0.7))
    assert pp2.step_time_s((), 1, 500) == pytest.approx(expected, rel=1e-12)


def test_a_full_pipeline_prices_one_micro_batch_per_stage_time(pp2):
    """At batch 2k the step is one micro-batch of k through both stages: per step, 2k tokens
    leave the pipeline in the time a k-batch takes to cross it."""
    tp4 = build_step_model(LLAMA_70B, H100, 4, "roofline")
    # ... which for a weight-bound decode is about a tp=4 replica's step at batch k: every
    # layer's weights are read once per micro-batch either way (within sends and LM head)
    assert pp2.step_time_s((), 64, 64 * 1000) == pytest.approx(
        tp4.step_time_s((), 32, 32 * 1000), rel=0.05)


def test_pp1_shape_is_refused_nowhere_and_untouched():
    """pp = 1 builds the plain table model, the object every golden test runs on."""
    sm = make_step_model("table", {}, LLAMA_70B, H100, 4)
    assert type(sm).__name__ == "TableStepModel"


def test_405b_bf16_fits_two_nodes_with_pp2_not_one():
    model = get_model("llama-3.1-405b")
    with pytest.raises(FleetsimInputError, match="tp"):
        kv_capacity_blocks(model, H100, 8, 16)
    blocks = pipeline_kv_capacity_blocks(model, H100, 8, 2, 16)
    assert blocks > 1000
    # each stage's GPUs hold half the layers: per-token KV halves too
    assert blocks * 16 * model.kv_bytes_per_token_per_gpu(8) / 2 < H100.hbm_bytes * 0.9 - 50e9


def test_kv_capacity_follows_the_stages_layers():
    """pp=2 at tp=4 holds about twice the tokens of tp=4 alone plus the freed weights."""
    one = kv_capacity_blocks(LLAMA_70B, H100, 4, 16)
    two = pipeline_kv_capacity_blocks(LLAMA_70B, H100, 4, 2, 16)
    assert two > 2 * one


def _cfg(**hardware):
    return config_from_dict({"model": "llama-3.1-70b", "hardware": hardware})


def test_vllm_name_is_an_alias(tmp_path):
    assert _cfg(gpu="h100", tp=4, pipeline_parallel_size=2).hardware.pp == 2
    assert _cfg(gpu="h100", tensor_parallel_size=4).hardware.tp == 4
    with pytest.raises(FleetsimInputError, match="keep one"):
        _cfg(pp=2, pipeline_parallel_size=2)
    assert load_config(None, ["hardware.pipeline_parallel_size=3"]).hardware.pp == 3


@pytest.mark.parametrize(("model", "gpu", "tp", "pp", "match"), [
    ("llama-3.1-8b", "h100", 1, 33, "32 layers"),
    ("llama-3.1-70b", "gb200", 16, 5, "tp must divide 72"),
    ("llama-3.1-70b", "h100", 16, 1, "inside a node"),
])
def test_bad_layouts_are_refused(model, gpu, tp, pp, match):
    with pytest.raises(FleetsimInputError, match=match):
        make_step_model("table", {}, get_model(model), get_gpu(gpu), tp, **{"pp": pp})


def test_user_step_models_take_no_pp():
    with pytest.raises(FleetsimInputError, match="pp = 1"):
        make_step_model("fleetsim.perf.base:ConstantStepModel", {"step_time_s": 1.0},
                        LLAMA_70B, H100, 4, pp=2)


def test_async_scheduling_hides_the_cpu_cost_in_the_trip():
    """Async scheduling takes the CPU cost out of a micro-batch's trip, down to the busiest
    stage's share of the cycle (here the last: it also runs the LM head)."""
    kw = {**OVERHEADS, "async_scheduling": True}
    sm = build_pipeline_step_model(LLAMA_70B, H100, 4, 2, "roofline", **kw)
    sync = build_pipeline_step_model(LLAMA_70B, H100, 4, 2, "roofline", **OVERHEADS)
    last = sm.stages[1].step_time_s((), 4, 4000)  # one micro-batch on the last stage
    for n in (1, 8):
        expected = max(sync.step_time_s((), n, 1000 * n) - (1.5e-3 - 160e-6),
                       min(n, 2) * sm.stages[1].step_time_s((), n // min(n, 2), 1000 * n //
                                                            min(n, 2)))
        assert sm.step_time_s((), n, 1000 * n) == pytest.approx(expected, rel=1e-12)
    assert sm.step_time_s((), 8, 8000) == pytest.approx(2 * last, rel=1e-12)


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "hardware.pp=0"], "hardware.pp"),
    (["--set", "hardware.pipeline_parallel_size=33"], "32 layers"),
    (["--set", "model=llama-3.1-70b", "--set", "hardware.gpu=gb200", "--set", "hardware.tp=16",
      "--set", "hardware.pp=5"], "tp must divide 72"),
    (["--set", "model=llama-3.1-405b", "--set", "hardware.tp=8"], "larger tp"),
    (["--set", "model=llama-3.1-70b", "--set", "hardware.tp=16", "--set", "hardware.pp=2"],
     "inside a node"),
])
def test_bad_layouts_are_one_line_exit_2(tmp_path, capsys, args, needle):
    from fleetsim.cli import main

    code = main(["run", "--out", str(tmp_path / "o"), "--set", "workload.max_requests=5", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_405b_runs_on_two_nodes_and_the_label_says_so(tmp_path, capsys):
    from fleetsim.cli import main

    code = main(["run", "--out", str(tmp_path / "o"), "--set", "model=llama-3.1-405b",
                 "--set", "hardware.tp=8", "--set", "hardware.pipeline_parallel_size=2",
                 "--set", "workload.max_requests=20", "--set", "perf_backend=roofline"])
    out = capsys.readouterr().out
    assert code == 0
    assert "TP 8 x PP 2 (16 GPUs)" in out


def test_plan_explores_pp_and_prints_its_flag():
    from fleetsim.search.deploy import vllm_serve_commands
    from fleetsim.search.plan import enumerate_shapes, plan, plan_to_dict

    shapes = enumerate_shapes(["h100"], [8], 16, pps=[1, 2])
    names = [s.name for s in shapes]
    assert names == ["1x H100-SXM tp8", "2x H100-SXM tp8", "1x H100-SXM tp8pp2"]
    assert [s.num_gpus for s in shapes] == [8, 16, 16]
    config = load_config(None, ["model=llama-3.1-405b", "workload.max_requests=30",
                                "perf_backend=roofline"])
    (line,) = vllm_serve_commands(config, shapes[2].pools)
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2 " in line
    assert shapes[2].apply(config).hardware.pp == 2
    # 405B in bf16: one node cannot hold it, two nodes in a pipeline can
    points = plan(config, [shapes[0], shapes[2]], max_runs=1)
    out = plan_to_dict(points, target=0.9, config=config)
    assert out["infeasible"] == ["1x H100-SXM tp8"]
    assert out["points"][1]["pools"][0]["pp"] == 2
    assert "--pipeline-parallel-size 2" in out["points"][1]["vllm_serve"][0]


def test_pools_take_pp_and_price_every_gpu():
    """A P/D cluster whose decode pool is a two-stage pipeline: it runs, its summary says
    pp, and its cost counts tp x pp GPUs."""
    from fleetsim.run import run

    config = config_from_dict({
        "model": "llama-3.1-70b", "perf_backend": "roofline",
        "workload": {"max_requests": 20},
        "cluster": {"pools": [
            {"name": "pre", "gpu": "h100", "tp": 4, "role": "prefill"},
            {"name": "dec", "gpu": "h100", "tp": 4, "pp": 2, "role": "decode"}]}})
    summary = run(config).summary
    assert summary["num_finished"] == 20
    pre, dec = summary["pools"]
    assert "pp" not in pre and dec["pp"] == 2
    assert dec["usd_per_hour"] == pytest.approx(2 * pre["usd_per_hour"])
    assert dec["num_kv_blocks"] > 2 * pre["num_kv_blocks"]


@pytest.mark.parametrize("value", ["0", "two"])
def test_plan_pp_flag_is_checked(capsys, value):
    from fleetsim.cli import main

    assert main(["plan", "--pp", value]) == 2
    err = capsys.readouterr().err
    assert "--pp" in err and err.count("\n") == 1


def test_step_csv_calibration_refuses_a_pipeline():
    from fleetsim.calibrate.fit import kernel_times_s

    config = load_config(None, ["model=llama-3.1-70b", "hardware.tp=4", "hardware.pp=2"])
    with pytest.raises(FleetsimInputError, match="one forward pass"):
        kernel_times_s(config, np.array([[8.0, 8000.0, 0.0, 0.0, 0.03]]))


def test_expert_parallel_stages_take_their_share_of_the_moe_layers():
    """DeepSeek-V3 (61 layers, the first 3 dense) on pp=2: stages of 31 and 30 layers hold
    28 and 30 of its 58 MoE layers; a change of the MoE time of all layers lands on the stages
    in that proportion, and the vectorized decode path stays bit-exact."""
    model = quantize(get_model("deepseek-v3"), "fp8_block")
    sm = build_pipeline_step_model(model, H100, 8, 2, "roofline", **OVERHEADS)
    ep = sm.with_moe_delta(lambda tokens: 0.004, model.num_moe_layers, "test")
    assert ep.moe_share == [28 / 58, 30 / 58]
    # one request: the trip crosses both stages, so it pays the whole change
    assert ep.step_time_s((), 1, 500) == pytest.approx(sm.step_time_s((), 1, 500) + 0.004,
                                                      rel=1e-12)
    kv = np.array([0, 999, 123_456], dtype=np.int64)
    assert ep.decode_step_times_s(16, kv).tolist() == [ep.step_time_s((), 16, int(k))
                                                       for k in kv]
    assert sm.moe_delta_s is None  # a copy: the plain pipeline is untouched


def test_deepseek_v3_fp8_needs_two_nodes_and_runs_with_ep_and_pp(tmp_path):
    from fleetsim.run import run

    base = {"model": "deepseek-v3", "quantization": "fp8_block", "perf_backend": "roofline",
            "workload": {"max_requests": 10},
            "hardware": {"gpu": "h100", "tp": 8, "ep": {"balancer": "eplb"}}}
    with pytest.raises(FleetsimInputError, match="weights"):
        run(config_from_dict(base))
    summary = run(config_from_dict({**base, "hardware": {**base["hardware"], "pp": 2}})).summary
    assert summary["num_finished"] == 10
    pool = summary["pools"][0]
    assert pool["pp"] == 2 and pool["ep_balance_ratio"] >= 1.0
    assert "per stage" in summary["perf_sources"]["moe"]


def test_run_pp_shorthand(tmp_path, capsys):
    from fleetsim.cli import main

    assert main(["run", "--out", str(tmp_path / "o"), "--pp", "0"]) == 2
    assert "--pp" in capsys.readouterr().err
    code = main(["run", "--out", str(tmp_path / "p"), "--tp", "2", "--pp", "2",
                 "--set", "workload.max_requests=10", "--set", "perf_backend=roofline"])
    assert code == 0
    assert "TP 2 x PP 2 (4 GPUs)" in capsys.readouterr().out
