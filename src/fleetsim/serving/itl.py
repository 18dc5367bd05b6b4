"""Inter-token latency: the gaps between a request's output tokens, exact under fast-forward.

Per request the engine keeps the time of its last token and the largest gaps so far (a
min-heap of ``top_size(outputs)`` values, enough for the exact p99 and the max: numpy's
linear-interpolation p99 of n gaps reads the order statistics at most ceil((n - 1) / 100)
ranks below the largest). The mean needs no state: (last token - first token) / (n).

Pooled over all requests (``vllm bench serve``'s ITL percentiles) the gaps go to the
recorder as (gap, count) pairs: a step's decoders that also emitted at the previous step of
the replica share one gap, the step's duration, so a step costs one pair plus one per
decoder that came back after a pause (preemption, a handoff, a step it sat out). A
fast-forward window stores its step end times once (``Recorder.itl_window``) and the pairs
of its later steps are computed from them when the records become arrays: the cost is per
request and window, not per token. The gaps are the same floats as step by step (window end
times are bit-identical), so every ITL figure equals step by step's exactly.
"""

from __future__ import annotations

from heapq import heapreplace
from operator import sub
from typing import TYPE_CHECKING

from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request, itl_stats

__all__ = ["decode_gaps", "first_token", "itl_stats", "on_step", "on_window", "top_size"]

if TYPE_CHECKING:  # (a type only: the window module imports chunk runs, which import this)
    from fleetsim.serving.window import Step


def top_size(max_output_tokens: int) -> int:
    """Largest gaps kept for a request with this many outputs (max_output_tokens - 1 gaps)."""
    return (max_output_tokens - 2) // 100 + 2 if max_output_tokens > 2 else 1


def first_token(r: Request, t: float) -> None:
    r.last_token_s = t
    r.itl_top = [0.0] * top_size(r.max_output_tokens)


def on_step(step: Step, now_s: float, rec: Recorder) -> None:
    """Before ``step`` commits at ``now_s``: the gaps of the tokens it emits."""
    start_s = step.start_s
    for r, n in step.chunks:
        if r.num_computed_tokens + n == r.num_prompt_tokens + r.num_output_tokens:
            if r.num_output_tokens == 0:
                first_token(r, now_s)
            else:  # a recompute's last chunk: the token after a preemption
                g = now_s - r.last_token_s
                r.last_token_s = now_s
                top = r.itl_top
                if top is not None and g > top[0]:
                    heapreplace(top, g)
                rec.itl_gap(g, 1)
    decode_gaps(step.decodes, start_s, now_s, rec)


def decode_gaps(decodes: list[Request], start_s: float, now_s: float, rec: Recorder) -> None:
    """Before a step from ``start_s`` to ``now_s`` commits: the gaps of its decodes' tokens
    (``on_step``'s, and a chunk run's riding decodes', step by step)."""
    d = now_s - start_s
    regular = 0
    for r in decodes:
        last = r.last_token_s
        r.last_token_s = now_s
        g = d if last == start_s else now_s - last
        top = r.itl_top
        if top is not None and g > top[0]:
            heapreplace(top, g)
        if last == start_s:
            regular += 1
        else:
            rec.itl_gap(g, 1)
    if regular:
        rec.itl_gap(d, regular)


def on_window(step: Step, num_commit: int, rec: Recorder) -> None:
    """Before a window's first ``num_commit`` steps are settled: their gaps. Decoder i
    emits at steps 0 .. min(left_i, num_commit) - 1 (``Window.lefts``). The window's gaps
    are sorted once; each decoder's heap takes from the top of the list while they beat its
    smallest (a few values, not one per token)."""
    w = step.window
    assert w is not None
    m = num_commit
    if m <= 0:
        return
    ends = w.ends
    start_s = step.start_s
    d0 = ends[0] - start_s
    end_s = ends[m - 1]
    regular = 0
    # diffs[j - 1]: the gap of step j; a decoder that emitted at the previous step has the
    # first gap d0 too (``regular``), the others had theirs merged just below.
    diffs = list(map(sub, ends[1:m], ends[:m - 1])) if m > 1 else []
    # each decoder's heap takes the largest of its gaps from these lists, sorted once
    with_d0 = sorted([d0, *diffs], reverse=True)
    no_d0 = sorted(diffs, reverse=True)
    finishes: list[int] = []
    for r, left in zip(step.decodes, w.lefts, strict=True):
        last = r.last_token_s
        top = r.itl_top
        is_regular = last == start_s
        if is_regular:
            regular += 1
        else:
            g = ends[0] - last
            rec.itl_gap(g, 1)
            if top is not None and g > top[0]:
                heapreplace(top, g)
        if left < m:
            r.last_token_s = ends[left - 1]
            finishes.append(left)
            gaps = sorted(([d0] if is_regular else []) + diffs[:left - 1], reverse=True)
        else:
            r.last_token_s = end_s
            gaps = with_d0 if is_regular else no_d0
        if top is not None:
            for v in gaps:
                if v > top[0]:
                    heapreplace(top, v)
                else:
                    break
    if regular:
        rec.itl_gap(d0, regular)
    if m > 1:
        rec.itl_window(ends, m, len(step.decodes), finishes)
