"""Invariants every policy, workload and KV capacity must keep (debug checks on)."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tests.conftest import make_workload, simulate

from fleetsim.perf.base import LinearStepModel
from fleetsim.policies import (
    BATCH_POLICIES,
    ORDERING_POLICIES,
    PolicySpec,
    make_batch_policy,
)
from fleetsim.serving.speculative import Emission

# Every registered batching policy with its default args, plus the argument variants that
# change its behaviour: new registrations are covered without editing this list.
POLICY_SPECS = sorted(
    [(name, ()) for name in BATCH_POLICIES]
    + [("token_budget", (("enable_chunked_prefill", False),)),
       ("token_budget", (("long_prefill_token_threshold", 24),)),
       ("serve_best", (("max_serving", 3), ("ordering", "priority"))),
       ("agent_xpu", (("chunk_tokens", 16), ("preemptive", False))),
       ("agent_xpu", (("chunk_tokens", 40), ("reactive_slack", 0.0)))])


def _policy(spec):
    name, args = spec
    return make_batch_policy(PolicySpec(name=name, args=dict(args)))

BLOCK = 16
HASH_BLOCK = 32


@st.composite
def workloads(draw, max_requests=25):
    n = draw(st.integers(1, max_requests))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    prefixes = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    # Prefix-chained hash ids: requests with the same family share leading blocks.
    hash_ids = [[prefix * 1000 + j for j in range(-(-p // HASH_BLOCK))]
                for p, prefix in zip(prompts, prefixes, strict=True)]
    priority = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return make_workload(np.cumsum(gaps), prompts, outputs, hash_ids=hash_ids,
                         hash_block_tokens=HASH_BLOCK, priority=priority)


def _fits(workload, kv_blocks):
    total = workload.num_prompt_tokens + workload.num_output_tokens
    return bool((-(-total // BLOCK) <= kv_blocks).all())


MODEL = LinearStepModel(0.01, 1e-4, 1e-6)
common = {"step_model": MODEL, "block_size": BLOCK}


@settings(max_examples=150, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(4, 64),
       ordering=st.sampled_from(sorted(ORDERING_POLICIES)),
       budget=st.sampled_from([16, 64, 512]), max_running=st.integers(1, 8),
       spec=st.sampled_from(POLICY_SPECS))
def test_tokens_conserved_kv_never_overcommitted_all_finish(
        workload, kv_blocks, ordering, budget, max_running, spec):
    assume(_fits(workload, kv_blocks))
    policy = _policy(spec)
    longest = int((workload.num_prompt_tokens + workload.num_output_tokens).max())
    assume(policy.splits_prompts or longest <= budget)
    rec, replica = simulate(workload, kv_blocks=kv_blocks, ordering=ordering,
                            max_batched_tokens=budget, max_running=max_running,
                            batch_policy=policy, debug=True, **common)
    r = rec.requests
    assert len(r["request_id"]) == len(workload)  # unbounded run: everyone finishes
    order = np.argsort(r["request_id"])
    assert (r["num_output_tokens"][order] == workload.num_output_tokens).all()
    assert (r["num_computed_tokens"] == r["num_prompt_tokens"] - r["num_prefix_hit_tokens"]
            + r["num_output_tokens"] - 1 + r["num_recomputed_tokens"]).all()
    assert rec.timeline["num_tokens"].sum() == r["num_computed_tokens"].sum()
    assert (rec.timeline["num_used_blocks"] <= kv_blocks).all()
    assert (rec.timeline["num_tokens"] <= budget * rec.timeline["num_steps"]).all()
    assert np.all(np.diff(rec.timeline["end_s"]) >= 0)  # time never decreases
    assert replica.kv.num_used_blocks == 0


@settings(max_examples=120, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(6, 64),
       ordering=st.sampled_from(sorted(ORDERING_POLICIES)), max_running=st.integers(1, 8),
       stop_at_arrivals=st.booleans(), spec=st.sampled_from(POLICY_SPECS))
def test_fast_forward_equals_step_by_step(workload, kv_blocks, ordering, max_running,
                                          stop_at_arrivals, spec):
    """For every registered batching policy: windows that stop at arrivals, and windows cut
    back when one comes, both give exactly the step-by-step results (debug checks on, so a
    policy's declared capabilities are checked too)."""
    assume(_fits(workload, kv_blocks))
    splits = _policy(spec).splits_prompts
    if not splits:
        assume(int((workload.num_prompt_tokens + workload.num_output_tokens).max()) <= 512)
    kw = dict(kv_blocks=kv_blocks, ordering=ordering, max_running=max_running,
              max_batched_tokens=128 if splits else 512, **common)
    slow, _ = simulate(workload, fast_forward=False, batch_policy=_policy(spec), **kw)
    fast, _ = simulate(workload, fast_forward=True, windows_stop_at_arrivals=stop_at_arrivals,
                       batch_policy=_policy(spec), **kw)
    for col, values in slow.requests.items():  # ITL columns included (last_token_s, p99, max)
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    # every gap between output tokens, pooled
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert np.array_equal(slow.itl_counts, fast.itl_counts)
    assert slow.num_steps == fast.num_steps
    assert np.isclose(slow.kv_block_seconds_by_replica[0], fast.kv_block_seconds_by_replica[0],
                      rtol=1e-9)
    assert np.isclose(slow.busy_s_by_replica[0], fast.busy_s_by_replica[0], rtol=1e-9)


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(8, 64))
def test_strict_fcfs_never_starts_a_later_arrival_first(workload, kv_blocks):
    assume(_fits(workload, kv_blocks))
    rec, _ = simulate(workload, kv_blocks=kv_blocks, ordering="fcfs", max_batched_tokens=64,
                      max_running=3, **common)
    r = rec.requests
    order = np.lexsort((r["request_id"], r["arrival_s"]))
    assert np.all(np.diff(r["first_scheduled_s"][order]) >= 0)


@settings(max_examples=30, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(8, 64))
def test_same_inputs_give_identical_results(workload, kv_blocks):
    assume(_fits(workload, kv_blocks))
    a, _ = simulate(workload, kv_blocks=kv_blocks, **common)
    b, _ = simulate(workload, kv_blocks=kv_blocks, **common)
    for col, values in a.requests.items():
        assert np.array_equal(values, b.requests[col], equal_nan=True)


class _VectorOnlyModel:
    """A step model without ``decode_terms_s``: windows take the numpy path."""

    def __init__(self, inner):
        self.inner = inner

    def step_time_s(self, prefill_chunks, num_decode, decode_kv_tokens):
        return self.inner.step_time_s(prefill_chunks, num_decode, decode_kv_tokens)

    def decode_step_times_s(self, num_decode, decode_kv_tokens):
        return self.inner.decode_step_times_s(num_decode, decode_kv_tokens)


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(6, 64), stop_at_arrivals=st.booleans())
def test_fast_forward_is_exact_for_models_with_only_vectorized_decode(
        workload, kv_blocks, stop_at_arrivals):
    assume(_fits(workload, kv_blocks))
    kw = dict(kv_blocks=kv_blocks, max_running=6, max_batched_tokens=128,
              step_model=_VectorOnlyModel(MODEL), block_size=BLOCK)
    slow, _ = simulate(workload, fast_forward=False, **kw)
    fast, _ = simulate(workload, fast_forward=True, windows_stop_at_arrivals=stop_at_arrivals,
                       **kw)
    for col, values in slow.requests.items():  # ITL columns included (last_token_s, p99, max)
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    # every gap between output tokens, pooled
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert np.array_equal(slow.itl_counts, fast.itl_counts)
    assert slow.num_steps == fast.num_steps


def _pipeline_models():
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.perf.pipeline import build_pipeline_step_model

    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100")
    return {pp: build_pipeline_step_model(
        model, gpu, 1, pp, "roofline", step_overhead_s=1.5e-3, step_overhead_per_seq_s=1e-5,
        kernel_time_scale=1.0, async_scheduling=pp == 4, async_step_gap_s=160e-6)
        for pp in (2, 3, 4)}


PIPELINES = _pipeline_models()


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(6, 64), pp=st.sampled_from([2, 3, 4]),
       max_running=st.integers(1, 8), stop_at_arrivals=st.booleans())
def test_pipeline_replica_fast_forward_equals_stepping(workload, kv_blocks, pp, max_running,
                                                       stop_at_arrivals):
    """A pp-stage replica (vLLM's batch-queue period, ``perf/pipeline.py``): tokens conserved,
    KV never overcommitted, and windows give exactly the step-by-step results."""
    assume(_fits(workload, kv_blocks))
    kw = dict(kv_blocks=kv_blocks, max_running=max_running, max_batched_tokens=128,
              step_model=PIPELINES[pp], block_size=BLOCK)
    slow, _ = simulate(workload, fast_forward=False, **kw)
    fast, replica = simulate(workload, fast_forward=True,
                             windows_stop_at_arrivals=stop_at_arrivals, **kw)
    r = fast.requests
    assert len(r["request_id"]) == len(workload)
    assert fast.timeline["num_tokens"].sum() == r["num_computed_tokens"].sum()
    assert (fast.timeline["num_used_blocks"] <= kv_blocks).all()
    assert replica.kv.num_used_blocks == 0
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert slow.num_steps == fast.num_steps


@st.composite
def emissions(draw):
    """A speculating replica's schedule: k draft tokens, tau in [1, k + 1] (to 1/1000)."""
    k = draw(st.integers(1, 7))
    tau_num = draw(st.integers(1000, (k + 1) * 1000))
    return Emission(tau_num, 1000, k, draft_kv=draw(st.booleans()))


@settings(max_examples=120, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(4, 64),
       ordering=st.sampled_from(sorted(ORDERING_POLICIES)),
       budget=st.sampled_from([16, 64, 512]), max_running=st.integers(1, 8),
       spec=st.sampled_from(POLICY_SPECS), emission=emissions())
def test_speculative_steps_conserve_tokens_and_kv(
        workload, kv_blocks, ordering, budget, max_running, spec, emission):
    """Speculating replicas keep every invariant (debug checks on: KV conservation, the load
    counter, queue states) for every policy: all finish with their output lengths, computed
    tokens are conserved, KV use stays within capacity with the lookahead slots held, and no
    decode step emits more than k + 1 tokens."""
    # every request must fit with its lookahead slots (vLLM would refuse it otherwise)
    total = workload.num_prompt_tokens + workload.num_output_tokens
    assume(bool((-(-(total + emission.num_lookahead_tokens) // BLOCK) <= kv_blocks).all()))
    policy = _policy(spec)
    assume(policy.splits_prompts or int(total.max()) <= budget)
    rec, replica = simulate(workload, kv_blocks=kv_blocks, ordering=ordering,
                            max_batched_tokens=budget, max_running=max_running,
                            batch_policy=policy, debug=True, speculative=emission, **common)
    r = rec.requests
    assert len(r["request_id"]) == len(workload)
    order = np.argsort(r["request_id"])
    assert (r["num_output_tokens"][order] == workload.num_output_tokens).all()
    assert (r["num_computed_tokens"] == r["num_prompt_tokens"] - r["num_prefix_hit_tokens"]
            + r["num_output_tokens"] - 1 + r["num_recomputed_tokens"]).all()
    assert rec.timeline["num_tokens"].sum() == r["num_computed_tokens"].sum()
    assert (rec.timeline["num_used_blocks"] <= kv_blocks).all()
    assert np.all(np.diff(rec.timeline["end_s"]) >= 0)
    assert replica.kv.num_used_blocks == 0
    # a decoding request's gaps: one per step, each step at most k + 1 tokens
    assert (rec.itl_counts.sum() >= np.maximum(
        0, -(-(r["num_output_tokens"] - 1) // emission.max_tokens)).sum())


@settings(max_examples=120, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(8, 64), emission=emissions(),
       ordering=st.sampled_from(sorted(ORDERING_POLICIES)), max_running=st.integers(1, 8),
       stop_at_arrivals=st.booleans(), spec=st.sampled_from(POLICY_SPECS))
def test_speculative_fast_forward_equals_step_by_step(
        workload, kv_blocks, emission, ordering, max_running, stop_at_arrivals, spec):
    """Windows of speculating decoders (each on its own emission schedule, finishing and
    taking blocks at the steps the schedule says) give exactly the step-by-step results, for
    every policy, with windows stopped at arrivals or cut back when one comes."""
    total = workload.num_prompt_tokens + workload.num_output_tokens
    assume(bool((-(-(total + emission.num_lookahead_tokens) // BLOCK) <= kv_blocks).all()))
    splits = _policy(spec).splits_prompts
    if not splits:
        assume(int(total.max()) <= 512)
    kw = dict(kv_blocks=kv_blocks, ordering=ordering, max_running=max_running,
              max_batched_tokens=128 if splits else 512, speculative=emission, **common)
    slow, _ = simulate(workload, fast_forward=False, batch_policy=_policy(spec), **kw)
    fast, _ = simulate(workload, fast_forward=True, windows_stop_at_arrivals=stop_at_arrivals,
                       batch_policy=_policy(spec), **kw)
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert np.array_equal(slow.itl_counts, fast.itl_counts)
    assert slow.num_steps == fast.num_steps
    assert slow.timeline["num_tokens"].sum() == fast.timeline["num_tokens"].sum()
    assert np.isclose(slow.kv_block_seconds_by_replica[0], fast.kv_block_seconds_by_replica[0],
                      rtol=1e-9)
    assert np.isclose(slow.busy_s_by_replica[0], fast.busy_s_by_replica[0], rtol=1e-9)


def _wide_ep_models():
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.models.quantization import quantize
    from fleetsim.moe.serving import PoolEpConfig
    from fleetsim.moe.wide_ep import DpAttentionStepModel
    from fleetsim.perf import build_step_model

    model, gpu = quantize(get_model("deepseek-v3"), "fp8_block"), get_gpu("h100")
    static = PoolEpConfig(balancer="none", num_spare_slots_per_gpu=0)
    out = {}
    for dp, tp in ((4, 2), (16, 1)):  # one node; two nodes (all-to-all on the NIC)
        base = build_step_model(model, gpu, tp, backend="roofline",
                                step_overhead_per_seq_s=1e-5, async_scheduling=dp == 16)
        out[dp] = DpAttentionStepModel(base, model, gpu, tp, dp, static)
    return out


WIDE_EP = _wide_ep_models()


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), kv_blocks=st.integers(6, 64), dp=st.sampled_from([4, 16]),
       max_running=st.integers(1, 24), stop_at_arrivals=st.booleans())
def test_wide_ep_replica_fast_forward_equals_stepping(workload, kv_blocks, dp, max_running,
                                                      stop_at_arrivals):
    """A wide-EP replica (attention ranks dealt the batch, ``moe/wide_ep.py``): the slowest
    rank's ceil(n / dp) decodes change with n, and windows still give the step-by-step
    results exactly."""
    assume(_fits(workload, kv_blocks))
    kw = dict(kv_blocks=kv_blocks, max_running=max_running, max_batched_tokens=128,
              step_model=WIDE_EP[dp], block_size=BLOCK)
    slow, _ = simulate(workload, fast_forward=False, **kw)
    fast, replica = simulate(workload, fast_forward=True,
                             windows_stop_at_arrivals=stop_at_arrivals, **kw)
    r = fast.requests
    assert len(r["request_id"]) == len(workload)
    assert fast.timeline["num_tokens"].sum() == r["num_computed_tokens"].sum()
    assert (fast.timeline["num_used_blocks"] <= kv_blocks).all()
    assert replica.kv.num_used_blocks == 0
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    assert np.array_equal(slow.itl_gaps_s, fast.itl_gaps_s)
    assert slow.num_steps == fast.num_steps
