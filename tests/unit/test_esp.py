"""Elastic sequence parallelism (fleetsim.esp, LoongServe): the prefill DP against brute force,
the pause rule at its boundary, scale-down placement, migration and ESP costs, and the gang
engine's invariants and determinism."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fleetsim.esp import (
    DecodeShard,
    EspConfig,
    EspCostModel,
    EspEngine,
    EspRequest,
    fit_analytical,
    plan_objective,
    plan_prefill,
)
from fleetsim.esp.dp import PrefillBatch
from fleetsim.esp.rules import (
    decode_slowdown_s,
    place_scaled_down,
    prefill_speedup_s,
    should_pause,
)
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model


@pytest.fixture(scope="module")
def cost() -> EspCostModel:
    return EspCostModel(get_model("lwm-text-1m"), get_gpu("a100"), 2)


@pytest.fixture(scope="module")
def analytical(cost):
    return fit_analytical(cost, 4, 210_000)


# -- the prefill DP ----------------------------------------------------------------------
def _compositions(n: int):
    """Every way to cut ``range(n)`` into consecutive non-empty parts."""
    for cuts in itertools.product((False, True), repeat=n - 1):
        parts, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                parts.append(tuple(range(start, i)))
                start = i
        parts.append(tuple(range(start, n)))
        yield parts


def _brute_force(lengths, free, predict):
    best = math.inf
    for parts in _compositions(len(lengths)):
        # instance groups: consecutive, non-empty, one per batch, a prefix of the instances
        for sizes in itertools.product(range(1, len(free) + 1), repeat=len(parts)):
            if sum(sizes) > len(free):
                continue
            plan, at = [], 0
            for part, k in zip(parts, sizes, strict=True):
                insts = tuple(range(at, at + k))
                at += k
                if sum(lengths[r] for r in part) > sum(free[i] for i in insts):
                    break
                plan.append(PrefillBatch(requests=part, instances=insts))
            else:
                best = min(best, plan_objective(lengths, plan, predict))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_prefill_dp_is_optimal_against_brute_force(seed, analytical):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    lengths = sorted((int(x) for x in np.exp(rng.uniform(np.log(50), np.log(150_000), n))),
                     reverse=True)
    free = [int(x) for x in rng.integers(20_000, 210_000, k)]
    plan = plan_prefill(lengths, free, analytical.predict_s)
    best = _brute_force(lengths, free, analytical.predict_s)
    if math.isinf(best):
        assert plan is None
        return
    assert plan is not None
    assert plan.objective_s == pytest.approx(best, rel=1e-6)
    assert plan_objective(lengths, plan.batches, analytical.predict_s) == pytest.approx(
        plan.objective_s, rel=1e-6)
    served = [r for b in plan.batches for r in b.requests]
    assert served == list(range(n))  # every request once, in order
    used = [i for b in plan.batches for i in b.instances]
    assert len(used) == len(set(used))
    for b in plan.batches:
        assert sum(lengths[r] for r in b.requests) <= sum(free[i] for i in b.instances)


def test_prefill_dp_refuses_what_cannot_fit(analytical):
    assert plan_prefill([300_000], [100_000, 100_000], analytical.predict_s) is None
    # fits in total, but only split: the DP must use both instances for it
    plan = plan_prefill([150_000], [100_000, 100_000], analytical.predict_s)
    assert plan is not None and plan.batches[0].instances == (0, 1)


def test_dp_keeps_short_prompts_out_of_a_long_prompts_batch(analytical):
    # per-input-token latency: short prompts must not wait ~10 s behind a 180k-token one,
    # and the long one still gets sequence parallelism
    plan = plan_prefill([180_000, 500, 400, 300], [210_000] * 4, analytical.predict_s)
    assert plan is not None and len(plan.batches) >= 2
    assert plan.batches[0].requests == (0,) and len(plan.batches[0].instances) >= 2


# -- the pause rule ----------------------------------------------------------------------
@pytest.mark.parametrize(("t_idle", "t_lent", "inv", "size", "out"), [
    (2.0, 1.0, 0.01, 10, 10_000),    # speedup 0.01 vs slowdown 0.01: equal, pauses
    (2.0, 1.0, 0.01, 10, 9_999),     # slowdown a hair larger: keeps decoding
    (2.0, 1.0, 0.0101, 10, 10_000),  # speedup a hair larger: pauses
    (5.0, 4.9, 1e-5, 1, 100),
    (0.3, 0.1, 2e-3, 4, 3_000),
])
def test_pause_fires_exactly_when_speedup_reaches_slowdown(t_idle, t_lent, inv, size, out):
    speedup = prefill_speedup_s(t_idle, t_lent, inv)
    slowdown = decode_slowdown_s(t_lent, size, out)
    assert should_pause(t_idle, t_lent, inv, size, out) == (speedup >= slowdown)


def test_pause_always_when_no_instance_is_idle():
    assert should_pause(math.inf, 1.0, 1e-9, 1000, 1)


def test_pause_rule_boundary_on_random_cases():
    rng = np.random.default_rng(3)
    for _ in range(500):
        t_lent = float(rng.uniform(0.01, 10))
        t_idle = t_lent + float(rng.uniform(0, 10))
        inv, size, out = float(rng.uniform(1e-6, 0.1)), int(rng.integers(1, 64)), int(
            rng.integers(1, 50_000))
        expect = (t_idle - t_lent) * inv >= t_lent * size * size / out
        assert should_pause(t_idle, t_lent, inv, size, out) == expect


# -- scale-down placement ------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(20))
def test_scale_down_places_every_token_exactly_once(seed):
    rng = np.random.default_rng(seed)
    cap = 1000
    used = [int(x) for x in rng.integers(0, cap, int(rng.integers(1, 5)))]
    room = sum(cap - u for u in used)
    lengths = [int(x) for x in rng.integers(1, 400, int(rng.integers(1, 6)))]
    if sum(lengths) > room:
        with pytest.raises(ValueError, match="do not fit"):
            place_scaled_down(lengths, used, cap)
        return
    placement = place_scaled_down(lengths, used, cap)
    assert [sum(w.values()) for w in placement] == lengths
    after = list(used)
    for where in placement:
        for i, n in where.items():
            assert n > 0
            after[i] += n
    assert all(a <= cap for a in after)
    # proactive scale-down: the fewest instances, filled most-used first
    touched = {i for w in placement for i in w}
    order = sorted(range(len(used)), key=lambda i: (-used[i], i))
    assert touched == set(order[:len(touched)])


# -- costs -----------------------------------------------------------------------------------
def test_migration_cost_grows_with_tokens(cost):
    times = [cost.migration_s(n) for n in (0, 1, 1_000, 10_000, 100_000)]
    assert times[0] == 0.0
    assert all(a < b for a, b in zip(times, times[1:], strict=False))


def test_sequence_parallel_prefill_speeds_up_long_prompts_not_short_ones(cost):
    long = [cost.prefill_s([200_000], k) for k in (1, 2, 4)]
    assert long[0] > long[1] > long[2]
    assert long[0] / long[2] > 3.0  # attention dominates: near-linear scaling
    short = [cost.prefill_s([100], k) for k in (1, 4)]
    assert short[1] >= 0.8 * short[0]  # overheads dominate: no gain worth lending for


def test_ring_exchange_is_priced_and_hidden_behind_attention(cost):
    assert cost.ring_s(100_000, 4) > cost.ring_s(100_000, 2) > 0
    # the ring of a long prefill hides under its attention: the cost is compute alone
    chunks = [(50_000, 25_000)]
    assert cost.prefill_s([100_000], 2) == pytest.approx(cost.step.step_time_s(chunks, 0, 0))


def test_spread_kv_decodes_faster_than_one_instance_for_long_contexts(cost):
    one = cost.decode_s(64, [DecodeShard(64, 4_000_000)], 1)
    four = cost.decode_s(64, [DecodeShard(64, 1_000_000)] * 4, 1)
    assert four < one
    assert cost.decode_s(1, [DecodeShard(1, 100)] * 2, 1) > cost.decode_s(
        1, [DecodeShard(1, 100)], 1)  # the exchange costs something


def test_analytical_fit_tracks_the_cost_model(analytical):
    assert analytical.mean_rel_error < 0.10  # the artifact's bar for its own fit
    assert analytical.predict_s(4, 1e5, 1e10) < analytical.predict_s(1, 1e5, 1e10)


# -- the engine --------------------------------------------------------------------------
def _requests(seed: int, n: int = 60) -> list[EspRequest]:
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(2.0, n))
    prompt = np.exp(rng.uniform(np.log(50), np.log(120_000), n)).astype(int)
    out = rng.integers(2, 300, n)
    return [EspRequest(id=i, arrival_s=float(arrival[i]), num_prompt_tokens=int(prompt[i]),
                       num_output_tokens=int(out[i])) for i in range(n)]


def _run(cost, analytical, **kw):
    reqs = _requests(kw.pop("seed", 0), kw.pop("n", 60))
    engine = EspEngine(EspConfig(debug=True, **kw), cost, analytical)
    engine.run(reqs)
    return reqs, engine


def test_engine_serves_every_request_with_its_ledger_checked(cost, analytical):
    reqs, engine = _run(cost, analytical)
    for r in reqs:
        assert r.finish_s is not None and r.first_token_s is not None
        assert r.arrival_s <= r.first_scheduled_s <= r.first_token_s <= r.finish_s
        assert r.num_emitted == r.num_output_tokens and not r.kv
    assert engine.gang.used == [0] * 4
    assert engine.stats.num_prefill_batches >= engine.stats.num_prefill_iterations > 0
    assert len(engine.stats.dop_histogram) > 1  # the DoP really varies


def test_engine_is_deterministic(cost, analytical):
    a, ea = _run(cost, analytical, seed=5)
    b, eb = _run(cost, analytical, seed=5)
    assert [(r.first_token_s, r.finish_s) for r in a] == [(r.first_token_s, r.finish_s)
                                                          for r in b]
    assert ea.stats == eb.stats


def test_decode_scales_up_when_its_instances_are_full(cost, analytical):
    # the prompt fills two instances exactly (scale-down keeps it there, releasing the other
    # two); the first decode token needs a third instance
    req = EspRequest(id=0, arrival_s=0.0, num_prompt_tokens=120_000, num_output_tokens=50)
    engine = EspEngine(EspConfig(max_tokens_per_instance=60_000, debug=True), cost,
                       analytical)
    engine.run([req])
    assert req.finish_s is not None and engine.stats.num_scale_ups == 1
    # prefilled on all four, kept on two (proactive scale-down), decoded on three
    assert engine.stats.dop_histogram == {4: 1}


def test_tight_memory_runs_clean(cost, analytical):
    reqs, engine = _run(cost, analytical, max_tokens_per_instance=60_000, seed=2, n=40)
    assert all(r.finish_s is not None for r in reqs)
    assert engine.gang.used == [0] * 4


def test_elastic_beats_fixed_parallelism_on_a_mixed_load(cost, analytical):
    def mean_per_token(elastic: bool) -> float:
        reqs, _ = _run(cost, analytical, elastic=elastic, seed=1, n=80)
        return float(np.mean([(r.finish_s - r.arrival_s) / (r.num_prompt_tokens
                                                             + r.num_output_tokens)
                              for r in reqs]))
    assert mean_per_token(True) < mean_per_token(False)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"num_instances": 0}, "num_instances must be >= 1"),
    ({"max_prefill_s": 0.0}, "max_prefill_s and avg_decoding_s must be > 0"),
    ({"max_out_of_order": -1}, "max_wait_steps and max_out_of_order must be >= 0"),
])
def test_bad_config_names_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        EspConfig(**kwargs)


def test_a_request_larger_than_the_gang_is_refused(cost, analytical):
    engine = EspEngine(EspConfig(max_tokens_per_instance=1000), cost, analytical)
    with pytest.raises(ValueError, match="exceed the gang's 4000"):
        engine.run([EspRequest(id=0, arrival_s=0.0, num_prompt_tokens=3990,
                               num_output_tokens=20)])


# -- the Zipf mixes and the ablation's metric (repro loongserve) -------------------------
def test_zipf_mix_picks_the_nearest_pooled_length():
    from fleetsim.repro.loongserve_workload import lengths
    rng = np.random.default_rng(0)
    pool_rng = np.random.default_rng(0)
    prompt, out = lengths("zipf1.2", 2000, rng)
    pooled = np.concatenate([lengths(d, 6000, pool_rng)[0]
                             for d in ("sharegpt", "leval", "lv-eval")])
    assert set(prompt.tolist()) <= set(pooled.tolist())  # real pooled requests only
    assert np.median(prompt) < 1000 < np.percentile(prompt, 99)  # Zipf: short, long tail
    steeper, _ = lengths("zipf1.4", 2000, np.random.default_rng(0))
    assert np.mean(steeper) < np.mean(prompt)
    with pytest.raises(ValueError, match="unknown dataset 'alpaca'"):
        lengths("alpaca", 10, rng)


def test_ablation_attainment_and_its_crossing():
    from fleetsim.repro.loongserve_ablation import attainment, max_rate_at_attainment

    class Flat:  # standalone prefill of 1 s whatever the prompt
        @staticmethod
        def predict_s(k, s1, s2):
            return 1.0

    def req(ttft, tpot, out=11):
        return EspRequest(id=0, arrival_s=0.0, num_prompt_tokens=100, num_output_tokens=out,
                          first_token_s=ttft, finish_s=ttft + tpot * (out - 1))
    # TTFT bound max(25 x 1 s, 15 s) = 25 s; TPOT bound 50 ms
    reqs = [req(24.0, 0.04), req(26.0, 0.04), req(1.0, 0.06), req(1.0, 0.0, out=1)]
    assert attainment(reqs, Flat()) == 0.5
    assert max_rate_at_attainment((1, 2, 3), (1.0, 0.95, 0.85)) == pytest.approx(2.5)
    assert max_rate_at_attainment((1, 2), (0.95, 0.92)) == 2  # a lower bound
    assert max_rate_at_attainment((1, 2), (0.5, 0.4)) is None
