"""Decode fast-forward: many identical decode-only steps of one replica in one event.

A window starts when a plan only decodes every running request and the policy says the plan
would repeat (``fast_forward_safe``). It lasts k steps, where k stops before any request
finishes, before the decoders would need more than the *free* KV blocks (never evicting cached
prefixes, so cutting a window back is exact), past ``until_s``, and, when the driver knows
when the next input comes (a lone replica: the next arrival), at the first boundary at or
after it. Step times come from one vectorized ``decode_step_times_s`` call; their running sum
is ``np.cumsum`` from the window's start time, which adds the same floats in the same order
as step by step, so end times are bit-identical. The KV-use integral is the same sum in a
different association (equal to ~1e-12).

When an outside input arrives mid-window, ``cut`` shortens the window to end at the first
boundary at or after it, returning the surplus blocks: a binary search in the kept arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.request import Request


class Step:
    """One engine step, or a fast-forward window of identical decode steps."""

    __slots__ = ("chunks", "decodes", "end_s", "last_boundary_s", "num_running", "num_steps",
                 "num_tokens", "num_waiting", "start_s", "window")

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.end_s = start_s
        self.last_boundary_s = start_s  # a window's last inner step boundary
        # Fast-forward windows keep what cutting them back needs (see ``_Window``).
        self.window: _Window | None = None
        self.chunks: list[tuple[Request, int]] = []  # (request, tokens) this step
        self.decodes: list[Request] = []
        self.num_steps = 1
        self.num_tokens = 0
        self.num_running = 0  # queue lengths while the step runs (after admission)
        self.num_waiting = 0


class _Window:
    """What cutting a window back needs: its step times and new blocks per step, each
    decoder's computed tokens and blocks held before it (the first step's included), and
    the blocks in use during its first step."""

    __slots__ = ("computed", "held", "new_blocks", "times", "used0")

    def __init__(self, times: list[float], new_blocks: list[int], computed: list[int],
                 held: list[int], used0: int) -> None:
        self.times, self.new_blocks, self.computed, self.held = times, new_blocks, computed, held
        self.used0 = used0


class DecodeWindows:
    """Opens and cuts fast-forward windows for one replica."""

    def __init__(self, kv: KVCache, step_model: StepTimeModel,
                 next_input_hint_s: Callable[[], float] | None) -> None:
        self.kv = kv
        self.step_model = step_model
        # When the driver knows when the next outside input comes, windows stop there;
        # otherwise they are capped at ``cap`` steps, adapted to how often inputs cut them
        # (computing steps that get cut is wasted work). Speed only: results do not change.
        self.next_input_hint_s = next_input_hint_s
        self.cap = 64

    def open(self, step: Step, until_s: float) -> tuple[float, float] | None:
        """Make ``step`` (whose plan decodes every running request once) as long as is exact,
        taking the blocks it needs, the first step's included when the plan has not taken
        them. Returns (end time, KV block-seconds), or None, changing nothing, when the
        first step's blocks are not free (the policy must decide: evict or preempt)."""
        decodes = step.decodes
        n = len(decodes)
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        computed: list[int] = []
        held: list[int] = []  # blocks held once the first step's are taken
        first_need = 0
        kv_tokens = 0
        max_steps = 1 << 62
        for r in decodes:
            c = r.num_computed_tokens
            h = r.num_private_blocks + r.num_cached_entries * per_entry
            need = -(-(c + 1) // bs) - h
            if need > 0:
                first_need += need
                h += need
            computed.append(c)
            held.append(h)
            kv_tokens += c
            left = r.max_output_tokens - r.num_output_tokens
            if left < max_steps:
                max_steps = left
        free = kv.num_free_blocks - first_need
        if free < 0:
            return None
        used0 = kv.num_used_blocks + first_need
        start_s = step.start_s
        first_s = self.step_model.step_time_s((), n, kv_tokens)
        if max_steps < 2 or start_s + first_s >= until_s:
            self._take(decodes, 1)
            return start_s + first_s, used0 * first_s
        k = self._cap_steps(max_steps, start_s, first_s, until_s)
        # Step j (from 0) needs blocks for c + j + 1 tokens: a request takes a new block at
        # step h*bs - c, then every bs steps (the first step's blocks are held already).
        new_blocks = [0] * k
        for c, h in zip(computed, held, strict=True):
            j = h * bs - c
            while j < k:
                new_blocks[j] += 1
                j += bs
        taken = 0
        for j, b in enumerate(new_blocks):  # free blocks only: no eviction inside a window
            taken += b
            if taken > free:
                k = j
                break
        times = self.step_model.decode_step_times_s(
            n, kv_tokens + n * np.arange(k, dtype=np.int64)).tolist()
        hint = self.next_input_hint_s
        stop_s = hint() if hint is not None else math.inf  # stopping early is always exact
        end_s, kv_seconds, steps, last_boundary_s = _accumulate(
            start_s, times, new_blocks, used0, stop_s, until_s)
        self._take(decodes, steps)
        step.num_steps = steps
        step.num_tokens = n * steps
        step.end_s = end_s
        step.last_boundary_s = last_boundary_s
        step.window = _Window(times[:steps], new_blocks, computed, held, used0)
        return end_s, kv_seconds

    def _take(self, decodes: list[Request], steps: int) -> None:
        """Give each decoder the blocks ``steps`` steps need (free blocks only)."""
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        total = 0
        for r in decodes:
            extra = (-(-(r.num_computed_tokens + steps) // bs) - r.num_private_blocks
                     - r.num_cached_entries * per_entry)
            if extra > 0:
                total += extra
                r.num_private_blocks += extra
        kv.num_free_blocks -= total

    def _cap_steps(self, max_steps: int, start_s: float, first_s: float,
                   until_s: float) -> int:
        # Decode steps never get shorter as KV grows, so no more steps than this fit before
        # a known stop.
        if until_s < math.inf:
            max_steps = min(max_steps, int((until_s - start_s) / first_s) + 2)
        hint = self.next_input_hint_s
        if hint is not None:
            until_hint = hint() - start_s
            if until_hint < math.inf:
                max_steps = min(max_steps, int(until_hint / first_s) + 2)
        elif max_steps >= self.cap:
            max_steps = self.cap
            self.cap = min(2 * self.cap, 1 << 14)
        return max_steps

    def cut(self, step: Step, now_s: float) -> float | None:
        """Shorten ``step``'s window to end at the first boundary at or after ``now_s``.
        Returns the new KV block-seconds, or None when there was nothing to cut."""
        w = step.window
        if w is None or step.num_steps == 1 or now_s > step.last_boundary_s:
            return None  # already ends at the first boundary at or after now
        end_s, kv_seconds, steps, last_boundary_s = _accumulate(
            step.start_s, w.times, w.new_blocks, w.used0, now_s, math.inf)
        old = step.num_steps
        if steps == old:
            return None
        w.times = w.times[:steps]
        self.cap = max(64, 2 * steps)
        bs, kv = self.kv.block_size, self.kv
        freed = 0
        for r, c, h in zip(step.decodes, w.computed, w.held, strict=True):
            kept = -(-(c + steps) // bs)
            if kept < h:
                kept = h
            surplus = -(-(c + old) // bs) - kept
            if surplus > 0:
                r.num_private_blocks -= surplus
                freed += surplus
        kv.num_free_blocks += freed
        step.num_steps = steps
        step.num_tokens = len(step.decodes) * steps
        step.end_s = end_s
        step.last_boundary_s = last_boundary_s
        return kv_seconds


def _accumulate(
    start_s: float, times: list[float], new_blocks: list[int], used: int, stop_s: float,
    until_s: float,
) -> tuple[float, float, int, float]:
    """Walk a window's steps as step by step would: returns the end time, the KV block-seconds,
    the number of steps, and the last inner boundary. Stops after the first step that ends at
    or after ``stop_s`` (an input arrives) or after ``until_s``. One loop for opening and for
    cutting windows, so both add the same floats in the same order.
    """
    end_s = last_boundary_s = start_s
    kv_seconds = 0.0
    steps = 0
    for d, extra in zip(times, new_blocks, strict=False):
        used += extra
        last_boundary_s = end_s
        end_s += d
        kv_seconds += used * d
        steps += 1
        if end_s >= stop_s or end_s > until_s:
            break
    return end_s, kv_seconds, steps, last_boundary_s
