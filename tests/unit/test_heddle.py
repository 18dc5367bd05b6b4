"""Heddle's mechanisms (arXiv 2603.28101) and its baselines: presorted DP placement against
brute force, the predictor's quality and refinement, priorities refreshed after every step,
preemption, migration only in tool waits at the modelled transfer cost, the routers, the KV
install a migration lands with, determinism and bad input."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import EngineConfig
from fleetsim.models import get_model
from fleetsim.policies.trajectories import StickySkew, TrajectoryPlan
from fleetsim.rl import agentic_rollout, trajectories, trajectory_placement
from fleetsim.rl.agentic_rollout import AgenticRolloutConfig, run_agentic_rollout
from fleetsim.rl.resource_manager import (
    NODE_GPUS,
    SplitScorer,
    WorkerKind,
    allocate,
    check_split,
    gpu_ids,
    neighbours,
)
from fleetsim.rl.trajectories import TrajectoryArgs, sample_batch
from fleetsim.rl.trajectory_placement import (
    Placement,
    dp_group_sizes,
    dp_group_sizes_per_worker,
    group_cost,
)
from fleetsim.rl.trajectory_predictor import (
    PredictorConfig,
    TrajectoryPredictor,
    quality_at_step,
)
from fleetsim.serving.kv_cache import KVCache

T = lambda b: 1.0 + 0.1 * (b - 1)  # noqa: E731  (a per-token time growing with the batch)


def _contiguous(n: int, w: int):
    for cuts in itertools.combinations_with_replacement(range(n + 1), w - 1):
        bounds = (0, *cuts, n)
        yield [bounds[k + 1] - bounds[k] for k in range(w)]


def _cost_of(lengths, sizes, max_live):
    start, worst = 0, 0.0
    for size in sizes:
        worst = max(worst, group_cost(lengths[start:start + size], T, max_live))
        start += size
    return worst


def test_dp_grouping_is_optimal_against_brute_force():
    """Over random small cases: the DP's cost is the least over contiguous groupings (its
    grouping reaches it), and with the notes' cost (no KV limit) the least over every
    assignment of trajectories to workers."""
    rng = random.Random(7)
    for _ in range(250):
        n, w = rng.randint(1, 7), rng.randint(1, 3)
        max_live = rng.choice([None, 1, 2, 3])
        lengths = sorted((rng.randint(1, 60) for _ in range(n)), reverse=True)
        sizes, cost = dp_group_sizes(lengths, w, T, max_live)
        assert sum(sizes) == n and len(sizes) == w
        assert math.isclose(_cost_of(lengths, sizes, max_live), cost)
        assert math.isclose(min(_cost_of(lengths, s, max_live) for s in _contiguous(n, w)),
                            cost)
        if max_live is None:
            best = min(max(group_cost([lengths[x] for x in range(n) if a[x] == k], T)
                           for k in range(w))
                       for a in itertools.product(range(w), repeat=n))
            assert math.isclose(best, cost)


def test_dp_isolates_the_longest_and_spreads_the_rest():
    sizes, cost = dp_group_sizes([100, 10, 10, 10, 10, 10], 3, T)
    assert sizes == [1, 2, 3] and math.isclose(cost, 100.0)


def _reference_dp(lengths, workers, tie_break=True):
    """The DP over whole ``(n+1) x (n+1)`` cost matrices, column by column (the obvious
    form the blocked one must equal exactly): group sizes and the least largest cost."""
    n = len(lengths)
    prefix = np.concatenate(([0.0], np.cumsum(lengths)))
    j, i = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    size = i - j

    def matrix(per_token_s, max_live):
        live = max(1, n if max_live is None else min(n, max_live))
        t = np.array([0.0] + [per_token_s(b) for b in range(1, live + 1)])
        b = np.clip(size, 1, live)
        first = np.append(np.asarray(lengths, dtype=float), 0.0)[j]
        c = np.where(size > 0, t[b] * np.maximum(first, (prefix[i] - prefix[j]) / b), 0.0)
        return np.where(size < 0, math.inf, c)

    def run(costs, combine):
        f, choices = np.full(n + 1, math.inf), []
        f[0] = 0.0
        for c in costs:
            m = combine(f[:, None], c)
            choices.append(np.argmin(m, axis=0))
            f = m[choices[-1], np.arange(n + 1)]
        sizes, end = [], n
        for arg in reversed(choices):
            sizes.append(end - int(arg[end]))
            end = int(arg[end])
        return sizes[::-1], float(f[n])

    costs = [matrix(t, live) for t, live in workers]
    sizes, best = run(costs, np.maximum)
    if tie_break:
        squares = [np.where(c <= best * (1 + 1e-12), (size ** 2).astype(float), math.inf)
                   for c in costs]
        sizes = run(squares, np.add)[0]
    return sizes, best


def test_workers_of_one_speed_but_different_live_limits_get_their_own_costs():
    """Two workers that share a per-token time but not ``max_live`` (the same GPU, another
    KV budget) are costed each with its own limit, not the first one's."""
    lengths = [12.0, 11.0, 9.0, 8.0, 8.0, 6.0, 5.0, 3.0, 2.0, 1.0]
    for ws in ([(T, None), (T, 1)], [(T, 1), (T, None)], [(T, 2), (T, 7), (T, None)]):
        assert dp_group_sizes_per_worker(lengths, ws) == _reference_dp(lengths, ws)


@pytest.mark.parametrize("block_cells", [1, 7, 64, trajectory_placement.BLOCK_CELLS])
def test_blocked_dp_equals_the_whole_matrix_dp_exactly(monkeypatch, block_cells):
    """The DP kept in row blocks of the lower triangle (and the resource manager's scorer,
    which shares the DP's rows between splits with a common prefix) gives exactly the
    whole-matrix DP's sizes and cost, ties included (lengths with repeats, several blocks)."""
    monkeypatch.setattr(trajectory_placement, "BLOCK_CELLS", block_cells)
    rng = random.Random(block_cells)
    other = lambda b: 0.6 + 0.07 * (b - 1) ** 1.3  # noqa: E731
    for _ in range(60):
        n, w = rng.randint(1, 40), rng.randint(1, 5)
        max_live = rng.choice([None, 1, 3, 7])
        lengths = sorted((rng.randint(1, 12) * rng.choice([1.0, 1.5]) for _ in range(n)),
                         reverse=True)
        assert dp_group_sizes(lengths, w, T, max_live) == _reference_dp(
            lengths, [(T, max_live)] * w)
        ws = [rng.choice([(T, max_live), (other, 3)]) for _ in range(w)]
        assert dp_group_sizes_per_worker(lengths, ws) == _reference_dp(lengths, ws)
    lengths = _tail(50, 3)
    kinds = _kinds()
    scorer = SplitScorer(lengths, kinds)
    for split in [(8, 8), (8, 4, 4), (8, 4, 2, 2), (8, 4, 2, 1, 1), (4, 4, 4, 4),
                  (2,) * 8, (8, 4, 2, 2)]:
        assert scorer(split) == _reference_dp(
            lengths, [(kinds[tp].per_token_s, kinds[tp].max_live) for tp in split])[1]


def test_placement_bands_and_moves():
    """Worker bands follow the sorted predictions; a trajectory revealed longer moves to the
    band of its new prediction only when that shortens the two workers' predicted finish,
    never to a shorter band."""
    predicted = [100.0, 10.0, 9.0, 8.0, 7.0, 6.0]
    p = Placement(predicted, 3, T)
    assert p.sizes == [1, 2, 3]
    assert [p.worker_of[i] for i in range(6)] == [0, 1, 1, 2, 2, 2]
    assert p.worker_for(100.0) == 0 and p.worker_for(50.0) == 1 and p.worker_for(1.0) == 2
    left = dict(enumerate(predicted))
    # Trajectory 5 turns out to need 9.5 more: worker 1 (2 with 10 and 9 left) would finish
    # at max(9.5, 10) x T(3) = 12 against max(9.5 x T(3), 10 x T(2)) = 11.4 now: stays.
    left[5] = 9.5
    assert p.move_for(5, 9.5, left.__getitem__) is None
    # Worker 1's trajectories nearly done: before max(9.5 x T(3), 1 x T(2)) = 11.4, after
    # max(9.5, 1) x T(3) = 11.4: not shorter, stays; with one of them finished, after is
    # 9.5 x T(2) = 10.45: it moves.
    left[1], left[2] = 1.0, 1.0
    assert p.move_for(5, 9.5, left.__getitem__) is None
    p.finished(2)
    assert p.move_for(5, 9.5, left.__getitem__) == 1
    assert p.move_for(1, 1.0, left.__getitem__) is None  # overestimated: stays
    p.moved(5, 1)
    assert p.worker_of[5] == 1 and p.members == [{0}, {1, 5}, {3, 4}]


def test_predictor_quality_and_refinement():
    batch = sample_batch(TrajectoryArgs(num_prompts=64), np.random.default_rng(0))
    truth = batch.output_tokens
    oracle = TrajectoryPredictor(truth, PredictorConfig(correlation_by_step=(1.0,)),
                                 np.random.default_rng(1))
    assert all(math.isclose(oracle.predict(i, 0, 0), truth[i]) for i in range(len(truth)))
    default = TrajectoryPredictor(truth, PredictorConfig(), np.random.default_rng(1))
    pearson0, recall0 = quality_at_step(default, 0)
    pearson2, recall2 = quality_at_step(default, 2)
    # The quality the reproduction assumes from step 2 on is the paper's.
    assert pearson2 > 0.7 and recall2 > 0.8
    assert pearson0 < pearson2 and recall0 < recall2
    # Never below what a trajectory has already generated.
    assert default.predict(0, 1, 10 ** 6) == 10 ** 6


def test_a_batch_drawn_again_is_the_first_draw_and_leaves_the_stream_alike():
    """``sample_batch`` keeps a process's draws by (args, generator state): drawing again
    from the same state gives the first draw's batch, read-only (it is shared), and leaves
    the generator where a fresh draw leaves it, so the next draw is the next batch."""
    args = TrajectoryArgs(num_prompts=3, samples_per_prompt=2)
    reference = np.random.default_rng(11)
    drawn = [trajectories._draw_batch(args, reference) for _ in range(2)]
    rng = np.random.default_rng(11)
    first = [sample_batch(args, rng) for _ in range(2)]
    rng_again = np.random.default_rng(11)
    again = [sample_batch(args, rng_again) for _ in range(2)]
    assert again[0] is first[0] and again[1] is first[1]
    for batch, ref in zip(again, drawn, strict=True):
        assert batch.programs == ref.programs
        assert np.array_equal(batch.group, ref.group)
        assert np.array_equal(batch.output_tokens, ref.output_tokens)
    assert first[0].programs != first[1].programs
    assert rng_again.random() == rng.random() == reference.random()
    with pytest.raises(ValueError, match="read-only"):
        first[0].output_tokens[0] = 1
    other = sample_batch(replace(args, num_prompts=4), np.random.default_rng(11))
    assert len(other.programs) == 8


def test_rollouts_sharing_standalone_times_match_fresh_ones():
    """Standalone call times kept across rollouts (``_ALONE_S``, by model, GPU, engine and
    TP) give what a fresh process gives: a rollout after others on other engines and TPs
    equals the same rollout with nothing kept."""
    cfg = _small(placement="heddle", scheduling="progressive_priority", tp=2)
    others = [_small(tp=2, engine=EngineConfig(max_batched_tokens=256)), _small()]
    for other in others:
        run_agentic_rollout(other)
    shared = run_agentic_rollout(cfg).summary
    agentic_rollout._ALONE_S.clear()
    trajectories._BATCHES.clear()
    assert run_agentic_rollout(cfg).summary == shared


def _small(**kw) -> AgenticRolloutConfig:
    base = AgenticRolloutConfig(num_gpus=2, trajectories=TrajectoryArgs(num_prompts=4,
                                                                        samples_per_prompt=4))
    return replace(base, **kw)


def test_priority_is_refreshed_after_every_step():
    """Each step is queued with the prediction made after the steps before it, and the
    progressive-priority key is that prediction, longest first."""
    r = run_agentic_rollout(_small(scheduling="progressive_priority", placement="heddle"))
    d = r.driver
    programs = d.batch.programs
    for traj, preds in enumerate(d.predicted_by_step):
        assert len(preds) == programs[traj].num_calls
        done = 0
        for k, pred in enumerate(preds):
            assert math.isclose(pred, d.predictor.predict(traj, k, done))
            done += programs[traj].calls[k].num_output_tokens
    from fleetsim.policies.trajectories import ProgressivePriority
    from fleetsim.serving.request import Request

    class _Tag:
        def __init__(self, plan):
            self.program = type("P", (), {"id": 0, "policy": plan})()

    long_req = Request(id=1, arrival_s=5.0, num_prompt_tokens=10, max_output_tokens=1,
                       program=_Tag(TrajectoryPlan(900.0)))
    short_req = Request(id=2, arrival_s=1.0, num_prompt_tokens=10, max_output_tokens=1,
                        program=_Tag(TrajectoryPlan(100.0)))
    policy = ProgressivePriority()
    assert policy.key(long_req, 0.0) < policy.key(short_req, 0.0)


def test_progressive_priority_preempts_for_the_longest():
    """One running slot: FCFS never preempts; progressive priority preempts for a step of a
    trajectory predicted longer, and with an oracle predictor the longest trajectory waits
    less than under FCFS."""
    eng = EngineConfig(max_running=1)
    oracle = PredictorConfig(correlation_by_step=(1.0,))
    fcfs = run_agentic_rollout(_small(num_gpus=1, engine=eng, predictor=oracle))
    prio = run_agentic_rollout(_small(num_gpus=1, engine=eng, predictor=oracle,
                                      scheduling="progressive_priority"))
    assert fcfs.summary["num_preemptions"] == 0
    assert prio.summary["num_preemptions"] > 0
    assert (prio.summary["queueing"]["longest_trajectory_wait_s"]
            < fcfs.summary["queueing"]["longest_trajectory_wait_s"])


def test_progressive_priority_swaps_instead_of_recomputing():
    """Preemption that keeps KV: with preemption_mode swap, the steps progressive priority
    preempts (for a better one, or under KV pressure) go to host memory and come back, so
    nothing is computed twice; by recompute, the same rollout recomputes their contexts.
    Every trajectory finishes either way (a swapped step does not take back the slot it gave
    up before the better step runs: no ping-pong)."""
    eng = dict(max_running=1)
    oracle = PredictorConfig(correlation_by_step=(1.0,))
    base = dict(num_gpus=1, predictor=oracle, scheduling="progressive_priority")
    recompute = run_agentic_rollout(_small(**base, engine=EngineConfig(
        **eng, swap_space_gib=16))).summary
    swap = run_agentic_rollout(_small(**base, preemption_mode="swap", engine=EngineConfig(
        **eng, swap_space_gib=16)))
    s = swap.summary
    assert recompute["num_preemptions"] > 0 and recompute["num_recomputed_tokens"] > 0
    assert s["num_recomputed_tokens"] == 0 and s["num_preemptions"] == 0
    assert int(swap.records.requests["num_swaps"].sum()) > 0
    assert (s["queueing"]["longest_trajectory_wait_s"]
            <= recompute["queueing"]["longest_trajectory_wait_s"] + 1e-9)


@pytest.mark.slow
def test_a_crowded_rollout_does_not_fall_below_verl_when_preemption_keeps_the_kv():
    """A crowded regime: 256 trajectories on one GPU (2x the entry's per GPU) with lengths
    scaled to DeepCoder's 64K training cap (64K / DAPO's 20K = 3.2). Preemption by recompute
    thrashes there and Heddle (fixed MP) falls below verl; swapping the KV keeps it above.
    (512 trajectories, used before, order the three the same with the same margins, about 5%
    and 2%, in 2.6x the time.)"""
    crowded = dict(model="qwen3-8b", num_gpus=1, engine=EngineConfig(swap_space_gib=256),
                   trajectories=TrajectoryArgs(num_prompts=16, samples_per_prompt=16,
                                               length_scale=3.2))
    heddle = dict(placement="heddle", scheduling="progressive_priority", migration=True)
    verl = run_agentic_rollout(AgenticRolloutConfig(**crowded, placement="sticky")).summary
    recompute = run_agentic_rollout(AgenticRolloutConfig(**crowded, **heddle)).summary
    swap = run_agentic_rollout(AgenticRolloutConfig(**crowded, **heddle,
                                                    preemption_mode="swap")).summary
    assert recompute["tokens_per_s"] < verl["tokens_per_s"] < swap["tokens_per_s"]
    assert swap["num_recomputed_tokens"] == 0 < recompute["num_recomputed_tokens"]


def test_swap_preemption_needs_host_memory():
    with pytest.raises(ValueError, match="preemption_mode swap needs host memory"):
        AgenticRolloutConfig(preemption_mode="swap")


def test_migration_happens_in_tool_waits_and_pays_the_transfer():
    cfg = _small(num_gpus=4, trajectories=TrajectoryArgs(num_prompts=8, samples_per_prompt=8),
                 scheduling="progressive_priority", placement="heddle", migration=True)
    r = run_agentic_rollout(cfg)
    d = r.driver
    assert d.migrations, "expected some mispredicted trajectory to move"
    req = r.records.requests
    row = {int(x): i for i, x in enumerate(req["request_id"])}
    kv_bytes = d.kv_bytes_per_token
    assert kv_bytes > 0
    for m in d.migrations:
        traj = m["trajectory"]
        steps = d.request_ids[traj]
        k = steps.index(m["request_id"])
        assert k >= 1  # never the first step: a move starts when a step ends
        prev, nxt = row[steps[k - 1]], row[m["request_id"]]
        # It starts when the previous step ends (its tool wait begins) ...
        assert math.isclose(m["start_s"], req["finish_s"][prev])
        assert req["replica_id"][prev] == m["src"] and req["replica_id"][nxt] == m["dst"]
        # ... and the next step comes when both the tool and the copy are done.
        tool_s = d.batch.programs[traj].calls[k - 1].tool_s
        assert math.isclose(m["tool_s"], tool_s, abs_tol=1e-9)
        assert math.isclose(req["arrival_s"][nxt],
                            m["start_s"] + max(tool_s, m["transfer_s"]), abs_tol=1e-9)
        # The copy is the cached context at the link's bandwidth, never faster.
        link = r.summary["pools"][0]
        assert m["bytes"] == kv_bytes * m["num_entries"] * 64
        assert m["transfer_s"] >= m["bytes"] / (50e9 * link["tp"]) - 1e-12
        assert req["num_prefix_hit_tokens"][nxt] > 0  # the moved KV is used
    s = r.summary["migration"]
    assert s["num_migrations"] == len(d.migrations) and s["bytes"] > 0


def test_no_migration_without_it():
    r = run_agentic_rollout(_small(placement="heddle", scheduling="progressive_priority"))
    assert r.summary["migration"]["num_migrations"] == 0


def test_same_seed_same_rollout():
    cfg = _small(placement="heddle", scheduling="progressive_priority", migration=True)
    a, b = run_agentic_rollout(cfg).summary, run_agentic_rollout(cfg).summary
    assert a == b
    c = run_agentic_rollout(replace(cfg, seed=1)).summary
    assert c["num_generated_tokens"] != a["num_generated_tokens"]


def test_every_trajectory_finishes_under_every_system():
    for placement in ("least_requests", "sticky", "sticky_skew", "heddle"):
        for scheduling in ("fcfs", "progressive_priority"):
            s = run_agentic_rollout(_small(placement=placement, scheduling=scheduling,
                                           engine=EngineConfig(debug=True))).summary
            assert s["rollout_s"] >= s["critical_path_s"] > 0
            assert math.isclose(s["tokens_per_s"], s["num_generated_tokens"] / s["rollout_s"])


class _View:
    def __init__(self, loads):
        self.replicas = [type("R", (), {"running": [0] * n, "waiting": []})()
                         for n in loads]


def test_sticky_skew_leaves_an_overloaded_worker():
    from fleetsim.serving.request import Request

    class _Tag:
        program = type("P", (), {"id": 3, "policy": None})()

    req = Request(id=1, arrival_s=0.0, num_prompt_tokens=10, max_output_tokens=1,
                  program=_Tag())
    router = StickySkew(skew_threshold=1.5)
    assert router.route(_View([0, 1, 1]), req, 0.0) == 0  # first: least loaded
    assert router.route(_View([2, 1, 1]), req, 0.0) == 0  # 2 <= 1.5 x mean 1.33: sticks
    assert router.route(_View([9, 1, 2]), req, 0.0) == 1  # skewed: least loaded
    assert router.report() == {"num_skew_routes": 1}
    assert router.route(_View([1, 1, 2]), req, 0.0) == 1  # sticky to the new one


def test_kv_install_caches_a_leading_run_within_free_blocks():
    kv = KVCache(num_blocks=16, block_size=16, hash_block_tokens=64)  # 4 blocks per entry
    assert kv.install((1, 2, 3)) == 3
    assert kv.prefix.num_leading((1, 2, 3, 4), 4) == 3
    assert kv.num_evictable_blocks == 12 and kv.num_free_blocks == 4
    kv.check([])
    # Extending the run keeps its head and evicts nothing of it; room for one more only.
    assert kv.install((1, 2, 3, 4, 5)) == 4
    kv.check([])
    assert kv.prefix.num_leading((1, 2, 3, 4), 4) == 4


@pytest.mark.parametrize(("override", "needle"), [
    # the reproduction's runs are [rl] tables of the agentic generation source
    ("generation.agentic.scheduling=\"sjf\"",
     "scheduling must be one of fcfs, progressive_priority"),
    ("generation.tp=3", "not a multiple of generation.tp 3"),
    ("generation.agentic.predictor.correlation_by_step=[1.5]", "correlation_by_step"),
    ("generation.agentic.max_context_tokens=100000", "rl.generation.agentic.max_context_tokens"),
    ("generation.agentic.turn_shares=[0.5]", "turn_shares"),
    ("scheduling=\"fcfs\"", "rl.scheduling: got 'fcfs'; unknown key"),
])
def test_bad_input_is_one_line_and_exit_2(override, needle, capsys, tmp_path):
    assert main(["repro", "heddle", "--quick", "--set", override,
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


# ---- the trajectory-adaptive resource manager (per-worker TP) ----------------------------

def _kinds():
    """Worker kinds where a higher TP decodes faster per token but holds fewer workers."""
    return {tp: WorkerKind(tp, (lambda b, tp=tp: (1.0 + 0.05 * (b - 1)) / tp ** 0.7), 64)
            for tp in (1, 2, 4, 8)}


def _tail(n, seed):
    rng = np.random.default_rng(seed)
    return sorted((float(x) for x in rng.lognormal(7.5, 0.8, n)), reverse=True)


def test_annealing_never_worse_than_its_start_and_deterministic():
    """From the sorted assignment at every fixed TP, over seeds: the split returned is never
    scored worse than the start, is a valid split of the budget, and the same seed returns the
    same split."""
    lengths = _tail(200, 3)
    kinds = _kinds()
    for start_tp in (1, 2, 4, 8):
        for seed in range(4):
            a = allocate(lengths, kinds, 16, start_tp, np.random.default_rng(seed), 60)
            assert a.start == (start_tp,) * (16 // start_tp)
            assert a.cost_s <= a.start_cost_s
            scorer = SplitScorer(lengths, kinds)
            assert math.isclose(scorer(a.split), a.cost_s)
            assert math.isclose(scorer(a.start), a.start_cost_s)
            check_split(a.split, 16, (1, 2, 4, 8))
            b = allocate(lengths, kinds, 16, start_tp, np.random.default_rng(seed), 60)
            assert a == b
    # A long tail makes a high-TP worker worth it here; zero steps return the start.
    a = allocate(lengths, kinds, 16, 1, np.random.default_rng(0), 200)
    assert a.cost_s < a.start_cost_s and max(a.split) > 1
    z = allocate(lengths, kinds, 16, 1, np.random.default_rng(0), 0)
    assert z.split == z.start and z.cost_s == z.start_cost_s


def test_every_gpu_used_once_and_workers_stay_in_a_node():
    """Every split the search can reach uses each GPU of the budget exactly once, and no
    worker spans two nodes."""
    seen, frontier = set(), [(1,) * 16]
    while frontier:
        split = frontier.pop()
        if split in seen:
            continue
        seen.add(split)
        frontier.extend(neighbours(split, (1, 2, 4, 8)))
    assert (8, 8) in seen and (1,) * 16 in seen and (8, 4, 2, 1, 1) in seen
    for split in seen:
        check_split(split, 16, (1, 2, 4, 8))
        ids = gpu_ids(split)
        assert sorted(g for w in ids for g in w) == list(range(16))
        assert all(len({g // NODE_GPUS for g in w}) == 1 for w in ids)
    with pytest.raises(ValueError, match="uses 15 GPUs"):
        check_split((8, 4, 2, 1), 16, (1, 2, 4, 8))


def test_groups_go_to_workers_in_length_order():
    """On a heterogeneous split, every trajectory on a higher-TP worker is predicted at least
    as long as every one on a lower-TP worker, and the DP is optimal over contiguous
    groupings with each worker's own cost."""
    kinds = _kinds()
    split = (8, 4, 2, 1, 1)
    predicted = [float(x) for x in np.random.default_rng(5).permutation(_tail(60, 5))]
    workers = [(kinds[tp].per_token_s, kinds[tp].max_live) for tp in split]
    p = Placement(predicted, len(split), workers[0][0], workers[0][1], workers=workers)
    for hi in range(len(split)):
        for lo in range(len(split)):
            if split[hi] > split[lo]:
                on_hi = [predicted[x] for x in range(60) if p.worker_of[x] == hi]
                on_lo = [predicted[x] for x in range(60) if p.worker_of[x] == lo]
                if on_hi and on_lo:
                    assert min(on_hi) >= max(on_lo)
    rng = random.Random(11)
    for _ in range(60):
        n = rng.randint(1, 6)
        ws = [workers[k] for k in sorted(rng.sample(range(5), rng.randint(1, 3)))]
        lengths = sorted((rng.randint(1, 60) for _ in range(n)), reverse=True)
        sizes, cost = dp_group_sizes_per_worker(lengths, ws)
        assert sum(sizes) == n

        def worst(sz, ws=ws, lengths=lengths):
            start, out = 0, 0.0
            for (t, live), size in zip(ws, sz, strict=True):
                out = max(out, group_cost(lengths[start:start + size], t, live))
                start += size
            return out
        assert math.isclose(worst(sizes), cost)
        assert math.isclose(min(worst(s) for s in _contiguous(n, len(ws))), cost)


def _four(**kw) -> AgenticRolloutConfig:
    return replace(AgenticRolloutConfig(num_gpus=4, trajectories=TrajectoryArgs(
        num_prompts=4, samples_per_prompt=16)), **kw)


def test_without_the_resource_manager_the_rollout_is_unchanged():
    """The fixed-MP path gives the figures it gave before the resource manager existed
    (recorded from the previous version of this entry, 4 prompts x 16 on 4 GPUs)."""
    heddle = run_agentic_rollout(_four(placement="heddle", scheduling="progressive_priority",
                                       migration=True)).summary
    verl = run_agentic_rollout(_four(placement="sticky")).summary
    assert heddle["rollout_s"] == pytest.approx(83.5616134032929, rel=1e-12)
    assert verl["rollout_s"] == pytest.approx(83.25470226793337, rel=1e-12)
    assert "resource_manager" not in heddle


def test_resource_manager_rollout_runs_its_split():
    """With the manager on: the pools are its split (highest TP first), every GPU of the
    budget used, the longest-predicted group on the highest-TP worker, the same seed the same
    rollout."""
    cfg = _four(placement="heddle", scheduling="progressive_priority", migration=True,
                resource_manager=True)
    a = run_agentic_rollout(cfg)
    s = a.summary
    rm = s["resource_manager"]
    assert rm["cost_s"] <= rm["start_cost_s"] and sum(rm["split"]) == 4
    assert sum(p["tp"] * p["num_replicas"] for p in s["pools"]) == 4
    assert [p["tp"] for p in s["pools"]] == sorted({*rm["split"]}, reverse=True)
    plans = a.driver.predicted_by_step
    first = [plans[x][0] for x in range(len(plans))]
    longest = max(range(len(first)), key=lambda x: first[x])
    assert a.driver.plans[longest].worker == 0  # worker 0: the highest TP's first replica
    assert a.driver.worker_of_last[longest] == 0  # and it ran there (nothing longer to join)
    assert s["rollout_s"] >= s["critical_path_s"] > 0
    assert run_agentic_rollout(cfg).summary == s


def test_replay_scoring_keeps_the_split_whose_replay_of_the_previous_rollout_ends_first():
    """split_scoring replay: the DP's own choice, the DP's next best splits and the start
    each replay the previous rollout; the split kept is the one whose replay ended first,
    which the DP alone need not pick."""
    base = dict(placement="heddle", scheduling="progressive_priority", migration=True,
                resource_manager=True)
    dp = run_agentic_rollout(_four(**base)).summary["resource_manager"]
    rm = run_agentic_rollout(_four(**base, split_scoring="replay")).summary["resource_manager"]
    assert dp["scoring"] == "dp" and dp["replayed"] == []
    replayed = rm["replayed"]
    assert replayed[0]["split"] == dp["split"] and replayed[-1]["split"] == rm["start"]
    assert 2 <= len(replayed) <= 2 + AgenticRolloutConfig().num_replayed
    assert len({tuple(r["split"]) for r in replayed}) == len(replayed)
    done = [r for r in replayed if r["rollout_s"] is not None]
    assert rm["split"] == min(done, key=lambda r: r["rollout_s"])["split"]
    assert all(r["rollout_s"] > 0 for r in done)
    assert run_agentic_rollout(_four(**base, split_scoring="replay")).summary[
        "resource_manager"] == rm


def test_a_kept_split_is_the_search_a_fresh_process_makes():
    """A first rollout's split is kept by what the search reads (``_SPLITS``): replay
    scoring reuses the DP-scored config's search, and a config the search reads differently
    (fewer annealing moves, another seed) searches again, as a fresh process does."""
    model = get_model("qwen3-8b")
    cfg = _four(placement="heddle", scheduling="progressive_priority", migration=True,
                resource_manager=True, anneal_steps=40)

    def manager_ss(c: AgenticRolloutConfig) -> np.random.SeedSequence:
        return np.random.SeedSequence(c.seed).spawn(4)[3]

    kept = agentic_rollout._allocate(cfg, model, manager_ss(cfg))
    replay = replace(cfg, split_scoring="replay")
    assert agentic_rollout._allocate(replay, model, manager_ss(replay)) is kept
    others = [replace(cfg, anneal_steps=0), replace(cfg, seed=1)]
    kept_others = [agentic_rollout._allocate(c, model, manager_ss(c)) for c in others]
    agentic_rollout._SPLITS.clear()
    assert agentic_rollout._allocate(cfg, model, manager_ss(cfg)) == kept
    for c, k in zip(others, kept_others, strict=True):
        assert agentic_rollout._allocate(c, model, manager_ss(c)) == k
    assert kept_others[0].num_evaluated < kept.num_evaluated


def test_bounded_replays_choose_what_full_replays_choose():
    """Branch and bound: each replay stops at the soonest finish so far, so a split that
    cannot win is not replayed to its end; the kept split and the winners' times are those
    of full replays, and a stopped one's full replay indeed ends no sooner than its bound."""
    cfg = _four(placement="heddle", scheduling="progressive_priority", migration=True,
                resource_manager=True, split_scoring="replay")
    model = get_model(cfg.model)
    manager_ss = np.random.SeedSequence(cfg.seed).spawn(4)[3]
    allocation = agentic_rollout._allocate(cfg, model, manager_ss)
    chosen, replayed = agentic_rollout._replay(cfg, model, manager_ss, allocation)
    # The manager's streams afresh (spawning advances a seed sequence): the replay's
    # history batch is the one the manager sized the workers for.
    history_ss, _, replay_ss = np.random.SeedSequence(cfg.seed).spawn(4)[3].spawn(3)
    history = sample_batch(cfg.trajectories, np.random.default_rng(history_ss))
    predictor_ss, routing_ss = replay_ss.spawn(2)
    full = {}
    for split in agentic_rollout.replay_candidates(allocation, cfg.num_replayed):
        predictor = TrajectoryPredictor(history.output_tokens, cfg.predictor,
                                        np.random.default_rng(predictor_ss))
        driver = agentic_rollout._simulate(cfg, model, history, predictor, split, routing_ss)[0]
        full[split] = float(np.max(driver.finish_s))
    assert chosen.split == min(full, key=full.__getitem__)  # ties: the first, as both keep
    cut = [r for r in replayed if r["rollout_s"] is None]
    assert cut, "some replay must stop at the bound in this setting"
    for r in replayed:
        if r["rollout_s"] is None:
            assert full[tuple(r["split"])] >= r["cut_at_s"]
        else:
            assert r["rollout_s"] == full[tuple(r["split"])]


def test_a_held_split_and_shared_simulations_give_the_managers_rollout():
    """``split`` fixes the workers (heddle-recompute holds heddle's split): the rollout is
    the one the resource manager ran on that split; a shared ``simulations`` memo hands a
    run that differs only in how its split was chosen the same simulation, unchanged."""
    base = dict(placement="heddle", scheduling="progressive_priority", migration=True)
    rm = run_agentic_rollout(_four(**base, resource_manager=True))
    split = tuple(rm.summary["resource_manager"]["split"])
    assert split != (1, 1, 1, 1)  # the manager moved off the start: the split matters
    alone = {k: v for k, v in rm.summary.items() if k != "resource_manager"}
    held = run_agentic_rollout(_four(**base, split=split))
    assert held.summary == alone
    assert run_agentic_rollout(_four(**base)).summary != alone  # the start's rollout differs
    memo: agentic_rollout.Simulations = {}
    first = run_agentic_rollout(_four(**base, split=split), memo)
    again = run_agentic_rollout(_four(**base, resource_manager=True), memo)
    assert len(memo) == 1 and again.records is first.records
    assert again.summary == rm.summary and first.summary == held.summary
    other = run_agentic_rollout(_four(**{**base, "migration": False}, split=split), memo)
    assert len(memo) == 2 and other.records is not first.records


def test_a_held_split_is_checked():
    with pytest.raises(ValueError, match=r"split \[2, 1\] uses 3 GPUs"):
        _four(placement="heddle", split=(2, 1))
    with pytest.raises(ValueError, match="resource_manager off"):
        _four(placement="heddle", resource_manager=True, split=(2, 2))


@pytest.mark.parametrize(("override", "needle"), [
    ("generation.agentic.tp_choices=[3]", "tp_choices must be some of [1, 2, 4, 8]"),
    ("generation.agentic.anneal_steps=-1", "anneal_steps must be >= 0"),
    ("generation.agentic.split_scoring=\"guess\"", "split_scoring must be dp or replay"),
    ("generation.agentic.placement=\"sticky\"", "needs placement heddle"),
    ("generation.agentic.split=[2,2]", "fixes the workers"),
])
def test_resource_manager_bad_input_is_one_line(override, needle, capsys, tmp_path):
    assert main(["repro", "heddle", "--quick", "--set", override,
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_each_quick_run_is_its_own_systems_rollout(quick_run):
    """A run is reused only for a system whose config is the same one (held split
    included): heddle-recompute runs on heddle's split and is not handed heddle's run;
    Fix-1 swaps on the start's workers, which at --quick's 8B (TP 1) is heddle-fixed-mp's
    config, so it is that run. (The files of `repro heddle --quick`, run once per test
    process: test_repro.py's per-entry test reads them too.)"""
    out = quick_run("heddle").out

    def config(policy: str) -> dict:
        (path,) = (out / "runs" / policy).glob("*/config.json")
        return json.loads(path.read_text())

    heddle, held, fix1 = config("heddle"), config("heddle-recompute"), config("heddle-fix-1")
    summary = json.loads(next((out / "runs" / "heddle").glob("*/summary.json")).read_text())
    assert held["split"] == summary["resource_manager"]["split"] and held["split"]
    assert held["preemption_mode"] == "recompute" and heddle["preemption_mode"] == "swap"
    assert fix1["split"] == [] and fix1["preemption_mode"] == "swap"
    assert fix1 == config("heddle-fixed-mp")
