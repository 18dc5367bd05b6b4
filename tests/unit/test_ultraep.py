"""UltraEP's operations in time (hand-computed cases), the EP pass model's accounting, and
``fleetsim repro ultraep``'s bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.hardware import get_gpu
from fleetsim.moe.overheads import (
    OverheadModel,
    exposed_s,
    layer_overheads,
    multicast_copies,
    relay_fanout,
    sync_s,
)

MODEL = OverheadModel(plan_update_s=70e-6, reroute_s=40e-6, link_latency_s=10e-6)


@pytest.mark.parametrize(("comm", "overlap", "want"), [
    (0.3, 0.1, 0.2), (0.1, 0.3, 0.0), (0.2, 0.2, 0.0), (0.0, 0.5, 0.0), (0.4, 0.0, 0.4)])
def test_exposed_is_what_overlapping_compute_does_not_hide(comm, overlap, want):
    assert exposed_s(comm, overlap) == pytest.approx(want)


def test_exposed_rejects_negative_times():
    with pytest.raises(ValueError, match="must be >= 0"):
        exposed_s(-1e-6, 0.0)


def test_forward_exposes_plan_and_sync_and_reroute_only_beyond_the_sync():
    # sync 200 us hides the 40 us reroute: 70 + 200; backward re-sync 200 + (150 - 100) reduce.
    ops = layer_overheads(200e-6, 150e-6, 100e-6, MODEL, train=True)
    assert ops.forward_exposed_s == pytest.approx(270e-6)
    assert ops.backward_exposed_s == pytest.approx(250e-6)
    assert ops.exposed_s == pytest.approx(520e-6)
    # a 20 us sync leaves 20 us of reroute exposed; prefill has no backward
    ops = layer_overheads(20e-6, 20e-6, 100e-6, MODEL, train=False)
    assert ops.forward_exposed_s == pytest.approx(70e-6 + 20e-6 + 20e-6)
    assert ops.backward_exposed_s == 0.0 and ops.grad_reduce_s == 0.0


@pytest.mark.parametrize(("replicas", "want"), [
    (1, (0, 1)), (5, (0, 5)),  # below the README's 6 replicas: direct
    (6, (2, 2)),  # master -> 2 relays, each forwards 2
    (64, (8, 8)),  # at most 8 relays: 8 from the master, 7 from each relay
    (63, (7, 8)),  # 7 relays already give a fan-out of 8; the first such tree is kept
])
def test_relay_tree_fanout(replicas, want):
    assert relay_fanout(replicas, MODEL) == want


def test_relay_needs_the_fanout_gain():
    strict = OverheadModel(relay_min_fanout_gain=4.0)
    assert relay_fanout(6, strict) == (0, 6)  # 6 / 2 = 3x < 4x: direct


def test_multicast_copies_and_sync_time_by_hand():
    # 4 GPUs x (1 master + 1 spare). Expert 3 (master on GPU 3) is replicated to GPUs 0-2,
    # expert 0 (master on GPU 0) to GPU 3.
    phy2log = np.array([0, 3, 1, 3, 2, 3, 3, 0])
    used = np.ones(8, dtype=bool)
    received, sent = multicast_copies(phy2log, used, 4, 1, MODEL)
    assert received.tolist() == [1, 1, 1, 1]
    assert sent.tolist() == [1, 0, 0, 3]
    # the busiest sender (GPU 3) gates: 10 us + 3 x 1 MB / 1 GB/s
    assert sync_s(phy2log, used, 4, 1, 1e6, 1e9, MODEL) == pytest.approx(10e-6 + 3e-3)
    # a spare slot serving no tokens is not copied
    used[[1, 3, 5]] = False
    received, sent = multicast_copies(phy2log, used, 4, 1, MODEL)
    assert received.tolist() == [0, 0, 0, 1] and sent.tolist() == [1, 0, 0, 0]
    assert sync_s(phy2log, np.zeros(8, dtype=bool), 4, 1, 1e6, 1e9, MODEL) == 0.0


def test_relayed_copies_spread_the_senders():
    # expert 0 (master on GPU 0) to all 7 other GPUs: relays cut the master's fan-out
    phy2log = np.array([e for g in range(8) for e in (g, 0)])
    used = np.ones(16, dtype=bool)
    used[1] = False  # GPU 0's spare slot holds its own master: no copy
    received, sent = multicast_copies(phy2log, used, 8, 1, MODEL)
    assert received.sum() == 7 and received[0] == 0
    assert sent.sum() == 7 and sent.max() == relay_fanout(7, MODEL)[1] < 7


@pytest.fixture(scope="module")
def pass_runs():
    from fleetsim.repro.ultraep import UltraEpSetup, run_setting
    setup = UltraEpSetup(num_microbatches=2, num_warmup=2, num_layers=4, eplb_window=2)
    return setup, run_setting(setup, "train", "GB200-NVL72", 64)


def test_pass_times_add_up_and_ideal_is_fastest(pass_runs):
    _, runs = pass_runs
    ideal = runs["force_balanced"]
    for policy, rows in runs.items():
        for row, best in zip(rows, ideal, strict=True):
            parts = row.dense_s + row.expert_s + row.all_to_all_s + row.exposed_s
            assert row.total_s == pytest.approx(parts)
            assert row.total_s >= best.total_s * (1 - 1e-12)
            assert row.dense_s == pytest.approx(best.dense_s)  # attention is data parallel
            if policy == "ultraep":
                per_layer = row.ops_s["forward_exposed"] + row.ops_s["backward_exposed"]
                assert row.exposed_s == pytest.approx(4 * per_layer)
            else:
                assert row.exposed_s == 0.0 and row.ops_s == {}
    imb = {p: np.mean([r.imbalance for r in rows]) for p, rows in runs.items()}
    assert imb["force_balanced"] == 1.0 <= imb["ultraep"] < imb["megatron"]


def test_same_setup_gives_identical_results(pass_runs):
    from fleetsim.repro.ultraep import run_setting
    setup, runs = pass_runs
    again = run_setting(setup, "train", "GB200-NVL72", 64)
    assert [r.total_s for r in again["ultraep"]] == [r.total_s for r in runs["ultraep"]]


def test_training_computes_three_forward_passes():
    from fleetsim.models import get_model
    from fleetsim.moe.ep_pass import EpPassModel
    model, gpu = get_model("qwen3-235b"), get_gpu("gb200")
    train = EpPassModel(model, gpu, ep=64, domain=64, seq_lens=[1024], train=True)
    prefill = EpPassModel(model, gpu, ep=64, domain=64, seq_lens=[1024], train=False)
    load = np.full((2, 128), 1024 * 64 * 8 / 128)
    t, p = train.ideal(load), prefill.ideal(load)
    assert t.dense_s == pytest.approx(3 * p.dense_s)
    assert t.expert_s == pytest.approx(3 * p.expert_s)
    assert t.all_to_all_s == pytest.approx(2 * p.all_to_all_s)


def test_nvl72_is_one_rack_wide_nvlink_domain():
    gpu = get_gpu("nvl72")
    assert gpu.name == "GB200-NVL72" and gpu.num_gpus_per_node == 72
    assert gpu.nvlink_bw_bytes_per_s == 900e9


def test_measured_moe_rows_never_beat_the_gpus_peak():
    """The tables time one rank's share (num_tokens * topk / ep routed tokens): read that way
    no row runs faster than the GPU's bf16 peak."""
    pytest.importorskip("aiconfigurator_core")
    pytest.importorskip("pandas")
    from fleetsim.moe.compute import MoeLayerSpec, load_moe_table
    spec = MoeLayerSpec(hidden_size=4096, moe_inter_size=1536, num_experts=128, top_k=8,
                        num_moe_layers=94, weight_bytes_per_param=2.0)
    for reach in (0.0, 30000.0):
        table = load_moe_table(spec, 64, system="gb200", moe_dtype="bfloat16",
                               min_routed_tokens=reach)
        assert table is not None and table.routed_tokens[-1] >= reach
        flops_per_s = table.routed_tokens * spec.flops_per_routed_token / table.seconds
        assert flops_per_s.max() < get_gpu("gb200").peak_bf16_flops


@pytest.mark.parametrize(("setting", "needle"), [
    ("ep=48", "ep: got 48"),
    ("autocorr=1", "autocorr: got 1"),
    ("num_layers=0", "num_layers: got 0"),
    ("nosuchkey=1", "nosuchkey"),
])
def test_bad_input_is_one_line_and_exit_2(setting, needle, capsys):
    assert main(["repro", "ultraep", "--quick", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


# ---- the step's parts outside the EP micro-batch (issue 22) ------------------------------
def test_outer_parts_follow_interleaved_1f1b_and_spread_per_step_costs_over_the_step():
    from fleetsim.errors import FleetsimInputError
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.moe.outer import OuterLayout, outer_s

    model, gpu = get_model("qwen3-235b"), get_gpu("gb200-nvl72")
    base = outer_s(model, gpu, OuterLayout(), 1.0)
    assert base["bubble"] == pytest.approx(7 / (3 * 256))  # (p - 1) / (v m) of the compute
    twice = outer_s(model, gpu, OuterLayout(num_microbatches=512), 1.0)
    for part in ("bubble", "grad_reduce", "optimizer"):  # once per step: halves per micro-batch
        assert twice[part] == pytest.approx(base[part] / 2)
    assert twice["p2p"] == pytest.approx(base["p2p"])  # every micro-batch crosses the stages
    flat = outer_s(model, gpu, OuterLayout(pp=1), 1.0)
    assert flat["bubble"] == flat["p2p"] == 0.0
    assert 0 < sum(base.values()) < 0.02  # about 1% of a micro-batch in this layout
    with pytest.raises(FleetsimInputError, match="vp"):
        OuterLayout(vp=0)
