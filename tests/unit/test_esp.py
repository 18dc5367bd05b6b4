"""Elastic sequence parallelism (fleetsim.esp, LoongServe): the prefill DP against brute force,
the pause rule at its boundary, scale-down placement, migration and ESP costs, the ESP step
model, and LoongServe as a group planner on the one engine (invariants, fast-forward equal to
stepping, determinism, the config section's bad input)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fleetsim.esp import (
    DecodeShard,
    EspConfig,
    EspCostModel,
    EspStepModel,
    dp,
    fit_analytical,
    plan_objective,
    plan_prefill,
)
from fleetsim.esp.admission import Reservation, reservation_fits
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


@pytest.fixture(params=["scalar", "numpy"])
def dp_path(request, monkeypatch):
    """Both implementations of the DP: plain floats (a few requests) and numpy (more)."""
    if request.param == "numpy":
        monkeypatch.setattr(dp, "SCALAR_MAX_REQUESTS", 0)
    return request.param


@pytest.mark.parametrize("seed", range(12))
def test_prefill_dp_is_optimal_against_brute_force(seed, analytical, dp_path):
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


def test_prefill_dp_in_plain_floats_is_numpys_to_the_bit(analytical, monkeypatch):
    """The scalar DP returns numpy's plan and objective bit for bit, for a few requests
    (where the interpreted build uses it) and for more (where the compiled one does), ties
    (equal lengths, equal free slots) and plans that do not fit included."""
    rng = np.random.default_rng(11)
    cases = []
    for at in range(300):
        n = int(rng.integers(1, 7)) if at < 240 else int(rng.integers(7, 33))
        k = int(rng.integers(1, 6))
        pool = [int(x) for x in np.exp(rng.uniform(np.log(20), np.log(200_000), 3))]
        lengths = sorted((pool[int(i)] for i in rng.integers(0, 3, n)), reverse=True)
        free = [int(rng.choice([30_000, 80_000, 210_000])) for _ in range(k)]
        cases.append((lengths, free))
    monkeypatch.setattr(dp, "SCALAR_MAX_REQUESTS", 1 << 30)
    scalar = [plan_prefill(lengths, free, analytical.predict_s) for lengths, free in cases]
    monkeypatch.setattr(dp, "SCALAR_MAX_REQUESTS", 0)
    vector = [plan_prefill(lengths, free, analytical.predict_s) for lengths, free in cases]
    assert scalar == vector
    assert sum(p is None for p in scalar) > 10 and sum(p is not None for p in scalar) > 100
    # The coefficients read once for the most instances (as the planner passes them) give
    # the same plans, on both paths.
    once = dp.coefficients_of(analytical.predict_s, 5)
    assert [plan_prefill(lengths, free, analytical.predict_s, once)
            for lengths, free in cases] == vector
    monkeypatch.setattr(dp, "SCALAR_MAX_REQUESTS", 1 << 30)
    assert [plan_prefill(lengths, free, analytical.predict_s, once)
            for lengths, free in cases] == scalar
    with pytest.raises(ValueError, match="coefficients for 2 instances, the plan has 3"):
        plan_prefill([100], [1_000] * 3, analytical.predict_s, once[:3])


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


def test_analytical_fit_grows_with_the_tokens_where_it_says_so(analytical):
    """``grows(k)`` licenses the refill's shortcut (the shortest request too slow alone means
    every request is): where it holds, a longer batch is never predicted faster."""
    rng = np.random.default_rng(3)
    for k in range(1, 6):
        if not analytical.grows(k):
            continue
        lengths = np.sort(rng.integers(1, 500_000, 200))
        times = [analytical.predict_s(k, int(x), int(x) * int(x)) for x in lengths]
        assert times == sorted(times), k
    assert analytical.grows(4) and not analytical.grows(0)


def test_the_fit_is_reused_by_runs_of_one_layout_and_not_across_layouts():
    from fleetsim.policies import esp as planner

    planner._FITS.clear()
    first = _esp_run(n=4).summary["group"]["analytical_model_mean_rel_error"]
    assert len(planner._FITS) == 1
    fit = next(iter(planner._FITS.values()))
    again = _esp_run(n=4, seed=1).summary["group"]["analytical_model_mean_rel_error"]
    assert len(planner._FITS) == 1 and next(iter(planner._FITS.values())) is fit
    assert again == first
    _esp_run(n=4, capacity=120_000)  # another KV capacity per instance: another fit
    assert len(planner._FITS) == 2


# -- LightLLM's KV reservation -----------------------------------------------------------------
def _lightllm_fits(entries, capacity):
    """LightLLM's check as its ``router/req_queue.py`` computes it: numpy,
    a stable sort by remaining output, most first, and the peak of the cumulative need."""
    if not entries:
        return True
    arr = np.asarray(entries, dtype=np.int64)
    order = np.argsort(-arr[:, 1], kind="stable")
    need = arr[order, 1] * np.arange(1, len(arr) + 1) + np.cumsum(arr[order, 0])
    return bool(need.max() <= capacity)


def test_incremental_reservation_answers_as_the_sort():
    """``Reservation`` (prefix/suffix tables, entries added as a walk takes them) gives
    ``reservation_fits``'s answer for every candidate, ties in remaining output included, and
    both give LightLLM's numpy check's."""
    rng = np.random.default_rng(7)
    num_true = num_false = num_past_bound = 0
    for _ in range(400):
        entries = [(int(u), int(r)) for u, r in zip(rng.integers(0, 50, rng.integers(0, 12)),
                                                  rng.integers(-1, 6, 12), strict=False)]
        capacity = int(rng.integers(0, 300))
        reserved, kept = Reservation(list(entries), capacity), list(entries)
        for _ in range(8):
            entry = (int(rng.integers(0, 50)), int(rng.integers(-1, 6)))
            if rng.random() < 0.3:  # taken without a check first
                reserved.add(entry)
                kept.append(entry)
                continue
            fits = reserved.fits(entry)
            assert fits == reservation_fits(kept + [entry], capacity), (kept, entry, capacity)
            assert fits == _lightllm_fits(kept + [entry], capacity), (kept, entry, capacity)
            num_true, num_false = num_true + fits, num_false + (not fits)
            # fits, though the order-free bound (positive used and rem summed) does not
            num_past_bound += fits and sum(max(u, 0) + max(r, 0)
                                           for u, r in kept + [entry]) > capacity
            if fits:
                reserved.add(entry)
                kept.append(entry)
    assert num_true > 100 and num_false > 100  # both answers exercised
    assert num_past_bound > 50, num_past_bound  # and the exact check behind the bound


# -- the ESP step model (a member of k instances) -------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_step_model_prices_prefill_and_decode_as_the_cost_model(cost, k):
    step = EspStepModel(cost, k, 128)
    assert step.step_time_s([(40_000, 0), (900, 0)], 0, 0) == cost.prefill_s([40_000, 900], k)
    for n, kv in ((1, 5_000), (64, 2_000_000), (300, 9_000_000)):
        masters = max(1, min(k, n // 128))
        spread = cost.decode_s(n, [DecodeShard(n, kv // k)] * k, masters)
        assert step.step_time_s((), n, kv) == pytest.approx(spread, rel=1e-9)
        # what fast-forward windows add up is the step, bit for bit
        base, per_kv, extra = step.decode_terms_s(n)
        assert step.step_time_s((), n, kv) == (base + per_kv * float(kv)) + extra
        arr = step.decode_step_times_s(n, np.array([kv], dtype=np.int64))
        assert float(arr[0]) == step.step_time_s((), n, kv)


def test_a_chunk_with_context_costs_more_than_without(cost):
    step = EspStepModel(cost, 4, 128)
    assert step.step_time_s([(10_000, 50_000)], 0, 0) > step.step_time_s([(10_000, 0)], 0, 0)


# -- LoongServe on the one engine: the esp group planner -------------------------------------
def _esp_run(*, elastic=True, seed=0, n=50, capacity=210_000, fast_forward=True,
             prompts=None, outputs=None, arrival=None, **planner_args):
    from fleetsim.config import config_from_dict
    from fleetsim.repro.loongserve_ablation import group_config
    from fleetsim.run import run
    from fleetsim.workloads import Workload

    rng = np.random.default_rng(seed)
    if prompts is None:
        prompts = np.exp(rng.uniform(np.log(50), np.log(120_000), n)).astype(np.int64)
        outputs = rng.integers(2, 300, n)
    if arrival is None:
        arrival = np.cumsum(rng.exponential(2.0, len(prompts)))
    cfg = group_config("lwm-text-1m", "a100", 2, 4, elastic=elastic, max_running=1024,
                       max_out_of_order=4)
    cfg["engine"] |= {"num_kv_blocks": capacity // 16, "debug": True,
                      "fast_forward": fast_forward}
    cfg["group"]["planner"]["args"] |= planner_args
    wl = Workload(arrival_s=arrival, num_prompt_tokens=np.asarray(prompts, dtype=np.int64),
                  num_output_tokens=np.asarray(outputs, dtype=np.int64))
    return run(config_from_dict(cfg), workload=wl)


def _columns(result):
    r = result.records.requests
    order = np.argsort(r["request_id"])
    return {c: r[c][order] for c in ("first_scheduled_s", "first_token_s", "finish_s",
                                      "replica_id", "num_preemptions")}


def test_esp_group_serves_everyone_with_a_varying_degree():
    result = _esp_run()
    r = result.records.requests
    assert len(r["request_id"]) == 50
    assert np.all(r["arrival_s"] <= r["first_scheduled_s"])
    assert np.all(r["first_scheduled_s"] <= r["first_token_s"])
    assert np.all(r["first_token_s"] <= r["finish_s"])
    group = result.summary["group"]
    assert group["num_regroups"] > 0 and group["num_prefill_batches"] > 0
    assert len(group["dop_histogram"]) > 1  # the degree of parallelism really varies
    assert group["analytical_model_mean_rel_error"] < 0.10


def test_esp_group_fast_forward_equals_stepping_and_is_deterministic():
    fast, again, slow = _esp_run(seed=5), _esp_run(seed=5), _esp_run(seed=5,
                                                                      fast_forward=False)
    for col, values in _columns(fast).items():
        assert np.array_equal(values, _columns(slow)[col]), col
        assert np.array_equal(values, _columns(again)[col]), col


@pytest.mark.parametrize("elastic", [True, False])
def test_polls_left_out_during_a_prefill_change_nothing(monkeypatch, elastic):
    """While every busy member is in one prefill step (or, with the queue empty, decodes
    in a step whose end keeps its scaling), the planner names its next wake at that step's
    end rather than every ``max_wait_steps`` iterations: the same records and summary as
    polling throughout (in both engines' orders: fast-forward and stepping), with far fewer
    plans; with ESP and without (one member of every instance)."""
    from fleetsim.policies import esp
    from fleetsim.policies.esp import EspPlanner
    from fleetsim.policies.esp_steps import plan_step

    calls = {"plans": 0}
    plan = EspPlanner.plan

    def counted(self, view, now_s):
        calls["plans"] += 1
        return plan(self, view, now_s)

    monkeypatch.setattr(EspPlanner, "plan", counted)
    rng = np.random.default_rng(4)  # a third long prompts (prefills of seconds), the rest short
    prompts = np.where(rng.random(40) < 0.3, rng.integers(100_000, 300_000, 40),
                       rng.integers(200, 4000, 40))
    outputs, arrival = rng.integers(2, 200, 40), np.cumsum(rng.exponential(1.5, 40))
    runs = {}
    for skip in (True, False):
        if not skip:
            monkeypatch.setattr(esp, "plan_leaving_out_polls", plan_step)  # poll throughout
        for fast in (True, False):
            calls["plans"] = 0
            result = _esp_run(prompts=prompts, outputs=outputs, arrival=arrival,
                              fast_forward=fast, elastic=elastic)
            runs[skip, fast] = (_columns(result), result.summary, calls["plans"])
    for fast in (True, False):
        skipped, polled = runs[True, fast], runs[False, fast]
        for col, values in skipped[0].items():
            assert np.array_equal(values, polled[0][col]), col
        assert skipped[1] == polled[1]
        assert skipped[2] < 0.7 * polled[2]  # polls really were left out


class _StepsView:
    """A group of a prefilling member 0 (its step ends at 10 s) and a decoding member 1 on
    one instance, whose KV holds ``fewest`` blocks now and may reach ``most`` by its step's
    end (at 20 s), 100 blocks per instance."""

    num_kv_blocks_per_instance, block_size = 100, 16
    instances_by_member = ((0,), (1,))

    def __init__(self, most, fewest=90):
        self.most, self.fewest = most, fewest

    def member_step_end_s(self, m):
        return (10.0, 20.0)[m]

    def member_used_blocks_range(self, m):
        return (self.fewest, self.fewest + 5)

    def member_used_blocks_at_step_end(self, m):
        return self.most


@pytest.mark.parametrize(("most", "fewest", "walked", "skips"), [
    (99, 90, False, True), (101, 90, False, False), (99, 90, True, False),
    (150, 110, False, False)])  # needs two instances at both ends, has one: a merge may come
def test_polls_are_left_out_beside_a_decode_only_while_its_scaling_cannot_change(
        most, fewest, walked, skips):
    """Beside a decoding member, polls are left out only while its KV stays within the
    instances it has until its step ends (the bounds now and at the end give the count it
    has) and the refill failed before walking the running requests' reservations."""
    from fleetsim.policies.esp import EspPlanner
    from fleetsim.policies.esp_steps import skip_polls

    planner = EspPlanner()
    planner.state.refill_walked = walked
    wake_s = skip_polls(planner.state, _StepsView(most, fewest), [True, True], [True, False],
                        [[object()], [object()]], 1.0)
    assert (wake_s > 10.0) == skips and wake_s >= 1.0
    assert (planner.state.skipped is not None) == skips


def test_a_long_decode_keeps_two_full_instances_plus_room_to_grow():
    # the prompt fills two instances exactly: prefilled wide, kept on three (its KV and the
    # next iterations' tokens), never preempted
    result = _esp_run(capacity=60_000, prompts=[120_000], outputs=[50])
    r = result.records.requests
    assert r["num_preemptions"][0] == 0 and np.isfinite(r["finish_s"][0])
    assert result.summary["group"]["dop_histogram"] == {4: 1}


@pytest.mark.parametrize("refill", [True, False])
def test_idle_instances_are_refilled_during_a_long_prefill(refill):
    """A 150k-token prompt prefills on three instances beside a short decode on the fourth
    (admitted narrow: a finished request's long output makes the decodes' expected wait
    long); the decode ends, and a short request arriving then prefills on the freed instance
    at once (the code's greedy refill) instead of waiting for the long prefill to end."""
    result = _esp_run(prompts=[100, 1_000, 150_000, 500], outputs=[1000, 150, 2, 5],
                      arrival=np.array([0.0, 11.0, 11.5, 13.5]), refill_idle=refill)
    r = result.records.requests
    first = dict(zip(r["request_id"].tolist(), r["first_token_s"].tolist(), strict=True))
    finish = dict(zip(r["request_id"].tolist(), r["finish_s"].tolist(), strict=True))
    assert finish[1] < 13.5 < first[2]  # the setting: the decode is done, the long prefill not
    assert (first[3] < first[2]) == refill
    assert result.summary["group"]["num_refills"] == (1 if refill else 0)


def test_a_decode_outgrowing_its_instance_merges_when_none_is_idle():
    """A 59k-token prompt decodes on one 60k-token instance while a 150k-token prompt holds
    the other three; when the decode's KV outgrows its instance and no instance is idle it
    merges into the long prompt's member (the four instances hold both), rather than
    preempting itself and waiting for ever (an empty plan, PlanError, before the fix)."""
    result = _esp_run(capacity=60_000, prompts=[59_000, 150_000, 300, 500],
                      outputs=[3000, 20, 5, 5], arrival=np.array([0.0, 3.0, 4.0, 5.0]))
    r = result.records.requests
    assert np.all(np.isfinite(r["finish_s"])) and len(r["request_id"]) == 4
    assert r["num_preemptions"].sum() == 0
    assert result.summary["group"]["num_merges"] >= 1


@pytest.mark.parametrize("seed", [*range(8), 36])
def test_prompts_around_an_instance_finish_or_fail_as_the_engine_does(seed):
    """Prompts and outputs drawn around one instance's KV (60k tokens, the group 240k): every
    request finishes, or the run stops before it starts with the engine's one-line input
    error for a request larger than the whole group (``run.check_fits``), never PlanError
    (seeds 1 and 36 raised it before decodes could merge for room)."""
    from fleetsim.errors import FleetsimInputError

    rng = np.random.default_rng(seed)
    prompts, outputs = rng.integers(20_000, 150_000, 5), rng.integers(2, 4000, 5)
    arrival = np.cumsum(rng.exponential(3.0, 5))
    if seed == 7:
        prompts[2] = 250_000  # past the whole group
    if np.max(prompts + outputs) > 240_000:
        with pytest.raises(FleetsimInputError, match="holds only 15000 blocks"):
            _esp_run(capacity=60_000, prompts=prompts, outputs=outputs, arrival=arrival)
        return
    result = _esp_run(capacity=60_000, prompts=prompts, outputs=outputs, arrival=arrival)
    r = result.records.requests
    assert len(r["request_id"]) == 5 and np.all(np.isfinite(r["finish_s"]))


def test_tight_memory_runs_clean():
    result = _esp_run(capacity=60_000, seed=2, n=40)
    assert len(result.records.requests["request_id"]) == 40


def test_elastic_beats_fixed_parallelism_on_a_mixed_load():
    # the reproduction's Mixed lengths (ShareGPT, L-Eval, LV-Eval) at 0.3 req/s, where the
    # fixed degree queues short requests behind long prefills
    from fleetsim.workloads.long_context import workload

    wl = workload("mixed", 60, 0.3, seed=0)

    def mean_per_token(elastic: bool) -> float:
        r = _esp_run(elastic=elastic, prompts=wl.num_prompt_tokens,
                     outputs=wl.num_output_tokens, arrival=wl.arrival_s).records.requests
        return float(np.mean((r["finish_s"] - r["arrival_s"])
                             / (r["num_prompt_tokens"] + r["num_output_tokens"])))
    assert mean_per_token(True) < 0.8 * mean_per_token(False)


def test_without_esp_the_group_is_one_member_of_every_instance():
    result = _esp_run(elastic=False, n=30)
    assert set(result.records.requests["replica_id"].tolist()) == {0}
    assert result.summary["group"]["dop_histogram"] == {
        4: result.summary["group"]["num_prefill_batches"]}


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"max_running": 0}, "max_running must be >= 1"),
    ({"max_prefill_s": 0.0}, "max_prefill_s and avg_decoding_s must be > 0"),
    ({"max_out_of_order": -1}, "max_wait_steps and max_out_of_order must be >= 0"),
    # a poll period below a microsecond stalled the planner's skip loop (found by the
    # hostile-inputs property test drawing 1e-300)
    ({"avg_decoding_s": 1e-300}, "avg_decoding_s must be >= 1e-06 s"),
    ({"avg_decoding_s": 5e-7}, "avg_decoding_s must be >= 1e-06 s"),
])
def test_bad_config_names_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        EspConfig(**kwargs)


@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "group.step_model=tp"], "group.step_model must be one of esp"),
    (["--set", "group.min_compute_bound_batch=0"], "min_compute_bound_batch"),
    (["--set", "group.planner={name='esp', args={max_prefill_s=0}}"], "max_prefill_s"),
    (["--set", "group.planner={name='esp', args={avg_decoding_s=1e-300}}"], "avg_decoding_s"),
    (["--set", "group.planner={name='espy'}"], "known policies"),
    (["--set", "group.planner={name='esp'}", "--set", "programs.rate_per_s=1"], "group needs"),
])
def test_bad_group_section_is_one_line_exit_2(tmp_path, capsys, args, needle):
    from fleetsim.cli import main
    code = main(["run", "--out", str(tmp_path / "o"), "--set", "model=lwm-text-1m",
                 "--set", "hardware.gpu=a100", "--set", "hardware.tp=2",
                 "--set", "hardware.num_replicas=4", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


# -- the Zipf mixes and the ablation's metric (repro loongserve) -------------------------
def test_zipf_mix_picks_the_nearest_pooled_length():
    from fleetsim.workloads.long_context import lengths
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
    from fleetsim.metrics.slo import crossing_rate
    from fleetsim.repro.loongserve_ablation import ATTAINMENT, ablation_attainment

    def max_rate_at_attainment(rates, values):
        return crossing_rate(rates, values, ATTAINMENT, rising=False)

    class Flat:  # standalone prefill of 1 s whatever the prompt
        @staticmethod
        def predict_s(k, s1, s2):
            return 1.0

    # TTFT bound max(25 x 1 s, 15 s) = 25 s; TPOT bound 50 ms
    rows = [(24.0, 0.04, 11), (26.0, 0.04, 11), (1.0, 0.06, 11), (1.0, 0.0, 1)]
    columns = {"arrival_s": [0.0] * 4, "first_token_s": [t for t, _, _ in rows],
               "finish_s": [t + tpot * (o - 1) for t, tpot, o in rows],
               "num_prompt_tokens": [100] * 4, "num_output_tokens": [o for _, _, o in rows]}
    assert ablation_attainment(columns, Flat()) == 0.5
    assert max_rate_at_attainment((1, 2, 3), (1.0, 0.95, 0.85)) == pytest.approx(2.5)
    assert max_rate_at_attainment((1, 2), (0.95, 0.92)) == 2  # a lower bound
    assert max_rate_at_attainment((1, 2), (0.5, 0.4)) is None


def test_the_example_runs_from_fleetsim_run(tmp_path, capsys):
    """``[group]`` is reachable from the command line: examples/loongserve.toml runs, and the
    summary says what the planner did."""
    import json
    from pathlib import Path

    from fleetsim.cli import main

    example = Path(__file__).resolve().parents[2] / "examples" / "loongserve.toml"
    out = tmp_path / "o"
    code = main(["run", str(example), "--out", str(out), "--set", "workload.num_requests=12"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 12
    assert summary["group"]["num_prefill_batches"] >= 1
    assert json.loads((out / "config.json").read_text())["group"]["planner"]["name"] == "esp"
