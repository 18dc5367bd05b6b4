"""Decode fast-forward: many decode-only steps of one replica in one event.

A window starts when a plan only decodes every running request and the policy says the plan
would repeat (``fast_forward_safe``). It lasts k steps, where k stops before the decoders
would need more than the *free* KV blocks (never evicting cached prefixes, so cutting a window
back is exact), at an adaptive cap, past ``until_s``, and, when the driver knows when the next
input comes (a lone replica: the next arrival), at the first boundary at or after it. It also
stops before the first request finishes, unless it runs ``through`` finishes (nothing waits
and the policy decodes all when idle): then each finisher leaves the batch after its last
step. Step times come from the model's decode terms added up in plain Python, or from
``decode_step_times_s`` and ``np.cumsum``; either way the same floats are added in the same
order as step by step, so end times are bit-identical.

A plan may instead bring a rule of its own (``StepPlan.repeat_rule``): the window then decodes
that plan's requests only (the other running requests paused), stops where the rule says,
adds attained service one step at a time and keeps each step's duration, so that the replica
writes step by step's own timeline rows (an *exact* window: ``open``'s ``rule``).

Windows also stop at the edges of the timeline's bins (``timeline``: origin and width), so
that a window's records lie in one bin and the time series equal step by step's.

Opening a window costs one pass over the decoders and its steps, whose end times are added
up but not stored (a *lazy* window: they are stored when a reader needs them, ``materialize``;
most windows are cut back long before their end); nothing else is touched until it is
*settled* (``settle``): blocks taken, tokens committed, finishes done and the
KV-use integral computed (the same sum as step by step in a different association, equal to
~1e-12). That happens when it ends, or when anything outside reads or changes the replica
mid-window: ``cut`` first shortens the window to end at the step in progress (a binary
search), and ``settle`` then commits only the steps done before now, leaving the step in
progress as an ordinary step: the outside world sees the replica exactly as step by step.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np

from fleetsim.core.simulator import COMPILED, Event
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.chunk_runs import ChunkRun
from fleetsim.serving.contract import RepeatRule
from fleetsim.serving.kv_cache import (
    KVCache,
    blocks_after_next_token,
    blocks_after_next_token_and_short,
    blocks_short,
)
from fleetsim.serving.request import Request
from fleetsim.serving.shared_steps import SharedStepModel
from fleetsim.serving.speculative import Emission

FinishFn = Callable[[Request, float], None]
# ``(decodes, num_decode, kv_tokens, k) -> steps``: of a window's first k steps, how many
# leading ones a replica sleeping on this one's steps would sleep through
# (``SharedSteps.steps_held``: its wait rule holds against each).
StepsHeld = Callable[[list[Request], int, int, int], int]

# Windows of a model without decode terms up to this many steps are priced one step at a
# time (``step_time_s``, the call stepping makes) instead of with ``decode_step_times_s``,
# when the model says that is the same (``scalar_windows``: its ``step_time_s`` has no side
# effect and its vectorized durations equal it step for step). numpy's fixed cost, about a
# dozen array operations and a cumulative sum per window, was 280k instructions a window on
# the SoC (29 steps on average there); a scalar step costs about 1k.
SCALAR_WINDOW_STEPS = 256


# The empty list a window's ``finishes`` and ``emitted0`` start as, shared and never added
# to (a window that has any sets a list of its own): two lists fewer made and freed a window.
_NONE_INSIDE: Final[list[tuple[int, int]]] = []


class Step:
    """One engine step, a fast-forward window of identical decode steps, or a run of one
    prompt's chunks (``chunk_runs.py``)."""

    __slots__ = ("chunks", "decodes", "end_event", "end_gen", "end_s", "is_all_decode",
                 "last_boundary_s", "num_running", "num_steps", "num_tokens", "num_waiting",
                 "run", "start_s", "window")

    def __init__(self, start_s: float, decodes: list[Request] | None = None) -> None:
        self.start_s = start_s
        self.end_s = start_s
        self.end_event: Event | None = None  # its STEP_END, where the kernel can move it
        # Which of its STEP_ENDs counts (``Replica.schedule_end`` numbers them; a step whose
        # end becomes unknown adds one): an earlier one, for an end that moved since (a
        # window cut back, a step turned into a job), is stale even where it falls at the
        # very time of the new end.
        self.end_gen = 0
        self.last_boundary_s = start_s  # a window's last inner step boundary
        self.window: Window | None = None  # set when the step is a fast-forward window
        self.run: ChunkRun | None = None  # set when it is a chunk run (then ``chunks`` is its
        # first step's, and stays the chunk of the step in progress when it is cut)
        self.chunks: list[tuple[Request, int]] = []  # (request, tokens) this step
        # (given: a window's decoders, without building an empty list to replace)
        self.decodes: list[Request] = decodes if decodes is not None else []
        self.num_steps = 1
        self.num_tokens = 0
        self.num_running = 0  # queue lengths while the step runs (after admission)
        self.num_waiting = 0
        self.is_all_decode = False  # the plan decodes every running request once


class Window:
    """A fast-forward window: its step end times (``ends[j]``: end of step j), the blocks in
    use during its first step, and each decoder's steps left to its last token (``lefts``,
    in ``Step.decodes`` order; a decoder with ``left <= num_steps`` finishes inside).
    ``settled`` once its blocks and tokens are taken (``Replica``), with its KV
    block-seconds, the decoders that finish at its last step (``at_end``) and the earlier
    finish steps (``finish_steps``)."""

    __slots__ = ("at_end", "emitted0", "ends", "exact", "finish_steps", "finish_times",
                 "finishes", "kv0", "kv_seconds", "lazy", "lefts", "min_left", "n0", "rule",
                 "settled", "step_s", "used0", "used_by_step")

    def __init__(self, ends: list[float], used0: int, lefts: list[int], min_left: int) -> None:
        self.ends = ends
        self.used0 = used0
        self.lefts = lefts
        # The fewest of ``lefts`` (the opener has it): whether a decoder finishes within k
        # steps, which an instance group asks of every member at every plan, without a pass
        # over the decoders.
        self.min_left = min_left
        # A *lazy* window stores no end time when it opens (``DecodeWindows._open_lazy``):
        # ``ends`` holds the first ``len(ends)`` of them, filled when a reader needs them
        # (``DecodeWindows.materialize``) from its decoders' count (``n0``) and KV tokens
        # (``kv0``) at its start and the (steps left, computed tokens) of those finishing
        # inside, sorted (``finishes``); ``finish_times`` are the end times of their last
        # steps, for the replica's load counter. Most windows are cut back by an arrival
        # long before their end, and an end time per step stored is a float object made and
        # freed: only the steps settled are ever stored.
        self.lazy = False
        self.n0 = 0
        self.kv0 = 0
        self.finishes: list[tuple[int, int]] = _NONE_INSIDE  # (a lazy window sets its own)
        self.finish_times: list[float] = []
        # A plan's repeat rule (``StepPlan.repeat_rule``): the window is exact step by step.
        # Its steps' durations as the model gives them (``step_s``), and, once settled, the
        # blocks in use during each committed step (``used_by_step``), for per-step records.
        # (Ordinary windows share one empty tuple: no lists built per window, so the main
        # engine's windows cost what they did before exact windows existed.)
        self.rule: RepeatRule | None = None
        self.exact = False  # its rule's policy reads each step (``RepeatRule.per_step``)
        self.step_s: Sequence[float] = ()
        self.used_by_step: Sequence[int] = ()
        # Speculative decoding: each decoder's (tokens emitted past its first, tokens left)
        # when the window opened, in ``Step.decodes`` order (empty otherwise).
        self.emitted0: list[tuple[int, int]] = _NONE_INSIDE  # (a speculating one sets its own)
        self.settled = False
        self.kv_seconds = 0.0
        self.at_end: list[Request] = []
        self.finish_steps: list[int] = []


class DecodeWindows:
    """Opens and cuts fast-forward windows for one replica (the replica settles them)."""

    def __init__(self, kv: KVCache, step_model: StepTimeModel,
                 next_input_hint_s: Callable[[], float] | None,
                 timeline: tuple[float, float] | None = None,
                 speculative: Emission | None = None) -> None:
        self.kv = kv
        self.step_model = step_model
        # Speculative decoding: decoders emit on their schedule (``speculative.py``), so
        # windows count steps and tokens apart (``_open_speculative``).
        self.spec = speculative
        # The timeline's bins (origin, width): a window never runs past the next bin edge.
        self.bin_origin_s, self.bin_s = timeline if timeline is not None else (0.0, math.inf)
        # When the driver knows when the next outside input comes, windows stop there;
        # otherwise they are capped at ``cap`` steps, adapted to how often inputs cut them.
        # A window that ends at its cap costs a whole event, a step computed and then cut
        # costs little, so the cap never drops below 64. Speed only: results do not change.
        self.next_input_hint_s = next_input_hint_s
        self.cap = 64
        self._has_terms = hasattr(step_model, "decode_terms_s")
        self._scalar_windows = bool(getattr(step_model, "scalar_windows", False))
        # A shared-resource model (the SoC's), or the one a wrapper prices as (``shared``:
        # a pool alone on the DDR), whose decode prices are called directly: through the
        # protocol a compiled call is generic, its arguments boxed every step.
        # (asked only of a model with scalar windows: a failed ``getattr`` raises inside,
        # and an instance group builds these at every regroup)
        shared = step_model if isinstance(step_model, SharedStepModel) else (
            getattr(step_model, "shared", None) if self._scalar_windows else None)
        self._shared_model = shared if isinstance(shared, SharedStepModel) else None
        # A shared-resource model whose split prices with a side effect (it does not declare
        # ``scalar_windows``: ExpertPlex's decode split sets the pool's SM allocation from the
        # batch it prices, which the prefill's next split reads). Stepping prices every step
        # through it; a window prices its steps without it, so its batch must not change
        # inside (no window through a finish) and its first step is priced through it. Exact
        # for a side effect that follows the batch (as ExpertPlex's does), not its KV.
        self._split_side_effects = (isinstance(step_model, SharedStepModel)
                                    and not step_model.scalar_windows)
        # Lazy windows (``Window.lazy``) where the engine runs compiled (its modules are
        # compiled together, ``native.py``, so the kernel's flag says): there a stored end
        # time is a float object made and freed, which the lazy pass saves; in pure Python
        # every float is an object anyway, and the pass only adds work (100k requests 8.1 ->
        # 8.6 s). Either way the results are the same (the tests run both, on both builds).
        self.lazy = COMPILED
        # The model's decode terms by batch size (-1.0: not computed yet), as three lists of
        # floats: read natively when compiled, where a dict of tuples cost a boxed key, a
        # lookup and three unboxed floats a call (a window asks once per stretch).
        self._base_by_n: list[float] = []
        self._per_kv_by_n: list[float] = []
        self._extra_by_n: list[float] = []
        # Set for one ``open`` by a replica whose steps run beside another job on a shared
        # resource (``beside.py``): the window's end times, as ``_ends_python`` takes its
        # arguments (it may give fewer than asked: stopping early is always exact).
        self.ends_beside: Callable[[float, int, int, int, list[tuple[int, int]]],
                                   list[float]] | None = None

    def open(self, step: Step, until_s: float, through: bool = False,
             rule: RepeatRule | None = None, held: StepsHeld | None = None) -> float | None:
        """Make ``step`` (whose plan decodes every running request once) a window as long as
        is exact, and return its end time; or return None, changing nothing, when the first
        step's blocks are not free (the policy must decide: evict or preempt). Blocks are
        taken when the window is settled.

        ``through``: the plan stays "decode every running request" after one finishes
        (nothing waits and the policy decodes all when idle), so the window goes on past
        finishes, with fewer decoders, instead of stopping at the first one.

        ``rule``: the plan decodes some running requests (``step.decodes``; the others stay
        paused) and repeats as long as ``rule`` says (``StepPlan.repeat_rule``): at most its
        ``max_steps``, its ``max_new_blocks`` after the first step, and through the steps
        its ``steps_within`` accepts of the end times computed. Such a window is exact step
        by step (``settle`` adds attained service step by step; ``step_s`` keeps each
        step's duration for per-step records).

        ``held``: a replica sharing this one's resource sleeps on its steps under a wait rule
        (``StepPlan.wait_rule``): the window ends after the leading steps it would sleep
        through (stepping would wake it at the next), and not past a finish (the rule is
        asked of one batch).
        """
        if self.spec is not None:
            return self._open_speculative(step, until_s, through, self.spec)
        if self._split_side_effects or held is not None:
            through = False  # (the class's note: every step of the window has one batch)
        decodes = step.decodes
        n = len(decodes)
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        first_need = 0
        kv_tokens = 0
        lefts: list[int] = []
        # (min and max kept as the loop goes: in the compiled engine a builtin over a list
        # is a generic call)
        min_left = max_left = decodes[0].max_output_tokens - decodes[0].num_output_tokens
        for r in decodes:
            c = r.num_computed_tokens
            kv_tokens += c
            need = blocks_short(r, c + 1, bs, per_entry)
            if need > 0:
                first_need += need
            left = r.max_output_tokens - r.num_output_tokens
            lefts.append(left)
            if left < min_left:
                min_left = left
            elif left > max_left:
                max_left = left
        free = kv.num_free_blocks - first_need
        if free < 0:
            return None
        # The first step's time (-1.0: not priced yet); a split with a side effect prices it
        # now, as stepping prices every step.
        first_s = self._decode_step_s(n, kv_tokens) if self._split_side_effects else -1.0
        max_steps = max_left if through else min_left
        if rule is not None:
            free = min(free, rule.max_new_blocks)
            max_steps = min(max_steps, rule.max_steps)
        start_s = step.start_s
        hint = self._input_hint()
        edge_s = self.next_edge_s(start_s)
        if max_steps < 2:
            k = 1
        elif hint is None and until_s == math.inf and edge_s == math.inf:
            k = max_steps if max_steps < self.cap else self._capped()
        else:
            if first_s < 0.0:
                first_s = self._decode_step_s(n, kv_tokens)
            k = 1 if start_s + first_s >= min(until_s, edge_s) else self._cap_steps(
                max_steps, start_s, first_s, until_s, edge_s)
        # Over k steps a decoder crosses at most ceil((k - 1) / bs) block boundaries after
        # its first step: only when that may not fit, count exactly (ignoring blocks that
        # finishes free: stopping early is always exact).
        if k > 1 and n * -(-(k - 1) // bs) > free:
            k = _steps_within(decodes, bs, per_entry, free, k)
        if held is not None and k > 1:
            k = held(decodes, n, kv_tokens, k)
        exact = rule is not None and rule.per_step
        step_s: list[float] = []  # (each step's duration: kept for an exact window only)
        beside = self.ends_beside
        if beside is not None:
            assert not exact  # (a window beside is priced by replay, not step by step)
            leaving: list[tuple[int, int]] = []  # (as ``finishes`` below)
            if min_left < k:
                leaving = [(lefts[i], decodes[i].num_computed_tokens) for i in range(n)
                           if lefts[i] < k]
                leaving.sort()
            ends = beside(start_s, n, kv_tokens, k, leaving)
        elif k == 1:
            if first_s < 0.0:
                first_s = self._decode_step_s(n, kv_tokens)
            ends = [start_s + first_s]
            step_s.append(first_s)
        else:
            # Decoders finishing inside the window, in order: (steps left, computed tokens);
            # for a lazy window also those finishing at its last step (its pass times every
            # finish; the end times it adds up are the same).
            lazy = self.lazy and self._has_terms and rule is None
            inside = k + 1 if lazy else k
            finishes: list[tuple[int, int]] = []
            if min_left < inside:
                finishes = [(lefts[i], decodes[i].num_computed_tokens) for i in range(n)
                            if lefts[i] < inside]
                if len(finishes) > 1:  # (mostly one: no sort call for it)
                    finishes.sort()
            if lazy:
                w = Window([], kv.num_used_blocks + first_need, lefts, min_left)
                w.lazy = True
                w.n0 = n
                w.kv0 = kv_tokens
                w.finishes = finishes
                step.window = w
                return self._open_lazy(step, k, until_s, edge_s)
            if self._has_terms and exact:
                # An exact window keeps each duration; its end times are their running sum
                # (the very additions ``_ends_python`` makes), not computed a second time.
                step_s = self._durations_python(n, kv_tokens, k, finishes)
                ends = [start_s] * k
                t = start_s
                for j in range(k):
                    t += step_s[j]
                    ends[j] = t
            elif self._has_terms:
                ends = self._ends_python(start_s, n, kv_tokens, k, finishes)
            else:
                ends = self._ends_numpy(start_s, n, kv_tokens, k, finishes,
                                        step_s if exact else None)
        w = Window(ends, kv.num_used_blocks + first_need, lefts, min_left)
        if rule is not None:
            k = min(len(ends), max(1, rule.steps_within(decodes, start_s, ends)))
            del ends[k:]
            del step_s[k:]
            w.rule = rule
            w.exact = exact
            w.step_s = step_s
        step.window = w
        return self._finish_open(step, until_s, edge_s)

    def _open_lazy(self, step: Step, k: int, until_s: float, edge_s: float) -> float:
        """``_finish_open`` for a lazy window of at most k steps: one pass adds up the
        step times (the floats ``_ends_python`` adds, in its order) without storing them,
        and stops where ``_finish_open``'s searches would cut: after the first step that
        ends at or after the next input or past ``until_s``, or with the last step that
        ends by the next bin edge (at least one). On the way it notes when each decoder
        finishing inside ends its last step (``Window.finish_times``)."""
        w = step.window
        assert w is not None
        hint = self._input_hint()
        stop_s = hint() if hint is not None else math.inf
        if until_s < stop_s:  # (the first end past until_s: ``>``, not ``>=``)
            stop_s = math.nextafter(until_s, math.inf)
        steps, t, t1 = self._scan(w, 0, step.start_s, k, stop_s, edge_s, w.finish_times)
        step.num_steps = steps
        step.num_tokens = len(step.decodes) * steps
        step.end_s = t
        step.last_boundary_s = t1
        return t

    def _scan(self, w: Window, a0: int, t: float, limit: int, stop_s: float, edge_s: float,
              finish_times: list[float] | None) -> tuple[int, float, float]:
        """Add up the end times of a lazy window's steps from a0 (starting at ``t``) without
        storing them, the floats ``_ends_python`` adds in its order, and stop after the
        first step that ends at or after ``stop_s``, or with the last one that ends by
        ``edge_s`` (at least one), or after step ``limit - 1``. Returns the steps from the
        window's start through the last one kept, its end and the end of the one before
        (``t`` if none). ``finish_times`` (a scan from the start only) gets the end of each
        kept finisher's last step."""
        finishes = w.finishes
        num_finishes = len(finishes)
        n, kv_tokens = w.n0, w.kv0
        t1 = t2 = t  # ends of steps j - 1 and j - 2
        steps = limit
        stopped = False
        a = 0
        f = 0
        while a < limit:
            left = finishes[f][0] if f < num_finishes else limit
            if left > limit:
                left = limit
            j = a if a > a0 else a0
            if left > j:
                base, per_kv, extra = self._decode_terms(n)
                kv = float(kv_tokens + n * j)
                step_kv = float(n)
                while j < left:
                    t2 = t1
                    t1 = t
                    # (``+ extra`` when extra is 0.0 adds nothing: a duration is positive)
                    t += (base + per_kv * kv) + extra
                    kv += step_kv
                    if t > edge_s:  # end with the step before, the last one by the edge
                        if j > a0:
                            steps = j
                            t = t1
                            t1 = t2
                        else:
                            steps = j + 1
                        stopped = True
                        break
                    if t >= stop_s:
                        steps = j + 1
                        stopped = True
                        break
                    j += 1
                if stopped:
                    break
            if left > a:
                a = left
            if f == num_finishes:
                break
            if finish_times is not None:
                finish_times.append(t)
            n -= 1
            kv_tokens -= finishes[f][1]
            f += 1
        if finish_times is not None:
            # Cut at the last step of a stretch: the decoders finishing there end with it.
            while f < num_finishes and finishes[f][0] <= steps:
                finish_times.append(t)
                f += 1
        return steps, t, t1

    def materialize(self, step: Step, m: int) -> None:
        """Store the end times of ``step``'s first m steps, if its window is lazy and has
        not yet (the same floats ``_ends_python`` gives, from where the stored ones end)."""
        w = step.window
        assert w is not None
        ends = w.ends
        a0 = len(ends)
        if not w.lazy or a0 >= m:
            return
        t = ends[a0 - 1] if a0 else step.start_s
        ends.extend([t] * (m - a0))
        self._fill_ends(ends, a0, t, w.n0, w.kv0, w.finishes, m)

    def _step_at(self, step: Step, now_s: float, old: int) -> tuple[int, float, float]:
        """The first of the window's first ``old`` steps that ends at or after ``now_s``
        (``old`` when none), with its end and its start: ``bisect_left`` over the end times,
        by a pass that adds them up for a lazy window."""
        w = step.window
        assert w is not None
        ends = w.ends
        a0 = len(ends)
        if not w.lazy or a0 >= old or (a0 and ends[a0 - 1] >= now_s):
            j = _first_at_or_after(ends, now_s, old if old < a0 else a0)
        else:
            # Past the stored ones: store on through the step in progress (settling the
            # window, which mostly comes next, reads them: one pass, not a scan and a
            # store), or through the last step if every one ends before now.
            self._store_ends_until(step, old, now_s)
            j = len(ends) - 1 if ends[-1] >= now_s else old
        if j >= old:
            return old, ends[old - 1], ends[old - 2] if old > 1 else step.start_s
        return j, ends[j], ends[j - 1] if j else step.start_s

    def _store_ends_until(self, step: Step, limit: int, stop_s: float) -> None:
        """Store a lazy window's end times on from the last stored one, through the first
        that ends at or after ``stop_s`` or through step ``limit - 1`` (appended: how many
        is not known before)."""
        w = step.window
        assert w is not None
        ends = w.ends
        a0 = len(ends)
        self._fill_ends(ends, a0, ends[a0 - 1] if a0 else step.start_s, w.n0, w.kv0,
                        w.finishes, limit, stop_s)

    def _finish_open(self, step: Step, until_s: float, edge_s: float) -> float:
        """Cut the window's k steps at the next input, ``until_s`` or the bin edge, and set
        its length."""
        w = step.window
        assert w is not None
        ends = w.ends
        k = len(ends)
        hint = self._input_hint()
        steps = k
        if hint is not None or until_s < math.inf or edge_s < math.inf:
            # End after the first step that ends at or after the next input (stopping early
            # is always exact), or after the first one past until_s, or with the last step
            # that ends by the next bin edge (at least one step).
            # (A stop at or past the last end changes nothing: skip its search.)
            stop_s = hint() if hint is not None else math.inf
            last_s = ends[-1]
            cut = k - 1
            if stop_s < last_s:
                cut = min(cut, bisect.bisect_left(ends, stop_s))
            if until_s < last_s:
                cut = min(cut, bisect.bisect_right(ends, until_s))
            if edge_s < last_s:
                cut = min(cut, max(0, bisect.bisect_right(ends, edge_s) - 1))
            steps = 1 + cut
        self.set_steps(step, steps)
        return step.end_s

    def _open_speculative(self, step: Step, until_s: float, through: bool,
                          spec: Emission) -> float | None:
        """``open`` for a speculating replica. Decoder i, having emitted ``d_i`` tokens past
        its first with ``l_i`` to go, has emitted ``G_i(j) = spec.emitted(d_i, j)`` after j
        steps and finishes after ``spec.steps_for(d_i, l_i)``; step j's KV is the sum of
        ``computed_i + G_i(j)`` over the decoders still in, summed per step with numpy (the
        decoders' schedules are out of phase), and its time ``step_time_s((), n_j, kv_j)``
        added in order, as step by step adds them."""
        decodes = step.decodes
        n = len(decodes)
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        first_need = 0
        lefts: list[int] = []
        emitted0: list[tuple[int, int]] = []
        for r in decodes:
            need = blocks_short(r, r.num_computed_tokens + 1, bs, per_entry)
            if need > 0:
                first_need += need
            d, todo = r.num_output_tokens - 1, r.max_output_tokens - r.num_output_tokens
            emitted0.append((d, todo))
            lefts.append(spec.steps_for(d, todo))
        free = kv.num_free_blocks - first_need
        if free < 0:
            return None
        min_left = min(lefts)
        max_steps = max(lefts) if through else min_left
        start_s = step.start_s
        edge_s = self.next_edge_s(start_s)
        if max_steps < 2:
            k = 1
        elif self._input_hint() is None and until_s == math.inf and edge_s == math.inf:
            k = max_steps if max_steps < self.cap else self._capped()
        else:
            first_s = self.step_model.step_time_s(
                (), n, sum(r.num_computed_tokens for r in decodes))
            k = 1 if start_s + first_s >= min(until_s, edge_s) else self._cap_steps(
                max_steps, start_s, first_s, until_s, edge_s)
        # Stop early (always exact) to bound the (decoders x steps) arrays below.
        k = min(k, max(1, (1 << 20) // n))
        if k > 1:
            k = _spec_steps_within(decodes, emitted0, spec, bs, per_entry, free, k)
        computed = np.array([r.num_computed_tokens for r in decodes], dtype=np.int64)
        d0 = np.array([d for d, _ in emitted0], dtype=np.int64)
        p, q = spec.tau_num, spec.tau_den
        js = np.arange(k, dtype=np.int64)
        m0 = -((-(d0 + 1) * q) // p) - 1  # Emission._last_step
        tokens = computed[:, None] + np.maximum(
            ((m0[:, None] + js[None, :]) * p) // q - d0[:, None], 0)
        active = js[None, :] < np.array(lefts, dtype=np.int64)[:, None]
        kv_by_step = np.where(active, tokens, 0).sum(axis=0).tolist()
        size_by_step = active.sum(axis=0).tolist()
        step_time = self.step_model.step_time_s
        ends: list[float] = []
        t = start_s
        for size, kv_j in zip(size_by_step, kv_by_step, strict=True):
            t += step_time((), size, kv_j)
            ends.append(t)
        w = Window(ends, kv.num_used_blocks + first_need, lefts, min_left)
        w.emitted0 = emitted0
        step.window = w
        return self._finish_open(step, until_s, edge_s)

    def _decode_step_s(self, n: int, kv_tokens: int) -> float:
        """``step_time_s((), n, kv_tokens)``, from the decode terms where the model has them
        (the same floats: ``decode_terms_s`` promises it; cheaper, the terms are kept)."""
        if not self._has_terms:
            shared = self._shared_model
            if shared is not None:
                return shared.decode_step_s(n, kv_tokens)
            return self.step_model.step_time_s((), n, kv_tokens)
        base, per_kv, extra = self._decode_terms(n)
        return (base + per_kv * float(kv_tokens)) + extra

    def _decode_terms(self, n: int) -> tuple[float, float, float]:
        """The model's decode terms of a batch of ``n``, computed once per size."""
        base_by_n = self._base_by_n
        if n < len(base_by_n):
            base = base_by_n[n]
            if base >= 0.0:  # (a step's fixed part is positive: computed)
                return base, self._per_kv_by_n[n], self._extra_by_n[n]
        base, per_kv, extra = self.step_model.decode_terms_s(n)  # type: ignore[attr-defined]
        grow = n + 1 - len(base_by_n)
        if grow > 0:
            base_by_n.extend([-1.0] * grow)
            self._per_kv_by_n.extend([0.0] * grow)
            self._extra_by_n.extend([0.0] * grow)
        base_by_n[n] = base
        self._per_kv_by_n[n] = per_kv
        self._extra_by_n[n] = extra
        return base, per_kv, extra

    def _ends_python(self, start_s: float, n: int, kv_tokens: int, k: int,
                     finishes: list[tuple[int, int]]) -> list[float]:
        """End times of k decode steps from ``start_s``, in plain Python with the model's
        decode terms: the same float operations as ``step_time_s`` and the same additions as
        step by step."""
        # (Filled by index, and loops over a named int: in the compiled engine an append
        # checks for room each time, and ``_`` is a boxed object, made anew every step. The
        # stretches are ``_stretches``', walked in place: no list of boxed tuples.)
        ends: list[float] = [start_s] * k
        self._fill_ends(ends, 0, start_s, n, kv_tokens, finishes, k)
        return ends

    def _fill_ends(self, ends: list[float], a0: int, t: float, n: int, kv_tokens: int,
                   finishes: list[tuple[int, int]], k: int, stop_s: float = math.inf) -> int:
        """Put the end times of a window's steps a0 .. k - 1 at ``ends[a0:k]``, its n
        decoders holding ``kv_tokens`` at its start and step a0 starting at ``t``
        (``finishes``: those finishing inside, as ``_ends_python`` takes them; any past step
        k are ignored), or only through the first that ends at or after ``stop_s``: by index
        where ``ends`` has room, appended past its end. Returns the index after the last."""
        size = len(ends)
        a = 0
        f = 0
        num_finishes = len(finishes)
        while a < k:
            left, c = finishes[f] if f < num_finishes else (k, 0)
            f += 1
            if left > k:
                left = k
            if left > a:
                j0 = a if a > a0 else a0
                if left > j0:
                    base, per_kv, extra = self._decode_terms(n)
                    # Floats throughout: exact, token counts stay far below 2**53.
                    kv = float(kv_tokens + n * j0)
                    step_kv = float(n)
                    for j in range(j0, left):
                        # (``+ extra`` when extra is 0.0 adds nothing: a duration is positive)
                        t += (base + per_kv * kv) + extra
                        if j < size:
                            ends[j] = t
                        else:
                            ends.append(t)
                        if t >= stop_s:
                            return j + 1
                        kv += step_kv
                a = left
            n -= 1
            kv_tokens -= c
        return k

    def _durations_python(self, n: int, kv_tokens: int, k: int,
                          finishes: list[tuple[int, int]]) -> list[float]:
        """The durations of ``_ends_python``'s k steps, by the same float operations (an
        exact window's, which adds them to attained service one by one; kept apart so that
        ordinary windows pay nothing for them)."""
        step_s: list[float] = [0.0] * k
        for a, b, size, kv_at_a in _stretches(n, kv_tokens, k, finishes):
            base, per_kv, extra = self._decode_terms(size)
            kv = float(kv_at_a)
            step_kv = float(size)
            if extra:
                for j in range(a, b):
                    step_s[j] = (base + per_kv * kv) + extra
                    kv += step_kv
            else:
                for j in range(a, b):
                    step_s[j] = base + per_kv * kv
                    kv += step_kv
        return step_s

    def _ends_numpy(self, start_s: float, n: int, kv_tokens: int, k: int,
                    finishes: list[tuple[int, int]],
                    step_s: list[float] | None) -> list[float]:
        """``_ends_python`` for models with only ``decode_step_times_s``: one vectorized
        call per stretch, then ``np.cumsum`` from ``start_s`` (sequential adds, as step by
        step); the durations go to ``step_s`` when given (an exact window's). A window of
        at most ``SCALAR_WINDOW_STEPS`` steps of a model that allows it (``scalar_windows``)
        is priced step by step with the same adds."""
        if k <= SCALAR_WINDOW_STEPS and self._scalar_windows:
            model = self.step_model
            shared = self._shared_model
            step_time = model.step_time_s
            no_chunks: tuple[tuple[int, int], ...] = ()
            ends: list[float] = []
            t = start_s
            for a, b, size, kv_at_a in _stretches(n, kv_tokens, k, finishes):
                for j in range(b - a):
                    d = (shared.decode_step_s(size, kv_at_a + size * j)
                         if shared is not None
                         else step_time(no_chunks, size, kv_at_a + size * j))
                    if step_s is not None:
                        step_s.append(d)
                    t += d
                    ends.append(t)
            return ends
        acc = np.empty(k + 1)
        acc[0] = start_s
        for a, b, size, kv_at_a in _stretches(n, kv_tokens, k, finishes):
            acc[1 + a:1 + b] = self.step_model.decode_step_times_s(
                size, kv_at_a + size * np.arange(b - a, dtype=np.int64))
        cumulative: list[float] = np.cumsum(acc)[1:].tolist()
        if step_s is not None:
            step_s.extend(acc[1:].tolist())
        return cumulative

    def next_edge_s(self, t: float) -> float:
        """The first timeline bin edge after ``t`` (edges are origin + m x width, the same
        floats whoever asks)."""
        if self.bin_s == math.inf:
            return math.inf
        m = math.floor((t - self.bin_origin_s) / self.bin_s) + 1
        edge = self.bin_origin_s + m * self.bin_s
        while edge <= t:  # rounding
            m += 1
            edge = self.bin_origin_s + m * self.bin_s
        return edge

    def _cap_steps(self, max_steps: int, start_s: float, first_s: float,
                   until_s: float, edge_s: float) -> int:
        # Decode steps never get shorter as KV grows, so no more steps than this fit before
        # a known stop.
        stop_s = min(until_s, edge_s)
        if stop_s < math.inf:
            max_steps = min(max_steps, int((stop_s - start_s) / first_s) + 2)
        hint = self._input_hint()
        if hint is not None:
            until_hint = hint() - start_s
            if until_hint < math.inf:
                max_steps = min(max_steps, int(until_hint / first_s) + 2)
        elif max_steps >= self.cap:
            max_steps = self._capped()
        return max_steps

    def _input_hint(self) -> Callable[[], float] | None:
        """Where the window's next input may come (``next_input_hint_s``), except for a
        window beside another job (``ends_beside``): that one runs through the other job's
        end, which an arrival then does not move (it queues behind the job), so a stop at
        the arrival would only cut it short."""
        return self.next_input_hint_s if self.ends_beside is None else None

    def _capped(self) -> int:
        """A window that would reach the cap: cap it, and let the next one be longer."""
        k = self.cap
        self.cap = min(2 * k, 1 << 14)
        return k

    def settle(self, step: Step, num_commit: int, finish: FinishFn) -> None:
        """Take the blocks of ``step``'s window through its last step and commit the tokens
        of its first ``num_commit`` steps (all of them at its end; all but the step in
        progress when cut), finishing the requests whose last step is before its last one
        (``finish(request, time)``); those finishing at its last step are listed in
        ``at_end``. Computes the KV block-seconds of the committed steps."""
        w = step.window
        assert w is not None and not w.settled
        if self.spec is not None:
            self._settle_speculative(step, num_commit, finish, self.spec)
            return
        w.settled = True
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        k, m = step.num_steps, num_commit
        if w.lazy:
            self.materialize(step, m)
        ends = w.ends
        start_s = step.start_s
        horizon_s = ends[m - 1] if m else start_s
        taken = 0
        # Blocks in use change only when a decoder takes a new block at the start of step
        # j >= 1, or frees all at a finish; the change lasts until the horizon.
        late = 0.0
        before: list[tuple[int, int, Request]] = []
        at_end = w.at_end
        decodes = step.decodes
        # An exact window (a repeat rule's) adds each step's time to attained service one
        # step at a time, as step by step does (one sum differs in its last bits, and the
        # rule's policy decides on it), and counts the blocks taken at each step.
        exact = w.exact
        gaps_s: list[float] = []
        new_at: list[int] = []
        if exact:
            prev_s = start_s
            for j in range(m):
                gaps_s.append(ends[j] - prev_s)
                prev_s = ends[j]
            new_at = [0] * (m + 1)
        i = -1
        for r in decodes:  # (iterating reads the list's items in place; ``decodes[i]`` is a call)
            i += 1
            c = r.num_computed_tokens
            # ``w.lefts[i]``, from the request: untouched since the window opened, and read
            # here anyway (the list's ints are cold by now, the request's fields are not)
            left = r.max_output_tokens - r.num_output_tokens
            s_i = left if left < k else k  # steps it takes blocks for
            t_i = left if left < m else m  # steps it commits
            # first step needing a block
            after_next, extra = blocks_after_next_token_and_short(r, c + s_i, bs, per_entry)
            j = after_next * bs - c
            stop = s_i if s_i < m else m
            while j < stop:
                late += horizon_s - ends[j - 1]
                if exact:
                    new_at[j] += 1
                j += bs
            if extra > 0:
                r.num_private_blocks += extra
                taken += extra
            r.num_computed_tokens = c + t_i
            r.num_computed_tokens_total += t_i
            if t_i:
                if exact:
                    service_s = r.service_s
                    for j in range(t_i):
                        service_s += gaps_s[j]
                    r.service_s = service_s
                else:
                    r.service_s += ends[t_i - 1] - start_s
            r.num_output_tokens += t_i
            if left < k:
                before.append((left, i, r))
            elif left == k and m == k:
                at_end.append(r)
        kv.num_free_blocks -= taken
        if before:
            before.sort()  # finish order: by step, then batch order (as step by step)
            for left, _, r in before:
                t = ends[left - 1]
                used = kv.num_used_blocks
                finish(r, t)
                late -= (horizon_s - t) * (used - kv.num_used_blocks)
                w.finish_steps.append(left)
        w.kv_seconds = w.used0 * (horizon_s - start_s) + late
        if exact:
            used = w.used0
            used_by_step: list[int] = []
            for j in range(m):
                used += new_at[j]
                used_by_step.append(used)
            w.used_by_step = used_by_step

    def _settle_speculative(self, step: Step, num_commit: int, finish: FinishFn,
                            spec: Emission) -> None:
        """``settle`` for a speculating replica: the same accounting, with each decoder's
        tokens after j steps and its block boundaries from its emission schedule."""
        w = step.window
        assert w is not None
        w.settled = True
        kv = self.kv
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        k, m = step.num_steps, num_commit
        ends = w.ends
        horizon_s = ends[m - 1] if m else step.start_s
        taken = 0
        late = 0.0
        before: list[tuple[int, int, Request]] = []
        at_end = w.at_end
        for i, (r, left) in enumerate(zip(step.decodes, w.lefts, strict=True)):
            d, todo = w.emitted0[i]
            c = r.num_computed_tokens
            s_i = left if left < k else k
            t_i = left if left < m else m
            # Tokens it must emit before a step needs one block more (step j holds
            # c + G(j) + 1 slots plus the lookahead, as the plan allocates them).
            short = (blocks_after_next_token(r, bs, per_entry) * bs - c
                     - r.num_lookahead_tokens)
            stop = s_i if s_i < m else m
            j = spec.steps_for(d, short)
            while j < stop:
                late += horizon_s - ends[j - 1]
                short += bs
                j = spec.steps_for(d, short)
            extra = blocks_short(r, c + spec.emitted(d, s_i - 1) + 1, bs, per_entry)
            if extra > 0:
                r.num_private_blocks += extra
                taken += extra
            got = todo if t_i == left else spec.emitted(d, t_i)
            r.num_computed_tokens = c + got
            r.num_computed_tokens_total += got
            if t_i:
                r.service_s += ends[t_i - 1] - step.start_s
            r.num_output_tokens += got
            if left < k:
                before.append((left, i, r))
            elif left == k and m == k:
                at_end.append(r)
        kv.num_free_blocks -= taken
        if before:
            before.sort()
            for left, _, r in before:
                t = ends[left - 1]
                used = kv.num_used_blocks
                finish(r, t)
                late -= (horizon_s - t) * (used - kv.num_used_blocks)
                w.finish_steps.append(left)
        w.kv_seconds = w.used0 * (horizon_s - step.start_s) + late

    def emitted_through(self, step: Step, num_steps: int) -> int:
        """Tokens the decoders of ``step``'s speculative window emit in its first
        ``num_steps`` steps (each stops at its output limit)."""
        spec = self.spec
        w = step.window
        assert spec is not None and w is not None
        total = 0
        for (d, todo), left in zip(w.emitted0, w.lefts, strict=True):
            total += todo if left <= num_steps else spec.emitted(d, num_steps)
        return total

    @staticmethod
    def set_steps(step: Step, steps: int) -> None:
        ends = step.window.ends  # type: ignore[union-attr]
        step.num_steps = steps
        step.num_tokens = len(step.decodes) * steps
        step.end_s = ends[steps - 1]
        step.last_boundary_s = ends[steps - 2] if steps > 1 else step.start_s

    def peek(self, step: Step, now_s: float, exact: bool) -> tuple[int, int, int] | None:
        """What ``cut`` and ``settle`` would leave at ``now_s``, without doing it: (decode
        steps every decoder of the window has committed, fewest and most blocks taken beyond
        those held now), as step by step would show them at ``now_s``; the blocks exactly
        (a pass over the decoders) when ``exact``, else bounds (each decoder holds its
        computed tokens' KV, so k steps take at most ceil(k / block size) blocks each).
        None when that is not one offset for all (a speculating replica, or a decoder that
        finished before now)."""
        w = step.window
        if w is None or w.settled or self.spec is not None or w.rule is not None:
            return None  # (a rule's window may leave running requests paused)
        old = step.num_steps
        k = min(old, 1 + self._step_at(step, now_s, old)[0])  # the step in progress
        if w.min_left < k:  # (a decoder's last step is before the one in progress)
            return None
        kv = self.kv
        if not exact:
            return k - 1, 0, -(-k // kv.block_size) * len(step.decodes)
        bs, per_entry = kv.block_size, kv.blocks_per_entry
        taken = 0
        for r in step.decodes:
            extra = blocks_short(r, r.num_computed_tokens + k, bs, per_entry)
            if extra > 0:
                taken += extra
        return k - 1, taken, taken

    def cut(self, step: Step, now_s: float) -> bool:
        """Shorten ``step``'s unsettled window to end at the first boundary at or after
        ``now_s``. Returns whether the end moved."""
        w = step.window
        old = step.num_steps
        if w is None or w.settled or old == 1 or now_s > step.last_boundary_s:
            return False
        j, end_s, start_s = self._step_at(step, now_s, old)
        steps = 1 + j
        self.cap = max(64, 2 * steps)
        step.num_steps = steps
        step.num_tokens = len(step.decodes) * steps
        step.end_s = end_s
        step.last_boundary_s = start_s
        return True


def _stretches(n: int, kv_tokens: int, k: int,
               finishes: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """The window's steps [0, k) cut where decoders finish: (first step, end step, batch
    size, KV tokens at the first step) per stretch. ``finishes`` holds (steps left, computed
    tokens) of the decoders finishing inside, sorted; step j's KV is each remaining decoder's
    computed tokens plus j."""
    out: list[tuple[int, int, int, int]] = []
    a = 0
    for left, c in [*finishes, (k, 0)]:
        if left > a:
            out.append((a, left, n, kv_tokens + n * a))
            a = left
        n -= 1
        kv_tokens -= c
    return out


def _steps_within(decodes: list[Request], bs: int, per_entry: int, free: int, k: int) -> int:
    """Largest number of steps (at most k) whose blocks after the first step fit ``free``."""
    # A decoder takes a block at its first boundary j and every bs steps after, so the
    # blocks taken at step j are those first taken there plus those taken at j - bs: one
    # count per decoder and one pass over the steps, not one count per boundary crossed.
    new_blocks = [0] * k
    for r in decodes:
        c = r.num_computed_tokens
        j = blocks_after_next_token(r, bs, per_entry) * bs - c
        if j < k:
            new_blocks[j] += 1
    taken = 0
    for j in range(k):
        b = new_blocks[j]
        if j >= bs:
            b += new_blocks[j - bs]
            new_blocks[j] = b
        taken += b
        if taken > free:
            return j
    return k


def _spec_steps_within(decodes: list[Request], emitted0: list[tuple[int, int]], spec: Emission,
                       bs: int, per_entry: int, free: int, k: int) -> int:
    """``_steps_within`` for speculating decoders: block boundaries from the schedule."""
    new_blocks = [0] * k
    for r, (d, _) in zip(decodes, emitted0, strict=True):
        c = r.num_computed_tokens
        short = blocks_after_next_token(r, bs, per_entry) * bs - c - r.num_lookahead_tokens
        j = spec.steps_for(d, short)
        while j < k:
            new_blocks[j] += 1
            short += bs
            j = spec.steps_for(d, short)
    taken = 0
    for j, b in enumerate(new_blocks):
        taken += b
        if taken > free:
            return j
    return k


def _first_at_or_after(ends: list[float], t: float, hi: int) -> int:
    """``bisect.bisect_left(ends, t, 0, hi)``, written out when compiled: there the library
    call is generic (~0.7k instructions; a group planner's reads of its members' windows
    make tens of thousands), while interpreted the library's C loop is the faster."""
    if not COMPILED:
        return bisect.bisect_left(ends, t, 0, hi)
    lo = 0
    while lo < hi:
        mid = (lo + hi) >> 1
        if ends[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo
