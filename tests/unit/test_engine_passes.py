"""The engine's shortcuts over a batch give what the long way gives: the window's block count
by first boundaries (``_steps_within``) and the plan's requests taken from the batch in order
(``Replica._apply``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import make_workload, simulate

from fleetsim.policies import StepPlan, TokenBudgetPlanner
from fleetsim.serving.kv_cache import (
    blocks_after_next_token,
    blocks_after_next_token_and_short,
    blocks_for,
    blocks_short,
)
from fleetsim.serving.request import Request
from fleetsim.serving.window import _steps_within


def _steps_within_by_boundary(decodes, bs, per_entry, free, k):
    """The reference: count every block boundary each decoder crosses, step by step."""
    new_blocks = [0] * k
    for r in decodes:
        c = r.num_computed_tokens
        first = blocks_short(r, c + 1, bs, per_entry)
        held = r.num_private_blocks + r.num_cached_entries * per_entry
        j = (held + max(first, 0)) * bs - c
        while j < k:
            new_blocks[j] += 1
            j += bs
    taken = 0
    for j, b in enumerate(new_blocks):
        taken += b
        if taken > free:
            return j
    return k


def _decoder(rng, i, bs, per_entry):
    c = int(rng.integers(1, 400))
    cached = int(rng.integers(0, 3)) if per_entry > 1 else 0
    r = Request(id=i, arrival_s=0.0, num_prompt_tokens=c, max_output_tokens=10_000,
                num_computed_tokens=c, num_output_tokens=1, num_cached_entries=cached)
    # It holds the blocks of its computed tokens, sometimes short of the next token's, or
    # more (blocks kept from an earlier, longer allocation).
    held = max(0, -(-c // bs) - cached * per_entry)
    r.num_private_blocks = held + int(rng.choice([0, 0, 1, 3]))
    return r


def test_steps_within_equals_counting_every_boundary():
    rng = np.random.default_rng(7)
    for _ in range(400):
        bs = int(rng.choice([1, 2, 16]))
        per_entry = int(rng.choice([1, 4]))
        decodes = [_decoder(rng, i, bs, per_entry) for i in range(int(rng.integers(1, 30)))]
        k = int(rng.integers(1, 200))
        free = int(rng.integers(0, 60))
        assert _steps_within(decodes, bs, per_entry, free, k) == _steps_within_by_boundary(
            decodes, bs, per_entry, free, k), (bs, per_entry, k, free)


class _Reordered(TokenBudgetPlanner):
    """token_budget's plans with their requests in another order (the engine may not assume
    the batch's)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def plan(self, view, now_s):
        plan = super().plan(view, now_s)
        items = list(plan.tokens_by_request.items())
        if self.how == "reversed":
            items.reverse()
        else:  # the admissions first, then the batch
            items = items[len(view.running):] + items[:len(view.running)]
        return StepPlan(dict(items), plan.preempt)


@pytest.mark.parametrize("how", ["reversed", "admissions_first"])
def test_a_plan_in_any_order_gives_the_same_run(how):
    # Tight KV (preemptions), staggered arrivals (admissions next to decodes).
    rng = np.random.default_rng(3)
    n = 40
    w = make_workload(np.sort(rng.uniform(0, 20, n)), rng.integers(10, 120, n),
                      rng.integers(1, 60, n))
    base, _ = simulate(w, kv_blocks=40, max_batched_tokens=256)
    other, _ = simulate(w, kv_blocks=40, max_batched_tokens=256, batch_policy=_Reordered(how))
    assert base.requests["num_preemptions"].sum() > 0
    for name in ("request_id", "first_token_s", "finish_s", "num_preemptions"):
        assert base.requests[name].tolist() == other.requests[name].tolist(), name


@settings(max_examples=300, deadline=None)
@given(computed=st.integers(0, 5000), private=st.integers(0, 400), cached=st.integers(0, 40),
       lookahead=st.integers(0, 12), bs=st.sampled_from([1, 4, 16, 64]),
       per_entry=st.sampled_from([1, 2, 4]), extra_tokens=st.integers(-50, 600))
def test_settle_block_marks_equal_the_two_formulas(computed, private, cached, lookahead, bs,
                                                   per_entry, extra_tokens):
    """A window's settle reads a decoder's blocks after its next token and its blocks short
    at a count from one helper: each equals the formula it stands for."""
    r = Request(id=1, arrival_s=0.0, num_prompt_tokens=computed + 1, max_output_tokens=10,
                num_computed_tokens=computed, num_private_blocks=private,
                num_cached_entries=cached, num_lookahead_tokens=lookahead)
    num_tokens = max(computed + extra_tokens, 0)
    assert blocks_after_next_token_and_short(r, num_tokens, bs, per_entry) == (
        blocks_after_next_token(r, bs, per_entry), blocks_short(r, num_tokens, bs, per_entry))


@settings(max_examples=500, deadline=None)
@given(num_tokens=st.integers(-(1 << 40), 1 << 40), bs=st.sampled_from([1, 3, 8, 15, 16, 17, 32]))
def test_blocks_for_is_the_ceiling(num_tokens, bs):
    """The block count every growth helper uses (a shift at 16 tokens a block) is the
    ceiling of tokens over the block size, negative counts included (a request holding more
    than it needs asks with fewer tokens than it holds)."""
    assert blocks_for(num_tokens, bs) == -(-num_tokens // bs)
    r = Request(id=1, arrival_s=0.0, num_prompt_tokens=10, max_output_tokens=10,
                num_private_blocks=3, num_cached_entries=2, num_lookahead_tokens=4)
    assert blocks_short(r, num_tokens, bs, 2) == -(-(num_tokens + 4) // bs) - 3 - 2 * 2
