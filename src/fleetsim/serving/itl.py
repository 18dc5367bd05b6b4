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

from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request, itl_stats

__all__ = ["first_token", "itl_stats", "on_step", "on_window", "top_size"]
from fleetsim.serving.window import Step


def top_size(max_output_tokens: int) -> int:
    """Largest gaps kept for a request with this many outputs (max_output_tokens - 1 gaps)."""
    return (max_output_tokens - 2) // 100 + 2 if max_output_tokens > 2 else 1


def first_token(r: Request, t: float) -> None:
    r.last_token_s = t
    r.itl_top = [0.0] * top_size(r.max_output_tokens)


def _gap(r: Request, g: float) -> None:
    top = r.itl_top
    if top is not None and g > top[0]:
        heapreplace(top, g)


def on_step(step: Step, now_s: float, rec: Recorder) -> None:
    """Before ``step`` commits at ``now_s``: the gaps of the tokens it emits."""
    start_s = step.start_s
    regular = 0
    for r, n in step.chunks:
        if r.num_computed_tokens + n == r.num_prompt_tokens + r.num_output_tokens:
            if r.num_output_tokens == 0:
                first_token(r, now_s)
            else:  # a recompute's last chunk: the token after a preemption
                g = now_s - r.last_token_s
                r.last_token_s = now_s
                _gap(r, g)
                rec.itl_gap(g, 1)
    d = now_s - start_s
    for r in step.decodes:
        last = r.last_token_s
        r.last_token_s = now_s
        if last == start_s:
            regular += 1
            _gap(r, d)
        else:
            g = now_s - last
            _gap(r, g)
            rec.itl_gap(g, 1)
    if regular:
        rec.itl_gap(d, regular)


def on_window(step: Step, num_commit: int, rec: Recorder) -> None:
    """Before a window's first ``num_commit`` steps are settled: their gaps. Decoder i
    emits at steps 0 .. min(left_i, num_commit) - 1 (``Window.lefts``)."""
    w = step.window
    assert w is not None
    m = num_commit
    if m <= 0:
        return
    ends = w.ends
    start_s = step.start_s
    d0 = ends[0] - start_s
    regular = 0
    # Later steps' gaps, largest first (only when some decoder emits twice or more).
    order: list[int] | None = None
    if m > 1:
        diffs = [ends[j] - ends[j - 1] for j in range(1, m)]  # diffs[j - 1]: gap of step j
        order = sorted(range(m - 1), key=diffs.__getitem__, reverse=True)
    finishes: list[int] = []
    for r, left in zip(step.decodes, w.lefts, strict=True):
        t_i = left if left < m else m
        last = r.last_token_s
        r.last_token_s = ends[t_i - 1]
        if last == start_s:
            regular += 1
            _gap(r, d0)
        else:
            g = ends[0] - last
            _gap(r, g)
            rec.itl_gap(g, 1)
        if left < m:
            finishes.append(left)
        if order is not None and t_i > 1:
            top = r.itl_top
            if top is None:
                continue
            for j in order:
                if j + 1 < t_i:
                    v = diffs[j]
                    if v > top[0]:
                        heapreplace(top, v)
                    else:
                        break
    if regular:
        rec.itl_gap(d0, regular)
    if m > 1:
        rec.itl_window(ends, m, len(step.decodes), finishes)
