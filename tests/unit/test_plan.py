"""Capacity planning: shape enumeration, Pareto front on hand-made points, infeasible shapes."""

from __future__ import annotations

import itertools

import pytest

from fleetsim.config import load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.search.deploy import hf_repo_id, per_user_front, vllm_serve_commands
from fleetsim.search.plan import enumerate_shapes, pareto_front, plan, plan_to_dict


def brute_front(points):
    """Reference: a point is on the front when no other point dominates it."""
    def dominated(i):
        ci, gi = points[i]
        return any((c <= ci and g >= gi and (c < ci or g > gi)) for j, (c, g) in
                   enumerate(points) if j != i)
    return {i for i, (_, g) in enumerate(points) if g > 0 and not dominated(i)}


def test_pareto_front_on_hand_made_points():
    pts = [(3.0, 10.0), (1.0, 2.0), (2.0, 9.0), (2.5, 8.0), (6.0, 30.0), (6.0, 20.0),
           (1.5, 0.0), (8.0, 30.0)]
    front = pareto_front(pts)
    assert front == [1, 2, 0, 4]  # sorted by cost; (2.5, 8) and the costlier 30 are beaten
    assert set(front) == brute_front(pts)


def test_pareto_front_ties_and_zero_goodput():
    assert pareto_front([(1.0, 5.0), (1.0, 5.0), (1.0, 7.0)]) == [2]
    assert pareto_front([(1.0, 0.0), (2.0, 0.0)]) == []
    assert pareto_front([]) == []


def test_pareto_front_matches_brute_force_on_a_grid():
    costs = [1.0, 2.0, 3.5]
    goods = [0.0, 1.0, 4.0, 4.0]
    for pts in itertools.islice(itertools.product(itertools.product(costs, goods), repeat=4),
                                0, None, 7):
        front = pareto_front(list(pts))
        chosen = {pts[i] for i in front}
        assert chosen == {pts[i] for i in brute_front(list(pts))}
        assert [pts[i][0] for i in front] == sorted(pts[i][0] for i in front)


def test_enumerate_shapes_counts_and_limits():
    shapes = enumerate_shapes(["h100", "a100"], [1, 2], 4)
    names = [s.name for s in shapes]
    # per GPU: tp1 x {1,2,4} replicas, tp2 x {1,2}
    assert len(shapes) == 10
    assert "4x H100-SXM tp1" in names
    assert "2x A100-80GB-SXM tp2" in names
    assert all(s.num_gpus <= 4 for s in shapes)
    pd = [s for s in enumerate_shapes(["h100", "h200"], [1], 4, pd=True) if s.is_pd]
    assert {s.name for s in pd} >= {"1P(H100-SXM tp1)+1D(H100-SXM tp1)",
                                    "1P(H200 tp1)+2D(H100-SXM tp1)",
                                    "2P(H100-SXM tp1)+2D(H200 tp1)"}
    assert all(s.num_gpus <= 4 for s in pd)
    assert len({s.name for s in pd}) == len(pd)


def test_enumerate_unknown_gpu_is_an_input_error():
    with pytest.raises(FleetsimInputError, match="unknown GPU"):
        enumerate_shapes(["h100", "tpu-v9"], [1], 4)


def test_shape_apply_sets_pools():
    config = load_config()
    mixed, *_ = enumerate_shapes(["h200"], [2], 2)
    c = mixed.apply(config)
    assert (c.pools[0].gpu, c.pools[0].tp, c.pools[0].num_replicas) == ("H200", 2, 1)
    pd = next(s for s in enumerate_shapes(["h100"], [1], 3, pd=True) if s.is_pd)
    c = pd.apply(config)
    assert [p.role for p in c.pools] == ["prefill", "decode"]


def test_plan_skips_shapes_that_do_not_fit():
    """Llama-3.1-70B does not fit one A100 at tp1: infeasible, listed, no crash."""
    config = load_config(None, ["model=llama-3.1-70b", "workload.max_requests=30"])
    shapes = enumerate_shapes(["a100"], [1], 1)
    points = plan(config, shapes, max_runs=2)
    out = plan_to_dict(points, target=0.9)
    assert out["infeasible"] == ["1x A100-80GB-SXM tp1"]
    assert "weights" in out["points"][0]["infeasible"]
    assert out["front"] == []


def test_plan_empty_shape_space_is_an_input_error():
    with pytest.raises(FleetsimInputError, match="empty"):
        plan(load_config(), [])


def test_per_user_front_matches_brute_force():
    pts = [(u, g) for u in (10.0, 20.0, 30.0, 40.0) for g in (100.0, 300.0, 200.0)][::2]
    pts += [(25.0, 250.0), (25.0, 250.0), (5.0, 1000.0)]

    def dominated(i):
        ui, gi = pts[i]
        return any(u >= ui and g >= gi and (u > ui or g > gi) for j, (u, g) in enumerate(pts)
                   if j != i)
    front = per_user_front(pts)
    assert {pts[i] for i in front} == {pts[i] for i in range(len(pts)) if not dominated(i)}
    assert [pts[i][0] for i in front] == sorted(pts[i][0] for i in front)


def test_vllm_serve_commands_for_mixed_and_pd_shapes():
    assert hf_repo_id("llama-3.1-70b") == "meta-llama/Llama-3.1-70B-Instruct"
    assert hf_repo_id("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    config = load_config(None, ["model=llama-3.1-70b", "engine.max_running=128",
                                "engine.enable_prefix_caching=false",
                                "policy.batching.args.enable_chunked_prefill=false"])
    (mixed,) = vllm_serve_commands(config, enumerate_shapes(["h100"], [4], 8)[1].pools)
    assert mixed == ("vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4 "
                     "--data-parallel-size 2 --max-num-seqs 128 --max-num-batched-tokens 8192 "
                     "--gpu-memory-utilization 0.9 --block-size 16 --no-enable-prefix-caching "
                     "--no-enable-chunked-prefill --no-async-scheduling")
    asynced = load_config(None, ["engine.async_scheduling=true"])
    (line,) = vllm_serve_commands(asynced, enumerate_shapes(["h100"], [1], 1)[0].pools)
    assert line.endswith(" --async-scheduling")
    pd = next(s for s in enumerate_shapes(["h100"], [1], 2, pd=True) if s.is_pd)
    pre, dec = vllm_serve_commands(config, pd.pools)
    assert pre.startswith("# prefill: vllm serve") and dec.startswith("# decode: vllm serve")
    assert "NixlConnector" in pre and "--kv-transfer-config" in dec
