"""DeepSeek's wide-EP layout: attention data parallelism with experts over all the replica's GPUs,
across nodes (``moe/wide_ep.py``, ``hardware.dp_attention``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.moe.serving import PoolEpConfig
from fleetsim.moe.wide_ep import (
    DpAttentionStepModel,
    wide_ep_kv_capacity_blocks,
    wide_ep_weight_bytes_per_gpu,
)
from fleetsim.perf import build_step_model

H100 = get_gpu("h100")
DSV3 = quantize(get_model("deepseek-v3"), "fp8_block")
STATIC = PoolEpConfig(balancer="none", num_spare_slots_per_gpu=0)
BASE = {"model": "deepseek-v3", "quantization": "fp8_block", "perf_backend": "roofline",
        "workload": {"max_requests": 20}}


def _wide(gpu, dp, tp=1, cfg=STATIC):
    base = build_step_model(DSV3, gpu, tp, backend="roofline")
    return base, DpAttentionStepModel(base, DSV3, gpu, tp, dp, cfg)


def test_dp16_on_two_h100_nodes_runs_from_fleetsim_run(tmp_path, capsys):
    """DeepSeek-V3 FP8 does not fit one 8 x H100 node (its routed experts alone are ~80 GB per
    GPU at 8), but 16 attention ranks of tp 1 with experts over all 16 GPUs fit and serve."""
    from fleetsim.cli import main
    from fleetsim.run import run

    with pytest.raises(FleetsimInputError, match="weights per GPU at dp 8"):
        run(config_from_dict({**BASE, "hardware": {"gpu": "h100", "dp_attention": 8}}))
    code = main(["run", "--out", str(tmp_path / "o"), "--set", "model=deepseek-v3",
                 "--set", "quantization=fp8_block", "--set", "perf_backend=roofline",
                 "--set", "workload.max_requests=20", "--set", "hardware.gpu=h100",
                 "--set", "hardware.dp_attention=16"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "DP-attention 16 x TP 1, EP 16 (16 GPUs)" in out.out
    summary = run(config_from_dict({**BASE, "hardware": {"gpu": "h100",
                                                         "dp_attention": 16}})).summary
    assert summary["num_finished"] == 20
    pool = summary["pools"][0]
    assert pool["dp_attention"] == 16 and pool["ep_balance_ratio"] >= 1.0
    assert pool["usd_per_hour"] == pytest.approx(16 * H100.price_per_hour_usd)
    assert "NIC" in summary["perf_sources"]["moe"]
    assert "16 attention ranks" in summary["perf_sources"]["dp_attention"]


def test_weights_per_gpu_reduce_to_tensor_parallel_when_dp_is_one():
    """dp 1: the experts are split over the tp GPUs, as tensor parallelism holds them."""
    for tp in (1, 8):
        assert wide_ep_weight_bytes_per_gpu(DSV3, tp, 1, 0) == pytest.approx(
            DSV3.weight_bytes_per_gpu(tp), rel=1e-12)
    # a spare slot costs one expert of every MoE layer (3 x 7168 x 2048 x 58 fp8 bytes)
    extra = wide_ep_weight_bytes_per_gpu(DSV3, 1, 16, 1) - wide_ep_weight_bytes_per_gpu(
        DSV3, 1, 16, 0)
    assert extra == pytest.approx(3 * 7168 * 2048 * 58 * (8 + 32 / 128**2) / 8, rel=1e-9)


def test_kv_capacity_is_the_sum_of_the_ranks_and_grows_with_dp():
    """Twice the ranks: twice the caches, each larger (fewer experts per GPU)."""
    def blocks(dp):
        return wide_ep_kv_capacity_blocks(DSV3, H100, 1, dp, 16, 0.9, max_batched_tokens=8192,
                                          num_spare_slots_per_gpu=0)
    b16, b32, b64 = blocks(16), blocks(32), blocks(64)
    assert b32 > 2 * b16 and b64 > 2 * b32
    # dp equal ranks, each with vLLM's sizing of one GPU's memory (activations of a 1/dp step)
    from fleetsim.perf.memory import activation_reserve_bytes
    free = (H100.hbm_bytes * 0.9 - wide_ep_weight_bytes_per_gpu(DSV3, 1, 16, 0)
            - activation_reserve_bytes(DSV3, 1, 8192 // 16))
    assert b16 == 16 * int(free // (16 * DSV3.kv_bytes_per_token_per_gpu(1)))
    from fleetsim.run import run
    pools = [run(config_from_dict({**BASE, "workload": {"max_requests": 2},
                                   "hardware": {"gpu": "h100", "dp_attention": dp}})
                 ).summary["pools"][0] for dp in (16, 32)]
    assert pools[1]["num_kv_blocks"] > 2 * pools[0]["num_kv_blocks"]


def test_all_to_all_crosses_the_nic_when_the_group_spans_nodes():
    """The same GPU in a 16-GPU NVLink domain (an NVL72-style rack) against two 8-GPU nodes:
    only the dispatch/combine link differs, and the NIC's 50 GB/s makes the step slower."""
    nvl = dataclasses.replace(H100, name="H100-NVL16", num_gpus_per_node=16)
    _, nic_model = _wide(H100, 16)
    _, nvl_model = _wide(nvl, 16)
    for n in (16, 256, 1024):
        assert nic_model.step_time_s((), n, 1000 * n) > nvl_model.step_time_s((), n, 1000 * n)
    assert nic_model.step_time_s([(2048, 0)], 64, 64_000) > nvl_model.step_time_s(
        [(2048, 0)], 64, 64_000)
    assert "NIC" in nic_model.sources["moe"] and "NIC" not in nvl_model.sources["moe"]
    _, rack = _wide(get_gpu("gb200"), 64)
    assert rack.sources["moe"].endswith("all-to-all on NVLink")


def test_step_is_the_slowest_rank_plus_the_group_moe():
    """Decodes dealt evenly: the slowest rank holds ceil(n / dp) and their KV share; a lone
    prefill chunk lands on one rank, which then gates the step."""
    base, wide = _wide(H100, 16)
    moe = base.op_time_lookup("moe")
    group = wide.group_moe_s
    # 40 decodes over 16 ranks: the slowest holds 3 with 3/40 of the KV
    expect = base.step_time_s((), 3, 60_000 * 3 // 40) - moe(3) + group(40)
    assert wide.step_time_s((), 40, 60_000) == pytest.approx(expect, rel=1e-12)
    expect = base.step_time_s([(4096, 0)], 0, 0) - moe(4096) + group(4096 + 8)
    assert wide.step_time_s([(4096, 0)], 8, 8000) == pytest.approx(expect, rel=1e-12)
    # spreading the batch over ranks beats one tp-1 rank doing all of it
    assert wide.step_time_s((), 256, 256_000) < base.step_time_s((), 256, 256_000)


def test_decode_paths_are_bit_exact():
    _, wide = _wide(H100, 16)
    kv = np.array([0, 17, 99_999, 1_234_567], dtype=np.int64)
    for n in (0, 1, 15, 16, 17, 300):
        assert wide.decode_step_times_s(n, kv).tolist() == [wide.step_time_s((), n, int(k))
                                                            for k in kv]
        base, per_kv, extra = wide.decode_terms_s(n)
        assert [(base + per_kv * int(k)) + extra for k in kv] == wide.decode_step_times_s(
            n, kv).tolist()


@pytest.mark.parametrize(("hardware", "extra", "match"), [
    ({"dp_attention": 4}, {"model": "llama-3.1-8b", "quantization": None}, "is dense"),
    ({"dp_attention": 12}, {}, "must fill whole nodes"),
    ({"dp_attention": 3}, {}, "do not split over dp x tp = 3"),
    ({"dp_attention": 8, "tp": 16, "gpu": "gb200"}, {}, "tp must divide 72"),
    ({"dp_attention": 16}, {"engine": {"speculative": {"method": "mtp",
                                                       "num_speculative_tokens": 1}}},
     "speculative decoding is not priced with dp_attention"),
])
def test_bad_layouts_fail_in_one_line(tmp_path, capsys, hardware, extra, match):
    from fleetsim.run import run

    data = {**BASE, **extra, "hardware": {"gpu": "h100", **hardware}}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(FleetsimInputError, match=match):
        run(config_from_dict(data))


@pytest.mark.parametrize(("sets", "match"), [
    (["hardware.dp_attention=2", "hardware.pp=2"], "not modelled with pipeline stages"),
    (["hardware.dp_attention=0"], "dp_attention must be >= 1"),
    (["model=llama-3.1-8b", "hardware.dp_attention=4"], "dense"),
])
def test_cli_refuses_bad_input_with_exit_2(tmp_path, capsys, sets, match):
    from fleetsim.cli import main

    argv = ["run", "--out", str(tmp_path / "o")]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_vllm_serve_line_carries_data_parallel_and_expert_parallel_flags():
    from fleetsim.search.deploy import vllm_serve_commands

    config = config_from_dict({**BASE, "hardware": {"gpu": "h100", "dp_attention": 16}})
    (line,) = vllm_serve_commands(config, config.pools)
    assert "--data-parallel-size 16 --enable-expert-parallel" in line
    assert "--tensor-parallel-size 1" in line


def test_search_counts_and_prices_every_rank_and_plan_shapes_set_their_own_layout():
    from fleetsim.search.cost import cluster_usd_per_hour, num_gpus
    from fleetsim.search.plan import enumerate_shapes

    config = config_from_dict({**BASE, "hardware": {"gpu": "h100", "dp_attention": 16,
                                                    "num_replicas": 2}})
    assert num_gpus(config) == 32
    assert cluster_usd_per_hour(config) == pytest.approx(32 * H100.price_per_hour_usd)
    # a plan shape replaces the config's dp_attention (plan's --dp-attention axis), so a plain
    # shape is not silently run as a wide-EP one
    (plain,) = enumerate_shapes(["h100"], [8], 8)
    assert plain.apply(config).hardware.dp_attention == 1


def test_prefill_and_decode_pools_each_run_the_layout():
    """LMSYS's deployment shape: DP-attention prefill (EP16) and decode (EP32) pools; the KV
    handoff link counts every GPU of a replica."""
    from fleetsim.run import run

    pools = [{"name": "prefill", "gpu": "h100", "role": "prefill", "dp_attention": 16},
             {"name": "decode", "gpu": "h100", "role": "decode", "dp_attention": 32}]
    summary = run(config_from_dict({**BASE, "cluster": {"pools": pools}})).summary
    assert summary["num_finished"] == 20
    pre, dec = summary["pools"]
    assert (pre["dp_attention"], dec["dp_attention"]) == (16, 32)
    assert dec["num_kv_blocks"] > 2 * pre["num_kv_blocks"]
    assert dec["usd_per_hour"] == pytest.approx(32 * H100.price_per_hour_usd)
