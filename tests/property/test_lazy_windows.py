"""Lazy fast-forward windows (``Window.lazy``) store no end time when they open. Whatever
is asked of them must equal what a window with every end time stored gives, bit for bit:
its length and end (``_finish_open`` over the stored ends), its finishers' times, the step
in progress at any time (``bisect``), and the end times it stores later (``materialize``)."""

from __future__ import annotations

import bisect
import math
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.serving import window
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.request import Request
from fleetsim.serving.window import DecodeWindows, Step, _first_at_or_after

BLOCK = 16


def _decoders(specs: list[tuple[int, int]]) -> list[Request]:
    """Decoding requests (prompt, tokens left), each holding the blocks of its KV so far."""
    out = []
    for i, (prompt, left) in enumerate(specs):
        r = Request(i, 0.0, prompt, left + 1, num_computed_tokens=prompt, num_output_tokens=1,
                    num_private_blocks=-(-(prompt + 1) // BLOCK))
        out.append(r)
    return out


class TermsModel:
    """Decode steps of ``base + per_kv x KV tokens + extra``, with their terms apart (the
    form the fast path adds up)."""

    def __init__(self, extra_s: float) -> None:
        self.extra_s = extra_s

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        return 0.010 + 1e-4 * num_decode, 2e-7, self.extra_s

    def step_time_s(self, chunks: object, num_decode: int, kv_tokens: int) -> float:
        base, per_kv, extra = self.decode_terms_s(num_decode)
        return (base + per_kv * kv_tokens) + extra


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400)), min_size=1,
                      max_size=12),
       through=st.booleans(), start_s=st.floats(0.0, 50.0),
       extra_s=st.sampled_from([0.0, 0.0004]), bin_s=st.sampled_from([math.inf, 0.05, 0.7]),
       until_s=st.sampled_from([math.inf, 0.3, 2.0]), hint_s=st.sampled_from([None, 0.2, 1.5]),
       probes=st.lists(st.floats(0.0, 2.0), min_size=1, max_size=6))
def test_lazy_window_equals_stored_ends(specs, through, start_s, extra_s, bin_s, until_s,
                                        hint_s, probes):
    decodes = _decoders(specs)
    kv = KVCache(100_000, BLOCK)
    kv.num_free_blocks -= sum(r.num_private_blocks for r in decodes)
    hint = None if hint_s is None else (lambda: start_s + hint_s)
    windows = DecodeWindows(kv, TermsModel(extra_s), hint, timeline=(0.0, bin_s))
    windows.cap = 1 << 14  # no adaptive cap: the window's length is the stops' alone
    windows.lazy = True  # (the compiled engine's windows; pure Python stores end times)
    step = Step(start_s)
    step.decodes = decodes
    end_s = windows.open(step, start_s + until_s, through)
    w = step.window
    assert end_s is not None and w is not None
    k = step.num_steps
    lefts = [left for _, left in specs]
    if not w.lazy:  # a one-step window stores its one end
        assert k == 1 and len(w.ends) == 1
        return
    # The reference: the steps ``open`` computes (those the decoders allow, bounded before
    # the stops by the first step's time), every end time stored as ``_ends_python`` stores
    # them, and the length ``_finish_open``'s searches give.
    n = len(decodes)
    kv_tokens = sum(r.num_computed_tokens for r in decodes)
    length = max(lefts) if through else min(lefts)
    edge_s = windows.next_edge_s(start_s)
    if hint is not None or until_s < math.inf or edge_s < math.inf:
        first_s = windows._decode_step_s(n, kv_tokens)
        length = windows._cap_steps(length, start_s, first_s, start_s + until_s, edge_s)
    finishes = sorted((left, r.num_computed_tokens) for left, r in zip(lefts, decodes, strict=True)
                      if left < length)
    ends = windows._ends_python(start_s, n, kv_tokens, length, finishes)
    cut = length - 1
    if hint is not None:
        cut = min(cut, bisect.bisect_left(ends, hint()))
    cut = min(cut, bisect.bisect_right(ends, start_s + until_s))
    cut = min(cut, max(0, bisect.bisect_right(ends, edge_s) - 1))
    assert k == 1 + cut
    assert step.end_s == ends[k - 1]
    assert step.last_boundary_s == (ends[k - 2] if k > 1 else start_s)
    assert sorted(w.finish_times) == sorted(ends[left - 1] for left in lefts if left <= k)
    # The step in progress at any time, as a search over the stored ends finds it.
    for p in probes:
        now_s = start_s + p * (step.end_s - start_s)
        j, end_j, start_j = windows._step_at(step, now_s, k)
        assert j == bisect.bisect_left(ends, now_s, 0, k)
        if j < k:
            assert (end_j, start_j) == (ends[j], ends[j - 1] if j else start_s)
    # Stored later, in pieces: the same floats.
    for m in sorted({1, k // 3, k // 2, k}):
        windows.materialize(step, m)
        assert len(w.ends) >= m and w.ends == ends[:len(w.ends)]
        j, _, _ = windows._step_at(step, ends[m - 1], k)  # searches the stored part
        assert j == bisect.bisect_left(ends, ends[m - 1], 0, k)
        for p in probes:  # ... and adds up from the last stored end past it
            now_s = start_s + p * (step.end_s - start_s)
            j, end_j, start_j = windows._step_at(step, now_s, k)
            assert j == bisect.bisect_left(ends, now_s, 0, k)
            if j < k:
                assert (end_j, start_j) == (ends[j], ends[j - 1] if j else start_s)


@settings(max_examples=300, deadline=None)
@given(ends=st.lists(st.floats(0.0, 10.0), max_size=12).map(sorted),
       t=st.floats(-1.0, 11.0), cut=st.integers(0, 12))
def test_the_step_search_is_bisect_left(ends, t, cut):
    """The window's written-out search over its end times is ``bisect.bisect_left``, ties
    (equal ends, a time equal to one) and a shortened range included. (Interpreted, the
    search is the library's: the written-out loop is forced on; compiled it always runs.)"""
    hi = min(cut, len(ends))
    with mock.patch.object(window, "COMPILED", True):
        assert _first_at_or_after(ends, t, hi) == bisect.bisect_left(ends, t, 0, hi)
        if ends:  # a time equal to a stored end
            assert (_first_at_or_after(ends, ends[0], hi)
                    == bisect.bisect_left(ends, ends[0], 0, hi))
