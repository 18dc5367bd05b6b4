"""ExpertPlex's mechanisms on hand-made cases (tile model, SM re-allocation, the shared pool, the
APK overheads), the same GPU budget for every system, determinism, and ``fleetsim repro
expertplex``'s bad input."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.expert_pool import Limits, _busy_shares, pools, simulate
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.moe.expertplex import (
    APK_DECODE_SLOWDOWN,
    APK_PREFILL_SLOWDOWN,
    CostModel,
    InstanceSplit,
    InstanceSteps,
    SmPolicy,
    SystemLayout,
    sm_policy,
)
from fleetsim.moe.tile_model import (
    TileLatency,
    ceil_to,
    expected_tiles_per_expert,
    reallocate_sms,
    tiles,
)
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded
from fleetsim.repro import REPRODUCTIONS
from fleetsim.repro.expertplex import ExpertPlexSetup, _Sweep, layouts
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.shared_steps import SharedStepModel
from fleetsim.workloads.workload import Workload


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel(get_model("qwen3-235b"), get_gpu("H200"), 64)


@pytest.mark.parametrize(("counts", "tile", "want"), [
    ([0, 1, 64, 65, 128], 64, 0 + 1 + 1 + 2 + 2),  # empty experts run no tile
    ([200], 64, 4), ([3, 3, 3], 1, 9), ([0, 0], 64, 0)])
def test_tile_count_is_the_papers_formula(counts, tile, want):
    assert tiles(counts, tile) == want


def test_expected_tiles_of_poisson_load():
    # mean far below a tile: E[ceil(X/M)] = P(X > 0) = 1 - e^-mean
    assert expected_tiles_per_expert(0.5, 64) == pytest.approx(1 - math.exp(-0.5), rel=1e-9)
    # large mean: close to mean / M + 1/2 on average (a partly filled last tile)
    assert expected_tiles_per_expert(6400.0, 64) == pytest.approx(100.5, abs=0.1)
    assert expected_tiles_per_expert(0.0, 64) == 0.0


@pytest.mark.parametrize(("q", "x", "x_ref", "want"), [
    (66, 10, 10, 66),  # at the reference load: the reference share
    (66, 5, 10, 34),  # half the tiles: 33 SMs, rounded up to whole 2-SM clusters
    (66, 40, 10, 116),  # capped at Q_max
    (66, 0.01, 10, 2),  # never below one cluster
])
def test_sm_reallocation(q, x, x_ref, want):
    assert reallocate_sms(q, x, x_ref, q_max=116, cluster=2) == want


def test_ceil_to_cluster():
    assert [ceil_to(v, 4) for v in (1, 4, 4.0001, 8)] == [4, 4, 8, 8]


class _Linear:
    """A made-up measured table: 100 us + 1 us per routed token on each expert."""

    def gpu_time_s(self, tokens_by_slot):
        return 100e-6 + 1e-6 * np.asarray(tokens_by_slot).sum(-1)


def test_tile_latency_fits_a_linear_table_exactly_and_scales_with_sms():
    lat = TileLatency.fit(_Linear(), experts_per_gpu=16, tile_m=64, num_sms=132)
    assert lat.fixed_s == pytest.approx(100e-6) and lat.per_tile_s == pytest.approx(64e-6)
    assert lat.fit_error < 1e-9
    assert lat.seconds(10) == pytest.approx(100e-6 + 640e-6)
    assert lat.seconds(10, 66) == pytest.approx(100e-6 + 2 * 640e-6)  # half the SMs
    assert lat.seconds(0) == 0.0


def test_fewer_sms_on_the_shared_pool_slow_a_phase(cost):
    full = cost.plex_decode_s(256, 256 * 500, 8, 8, 24, cost.num_sms)[1]
    half = cost.plex_decode_s(256, 256 * 500, 8, 8, 24, cost.num_sms // 2)[1]
    _, work = cost.expert_parts(256, 8)
    assert half - full == pytest.approx(cost.layers * work / cost.num_sms * APK_DECODE_SLOWDOWN)


def test_expert_cost_reads_the_weights_of_every_active_expert(cost):
    """At decode sizes a GPU reads each active expert once: its time grows with the experts it
    holds (weight reads), not only with routed tokens; at prefill sizes compute dominates."""
    spec, hbm = cost.spec, cost.hw.hbm_bytes_per_s
    # 2,048 tokens x top-8 over 128 experts: 128 per expert, every expert active.
    for pool in (8, 16):
        assert cost.weight_read_s(2048, pool) == pytest.approx(
            128 / pool * spec.expert_bytes / hbm, rel=1e-6)
    # A decode batch: the same routed tokens per GPU cost more on a GPU with more experts.
    fixed8, work8 = cost.expert_parts(256, 8)
    fixed16, work16 = cost.expert_parts(512, 16)  # same routed tokens per GPU, half the experts
    assert work8 > work16 and fixed8 == fixed16 == cost.hw.kernel_overhead_s
    assert work16 / cost.num_sms == pytest.approx(cost.weight_read_s(512, 16))
    # A long prefill chunk is compute-bound: the tiles' time, above the weight reads.
    lat = cost.tile_latency(8)
    _, work = cost.expert_parts(16384, 8)
    assert work / cost.num_sms == pytest.approx(lat.per_tile_s * cost.tiles_per_gpu(16384, 8))
    assert work / cost.num_sms > cost.weight_read_s(16384, 8)


def test_apk_overheads_are_applied_to_expert_gemms(cost):
    _, expert = cost.plex_decode_s(256, 0, 8, 8, 24, cost.num_sms)
    assert expert == pytest.approx(cost.layers * cost.expert_s(256, 8) * 1.08)
    assert APK_DECODE_SLOWDOWN == 1.08 and APK_PREFILL_SLOWDOWN == 1.12
    chunks = [1000] * 4
    plain = cost.dense_s(chunks, 0, 0, 8) + cost.layers * (
        cost.a2a_s(4000, 8, 24) + cost.expert_s(4000, 8))
    plex = cost.plex_prefill_s(chunks, 8, 8, 24, cost.num_sms)
    assert plex - plain == pytest.approx(cost.layers * cost.expert_s(4000, 8) * 0.12)


def test_every_system_gets_the_same_gpu_budget(cost):
    setup = ExpertPlexSetup()
    found = layouts(setup, cost)
    assert set(found) == {"expertplex", "pd_instance", "pd_colocated"}
    for candidates in found.values():
        assert candidates and all(c.total_gpus == setup.gpu_budget for c in candidates)
    # ExpertPlex holds one copy of the experts: pools of 4, 8 and 16 GPUs all hold 454 GB
    assert {c.pool for c in found["expertplex"]} == {4, 8, 16}


def _requests(n: int, rate: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (np.cumsum(rng.exponential(1 / rate, n)), rng.integers(100, 900, n),
            rng.integers(20, 200, n))


def test_shared_pool_couples_the_phases(cost):
    """Decode steps run slower while prefill uses the pool: decode alone vs with prompts
    (on the engine: the two attention groups' steps are jobs on one SM pool)."""
    layout = SystemLayout(kind="expertplex", prefill_gpus=(4,), decode_gpus=(4,), pool=8)
    limits = Limits(token_budget_per_gpu=2048, max_decode_per_gpu=128)
    policy = SmPolicy(q_ref=66, x_ref=cost.tiles_per_gpu(512, 8), q_max=116, cluster=2)
    arrivals, prompts, outputs = _requests(200, 20.0)
    busy = simulate(layout, cost, limits, policy, arrivals, prompts, outputs)
    # the same requests spread 100x apart never overlap: decode has the pool to itself
    alone = simulate(layout, cost, limits, policy, arrivals * 100, prompts, outputs)
    assert np.nanmedian(busy.tpot) > np.nanmedian(alone.tpot)
    assert np.all(np.isfinite(busy.ttft)) and np.all(busy.ttft > 0)
    # what binds (the entry's note): requests 100x apart leave the attention groups idle
    assert set(busy.busy_share_by_pool) == {"prefill", "decode"}
    assert (alone.busy_share_by_pool["decode"] < busy.busy_share_by_pool["decode"] <= 1
            and alone.busy_share_by_pool["prefill"] < busy.busy_share_by_pool["prefill"])


def test_busy_shares_average_each_pools_replicas_over_the_run():
    """Replicas are numbered in pool order; a pool's share is its replicas' mean."""
    setups = [SimpleNamespace(name="prefill", num_replicas=1),
              SimpleNamespace(name="decode", num_replicas=2)]
    shares = _busy_shares(setups, {0: 5.0, 1: 10.0, 2: 6.0}, 10.0)
    assert shares == pytest.approx({"prefill": 0.5, "decode": 0.8})


def test_colocation_interferes_and_pd_does_not(cost):
    limits = Limits(token_budget_per_gpu=2048, max_decode_per_gpu=128)
    policy = SmPolicy(q_ref=116, x_ref=1.0, q_max=116, cluster=2)
    arrivals, prompts, outputs = _requests(300, 30.0)
    coloc = simulate(SystemLayout(kind="colocated", prefill_gpus=(8, 8)), cost, limits, policy,
                     arrivals, prompts, outputs)
    pd = simulate(SystemLayout(kind="pd", prefill_gpus=(8,), decode_gpus=(8,)), cost, limits,
                  policy, arrivals, prompts, outputs)
    # colocated decode steps carry prompts: a slower tail of TPOT than PD's decode-only steps
    assert np.nanpercentile(coloc.tpot, 99) > np.nanpercentile(pd.tpot, 99)


def test_decode_sm_reference_meets_the_tpot_slo(cost):
    setup = ExpertPlexSetup()
    layout = SystemLayout(kind="expertplex", prefill_gpus=(8,), decode_gpus=(16,), pool=8)
    policy = sm_policy(cost, layout, 600.0, max_decode_per_gpu=setup.max_decode_per_gpu,
                       tpot_slo_s=setup.tpot_slo_s, sm_cluster=setup.sm_cluster)
    largest = setup.max_decode_per_gpu * 16
    step, _ = cost.plex_decode_s(largest, largest * 600, 16, 8, 32, policy.q_ref)
    assert step <= 0.9 * setup.tpot_slo_s or policy.q_ref == policy.q_max
    if policy.q_ref > policy.cluster:
        slower, _ = cost.plex_decode_s(largest, largest * 600, 16, 8, 32,
                                       policy.q_ref - policy.cluster)
        assert slower > 0.9 * setup.tpot_slo_s  # the fewest SMs that do


@pytest.mark.parametrize(("scores", "want"), [
    ([1.0, 0.95, 0.85, 0.5], 2.5),  # crosses 0.9 halfway between rates 2 and 3
    ([1.0, 1.0, 1.0, 1.0], 4.0),  # never fails: the top rate (a lower bound)
    ([0.5, 1.0, 1.0, 1.0], 0.0),
])
def test_goodput_interpolates_the_crossing(scores, want):
    from fleetsim.metrics.slo import crossing_rate
    got = crossing_rate((1.0, 2.0, 3.0, 4.0), scores, 0.9, rising=False)
    assert (0.0 if got is None else got) == pytest.approx(want)


def test_same_seed_same_result(cost):
    setup = ExpertPlexSetup(gpu_budget=16, duration_s=5.0)
    layout = SystemLayout(kind="expertplex", prefill_gpus=(4,), decode_gpus=(4,), pool=8)
    a = _Sweep(setup, cost, (2.0, 4.0)).scores(layout)
    b = _Sweep(setup, cost, (2.0, 4.0)).scores(layout)
    assert a == b


@pytest.mark.parametrize(("setting", "needle"), [
    ("gpu_budget=12", "gpu_budget: got 12"),
    ("pool_sizes=[3]", "pool_sizes: got"),
    ("pool_sizes=[2]", "no pool holds"),
    ("tpot_slo_s=0", "tpot_slo_s: got 0"),
    ("target=1.5", "target: got 1.5"),
    ("nosuchkey=1", "nosuchkey"),
    ("model=llama-3.1-8b", "must be an MoE model"),
])
def test_bad_input_is_one_line_and_exit_2(setting, needle, capsys):
    assert main(["repro", "expertplex", "--quick", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", ["colocated", "pd"])
def test_golden_instances_on_their_own_pool_equal_the_plain_pd_cluster(cost, kind):
    """The shared-resource port in its trivial form: each instance's steps as jobs on its own
    expert shard's SMs (``InstanceSplit``, one resource per replica) give the engine's plain
    colocated / P/D cluster results (``InstanceSteps``), request by request."""
    layout = (SystemLayout(kind="colocated", prefill_gpus=(8, 8)) if kind == "colocated"
              else SystemLayout(kind="pd", prefill_gpus=(8,), decode_gpus=(8,)))
    policy = SmPolicy(q_ref=116, x_ref=1.0, q_max=116, cluster=2)
    plain = pools(layout, cost, policy)
    shared = [PoolSetup(name=p.name, role=p.role, num_replicas=p.num_replicas,
                        step_model=SharedStepModel(InstanceSplit(cost, 8), "shard",
                                                   float(cost.num_sms), per_replica=True),
                        num_kv_blocks=p.num_kv_blocks, link_bw_bytes_per_s=p.link_bw_bytes_per_s)
              for p in plain]
    assert all(isinstance(p.step_model, InstanceSteps) for p in plain)
    arrivals, prompts, outputs = _requests(120, 30.0)
    w = Workload(arrival_s=arrivals, num_prompt_tokens=prompts.astype(np.int64),
                 num_output_tokens=outputs.astype(np.int64))
    recs = []
    for setup in (plain, shared):
        rec, cluster = simulate_cluster(
            w, setup, router=LeastLoaded(), decode_router=LeastLoaded(),
            make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
            rng=np.random.default_rng(0), kv_bytes_per_token=float(
                cost.model.kv_bytes_per_token()), link_latency_s=0.0, block_size=16,
            max_batched_tokens=17408, max_running=1024, debug=True)
        recs.append(rec.requests)
    assert cluster.resources is not None and len(cluster.resources.capacity) == len(
        cluster.replicas)  # one shard per instance, each its own resource
    for col in ("request_id", "replica_id", "num_computed_tokens"):
        assert recs[0][col].tolist() == recs[1][col].tolist()
    for col in ("first_token_s", "finish_s"):
        assert recs[1][col] == pytest.approx(recs[0][col], rel=1e-9)


@pytest.mark.parametrize("num_steps", [3, 20])  # priced one by one, vectorized
@pytest.mark.parametrize("num_decode", [1, 7, 8, 13, 300])
def test_vectorized_decode_steps_equal_single_steps_bit_for_bit(cost, num_decode, num_steps):
    """Windows price decode steps with ``decode_step_times_s``, stepping with
    ``step_time_s``: they must give the same floats, or fast-forward would not equal
    stepping (short windows take the scalar path, ``SCALAR_WINDOW_STEPS``)."""
    from fleetsim.moe.expertplex_steps import SCALAR_WINDOW_STEPS, PlexSplit, PoolAllocator

    assert (num_steps <= SCALAR_WINDOW_STEPS) == (num_steps == 3)
    kv = np.arange(1000, 1000 + num_steps) * num_decode
    inst = InstanceSteps(cost, 8)
    assert inst.decode_step_times_s(num_decode, kv).tolist() == [
        inst.step_time_s((), num_decode, int(k)) for k in kv]
    alloc = PoolAllocator(cost, SmPolicy(q_ref=60, x_ref=10.0, q_max=116, cluster=2), 16)
    for overlap in (False, True):
        m = SharedStepModel(PlexSplit(cost, 8, 32, "decode", alloc), "pool", 132.0,
                            overlap=overlap)
        assert m.decode_step_times_s(num_decode, kv).tolist() == [
            m.step_time_s((), num_decode, int(k)) for k in kv]


@pytest.mark.parametrize(("chunks", "num_decode"), [
    ((), 1), ((), 9), ((), 300), (((512, 0),), 0), (((512, 0),), 9),
    (((300, 40), (17, 0), (4096, 0)), 0), (((300, 40), (17, 0), (4096, 0)), 300)])
def test_an_instance_step_is_its_dense_part_and_its_moe_part(cost, chunks, num_decode):
    """``InstanceSteps`` keeps a step's MoE seconds by its token count (asked twice: kept
    the second time): the floats of the cost model's parts, mixed steps included."""
    inst = InstanceSteps(cost, 8)
    lens = [n for n, _ in chunks]
    tokens = sum(lens) + num_decode
    moe = cost.a2a_s(tokens, 8, 8) + cost.expert_s(tokens, 8)
    want = cost.dense_s(lens, num_decode, 5000, 8) + cost.layers * moe
    assert inst.step_time_s(chunks, num_decode, 5000) == want
    assert inst.step_time_s(chunks, num_decode, 5000) == want


def test_the_ablation_keeps_decodes_reference_share_of_the_pool(cost):
    """``expertplex-static-sm`` removes the SM re-allocation: decode's share stays q_ref at
    every batch, where ExpertPlex's follows the batch's tiles."""
    adaptive = SmPolicy(q_ref=60, x_ref=cost.tiles_per_gpu(1024, 16), q_max=116, cluster=2)
    static = dataclasses.replace(adaptive, adaptive=False)
    assert cost.decode_sms(adaptive, 8, 16) < 60 < cost.decode_sms(adaptive, 4096, 16)
    assert {cost.decode_sms(static, n, 16) for n in (8, 1024, 4096)} == {60}
    assert "expertplex-static-sm" in REPRODUCTIONS["expertplex"].baselines
