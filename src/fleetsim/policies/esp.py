"""LoongServe's scheduler (elastic sequence parallelism, SOSP'24, arXiv:2404.09526) as a group
planner (``serving/groups.py``): a group of instances, each member one batch of requests on a
set of instances, its degree of parallelism the set's size.

It follows ``router/manager.py::_step`` of the public code (``LoongServe/LoongServe``),
mapped onto members:

1. admission (``esp.admission``): when no member has work, or ``max_wait_steps`` decode
   iterations (``avg_decoding_s`` each, the scheduler's own estimate) after the last
   prefill iteration ended, new requests are taken from the group's queue; a refused
   admission is retried after each finish and every ``max_wait_steps`` iterations;
2. the prefill iteration (``_schedule_new_req_list_with_decoding``): decode members are
   paused, first those needed for room, then each whose instances speed the prefill up more
   than pausing slows the batch down (``esp.rules.should_pause``); the DP
   (``esp.dp.plan_prefill``) splits the new requests into batches over the idle and lent
   instances, each batch a member of its instances; a paused member merges into the batch
   that takes its instances (its requests, with their KV, join it), as the code merges paused
   batches into the new batch that shares their instances;
3. while a prefill iteration runs, instances no batch holds take the waiting requests whose
   prefill is predicted to end before the iteration does (``generate_greedy_req_list``, the
   code's greedy refill; ``refill_idle``);
4. between admissions (each ``max_wait_steps`` iterations): a decoding member keeps only the
   instances its KV and the next iterations' tokens need (the code's proactive scale-down,
   ``esp.rules.place_scaled_down``), or takes idle instances when its KV grows past them
   (scale-up); a member with no work gives its instances back.

The scheduler predicts with ``T_k = A_k + B_k sum(l) + C_k sum(l^2)`` (``esp.cost.
AnalyticalModel``), fitted, as the artifact does, to profiled prefills: here the profile is
the group's own step model, read through the view on the first plan.

Before a prefill iteration, decode members are merged to free instances while that pays
(``_minimize_decoding_occupied_instances``; the move's time is weighed, not charged).

The code decides every iteration; here the planner polls every ``max_wait_steps`` iterations
and after each arrival and finish, and leaves out the polls that cannot change anything
(every busy member in one prefill step: ``_skip_polls``), keeping their times and their
effect on the next admission, so the results are those of polling throughout.

Not modelled (each a difference from the code, stated in docs/reproductions.md): members
decode independently rather than in one lock step; a member's KV is one pool over its
instances (the step model spreads it evenly); preemption when KV runs out is the member's
batching policy's (recompute), inside the member.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetsim.esp.admission import Admission, Pending, Reservation, Resident
from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import AnalyticalModel, fit_analytical
from fleetsim.esp.dp import plan_prefill
from fleetsim.esp.rules import migration_pays, should_pause
from fleetsim.policies.group_planners import register_group_planner
from fleetsim.serving.contract import GroupPlan, GroupView
from fleetsim.serving.request import Request

# (step model key, instances, KV tokens per instance) -> the fit: profiling is ~84 prefills
# priced by the step model, the same in every run of one layout (a sweep's rates, the
# benchmark's warm-up); bounded, as a sweep over step models could grow it.
_FITS: dict[tuple[object, int, int], AnalyticalModel] = {}
_MAX_FITS = 64


def _fit(view: GroupView, num_instances: int, cap: int) -> AnalyticalModel:
    """LoongServe's analytical model, fitted to the group's step model (once per key)."""
    key = view.step_model_key
    fit = _FITS.get((key, num_instances, cap)) if key is not None else None
    if fit is None:
        fit = fit_analytical(
            lambda lengths, k: view.step_time_s(k, [(x, 0) for x in lengths], 0, 0),
            num_instances, cap)
        if key is not None:
            if len(_FITS) >= _MAX_FITS:
                _FITS.clear()
            _FITS[(key, num_instances, cap)] = fit
    return fit


@register_group_planner("esp")
@dataclass(slots=True)
class EspPlanner:
    """LoongServe's admission, pause rule, prefill DP and scaling, as a group planner. The
    fields are the artifact's server flags (``test/longserve/5-start-api-server.py``)."""

    max_running: int = 1024
    """``--running_max_req_size`` (1,024 for ShareGPT and Mixed, 256 for L-Eval, LV-Eval)."""
    max_wait_steps: int = 10
    """Decode iterations between admissions while requests run (``--max_wait_tokens``)."""
    max_prefill_s: float = 5.0
    """Predicted prefill time a multi-request batch may take (``--max_prefill_time``)."""
    batch_max_tokens: int = 500_000
    """Input tokens of one prefill iteration (``--batch_max_tokens``)."""
    max_out_of_order: int = 4
    """Admissions in a row that may skip a request (``--max_num_ooe``)."""
    avg_decoding_s: float = 0.022
    """Decode iteration time the scheduler assumes (``--avg_decoding_time`` 22 ms)."""
    elastic: bool = True
    """False: LoongServe without ESP (one member of every instance, a fixed degree)."""
    refill_idle: bool = True
    """Refill instances idle during a prefill iteration with short prefills that end before
    it (``generate_greedy_req_list``)."""
    admission: Admission = field(init=False, repr=False)
    predictor: AnalyticalModel | None = field(init=False, default=None, repr=False)
    num_prefill_batches: int = field(init=False, default=0)
    num_paused: int = field(init=False, default=0)
    num_refills: int = field(init=False, default=0)
    num_merges: int = field(init=False, default=0)
    _iteration_end_s: float = field(init=False, default=0.0, repr=False)
    dop_histogram: dict[int, int] = field(init=False, default_factory=dict)
    _next_admit_s: float = field(init=False, default=0.0, repr=False)
    # Polls left out (``_skip_polls``): the first one's time and the wake that ends them.
    _skipped: tuple[float, float] | None = field(init=False, default=None, repr=False)
    _refill_walked: bool = field(init=False, default=False, repr=False)
    _outstanding: list[Request] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        config = EspConfig(max_running=self.max_running, max_wait_steps=self.max_wait_steps,
                           max_prefill_s=self.max_prefill_s,
                           batch_max_tokens=self.batch_max_tokens,
                           max_out_of_order=self.max_out_of_order,
                           avg_decoding_s=self.avg_decoding_s, elastic=self.elastic)
        self.admission = Admission(config)

    def report(self) -> dict[str, object]:
        """What it did: prefill batches, members paused, degrees of parallelism used."""
        return {"num_prefill_batches": self.num_prefill_batches, "num_paused": self.num_paused,
                "num_refills": self.num_refills, "num_merges": self.num_merges,
                "dop_histogram": dict(sorted(self.dop_histogram.items())),
                "analytical_model_mean_rel_error": (
                    self.predictor.mean_rel_error if self.predictor is not None else None)}

    # ---- the plan --------------------------------------------------------------------
    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        n = view.num_instances
        cap = view.num_kv_blocks_per_instance * view.block_size
        if self.predictor is None:
            self.predictor = _fit(view, n, cap)
        if self._skipped is not None:
            self._catch_up(now_s)
        # Members read without cutting their windows: a running request's token counts lag
        # by its member's ``num_steps_ahead`` (the same for all of them).
        running: list[Sequence[Request]] = []  # (read, not changed)
        ahead: list[int] = []
        busy: list[bool] = []
        # Members with a prefill queued or in progress (a window's lag cancels in the test,
        # and a window with steps done holds only decodes).
        prefills: list[bool] = []
        for m in range(n):
            state = view.member_state(m)
            running.append(state.running)
            ahead.append(state.num_steps_ahead)
            busy.append(bool(state.running or state.waiting))
            prefills.append(bool(state.waiting) or (not state.num_steps_ahead and any(
                r.num_computed_tokens < r.num_tokens - 1 for r in state.running)))
        used: list[int] | None = None  # KV tokens per instance, read when needed
        before = view.instances_by_member
        alloc = list(before)
        merge: list[tuple[int, int]] = []
        if self.elastic:
            merge = self._scale(view, alloc, busy, prefills, running)
        else:
            alloc = [tuple(range(n))] + [()] * (n - 1)
        assign: list[tuple[int, int]] = []
        waiting = view.waiting
        # A prefill iteration ends when its longest prefill does; the next admission comes
        # ``max_wait_steps`` decode iterations later (or as soon as nothing runs).
        prefilling = any(prefills)
        if prefilling:
            self._next_admit_s = max(self._next_admit_s,
                                     now_s + self.max_wait_steps * self.avg_decoding_s)
        may_admit = not any(busy) or now_s >= self._next_admit_s
        self._refill_walked = False
        if (waiting and not may_admit and prefilling and self.elastic and self.refill_idle
                and now_s < self._iteration_end_s):
            refill = self._refill(view, waiting, before, alloc, busy, running, ahead, cap,
                                  now_s)
            if refill:
                slot = next(m for m in range(n) if not alloc[m] and not busy[m])
                alloc[slot] = self._idle_instances(alloc, busy)
                assign.extend((r.id, slot) for r in refill)
                self._count(len(alloc[slot]))
                self.num_refills += 1
                waiting = [r for r in waiting if r not in refill]
                self._outstanding.extend(refill)
        if waiting and may_admit:
            residents = [Resident(r.num_computed_tokens + d, r.max_output_tokens
                                  - r.num_output_tokens - d, r.num_output_tokens + d)
                         for rs, d in zip(running, ahead, strict=True) for r in rs]
            # Read lazily: admission may stop before the end of the queue.
            pending = (Pending(r.num_tokens, r.max_output_tokens - r.num_output_tokens)
                       for r in waiting)
            if used is None:
                used = self._used_by_instance(view, before, cap)
            self._note_finishes()
            chosen = [waiting[i] for i in self.admission.take(
                pending, residents, used, cap, self.predictor.predict_s)]
            # Output tokens each member's requests have emitted (the pause rule's input).
            emitted = [sum(r.num_output_tokens for r in rs) + d * len(rs)
                       for rs, d in zip(running, ahead, strict=True)]
            if chosen and self._prefill(view, chosen, alloc, busy, running, emitted, used, cap,
                                        assign, merge, now_s):
                self._next_admit_s = now_s + self.max_wait_steps * self.avg_decoding_s
                waiting = [r for r in waiting if r not in chosen]
                self._outstanding.extend(chosen)
        # Plan again when the next admission is due, and every ``max_wait_steps`` iterations
        # while anything runs (scaling). An admission refused now is retried at those times
        # and after each finish (the group asks then): what it waits for (KV, running slots)
        # only frees at finishes, where the code retries every iteration.
        wake_s = None
        if any(busy) or assign:
            wake_s = now_s + self.max_wait_steps * self.avg_decoding_s
        if waiting and self._next_admit_s > now_s:
            wake_s = min(wake_s, self._next_admit_s) if wake_s is not None else (
                self._next_admit_s)
        if (wake_s is not None and prefilling and not assign and not merge
                and all(a == b for a, b in zip(alloc, before, strict=True))):
            wake_s = self._skip_polls(view, busy, prefills, running, wake_s)
        return GroupPlan(tuple(alloc), tuple(assign), wake_s, tuple(merge))

    def _skip_polls(self, view: GroupView, busy: list[bool], prefills: list[bool],
                    running: list[Sequence[Request]], wake_s: float) -> float:
        """The wake that replaces the polls this plan would be followed by while nothing
        can change. A member prefills, this plan changes nothing, and every busy member is
        in a step: one prefill step, or decodes whose instances stay what they need until
        the step ends (the scaling bound at both ends of the step gives the same count).
        Until the first of those steps ends (or an arrival or a finish, which plan at once)
        every poll reads the same queues and the same scaling, so it changes nothing either
        (the refill's prediction only gets later against a nearer iteration end, when it
        failed before its walk or the running requests do not move; admission waits while
        a prefill runs) and only moves the next admission on (``_catch_up`` does that when
        the next plan comes). The polls' times are the same chain of sums, so the plan
        after them comes at the same time."""
        bpi, bs = view.num_kv_blocks_per_instance, view.block_size
        end_s = math.inf
        for m, is_busy in enumerate(busy):
            if not is_busy:
                continue
            step_end_s = view.member_step_end_s(m)
            if step_end_s is None:
                return wake_s
            # A prefilling member is in one ordinary step (a window opens only with nothing
            # to prefill, and a request queued on a member cuts its window): its counts
            # hold until the step ends.
            if not prefills[m]:  # decoding: its KV grows, its scaling must not change
                if self._refill_walked or not self.elastic:
                    return wake_s
                extra = self._headroom_blocks(len(running[m]), bs)
                fewest = view.member_used_blocks_range(m)[0]
                most = view.member_used_blocks_at_step_end(m)
                if -(-(fewest + extra) // bpi) != -(-(most + extra) // bpi):
                    return wake_s
            end_s = min(end_s, step_end_s)
        if wake_s >= end_s:
            return wake_s
        first_s = wake_s
        while wake_s < end_s:
            wake_s = wake_s + self.max_wait_steps * self.avg_decoding_s
        self._skipped = (first_s, wake_s)
        return wake_s

    def _catch_up(self, now_s: float) -> None:
        """What the polls left out before ``now_s`` would have done: each put the next
        admission ``max_wait_steps`` iterations after it (a prefill was running)."""
        assert self._skipped is not None
        poll_s, until_s = self._skipped
        self._skipped = None
        while poll_s < now_s and poll_s < until_s:
            self._next_admit_s = max(self._next_admit_s,
                                     poll_s + self.max_wait_steps * self.avg_decoding_s)
            poll_s = poll_s + self.max_wait_steps * self.avg_decoding_s

    def _note_finishes(self) -> None:
        done = [r for r in self._outstanding if not math.isnan(r.finish_s)]
        if done:
            for r in done:
                self.admission.finished(r.num_output_tokens)
            self._outstanding = [r for r in self._outstanding if math.isnan(r.finish_s)]

    @staticmethod
    def _used_by_instance(view: GroupView, alloc: Sequence[tuple[int, ...]], cap: int,
                          only: Sequence[int] | None = None) -> list[int]:
        """KV tokens on each instance: a member's KV fills its instances in order (the
        code's placement keeps it on as few as possible, most used first). ``only``: exact
        for these instances (the members holding them are read), 0 for the others."""
        used = [0] * view.num_instances
        for m, insts in enumerate(alloc):
            if not insts or (only is not None and not any(i in only for i in insts)):
                continue
            left = view.member_used_blocks(m) * view.block_size
            for i in insts:
                used[i] = min(cap, left)
                left -= used[i]
        return used

    def _scale(self, view: GroupView, alloc: list[tuple[int, ...]], busy: list[bool],
               prefills: list[bool], running: list[Sequence[Request]]) -> list[tuple[int, int]]:
        """Idle members give their instances back; decoding members keep what their KV and
        the next ``max_wait_steps`` tokens of each request need, taking idle instances when
        they need more, or, when none is idle and their KV leaves no block for each
        request's next token, merging into another member (``_merge_for_room``). Returns
        the merges."""
        bpi, bs = view.num_kv_blocks_per_instance, view.block_size
        for m, insts in enumerate(alloc):
            if insts and not busy[m]:
                alloc[m] = ()
        free: list[int] | None = None  # the instances no member holds, found when needed
        merges: list[tuple[int, int]] = []
        for m, insts in enumerate(alloc):
            if not insts or prefills[m] or not busy[m] or any(d == m for _, d in merges):
                continue  # off, still prefilling, or just merged into (its KV read later)
            extra = self._headroom_blocks(len(running[m]), bs)
            fewest, most = view.member_used_blocks_range(m)
            k = max(1, -(-(fewest + extra) // bpi))
            if k != max(1, -(-(most + extra) // bpi)):  # the bounds disagree: count exactly
                k = max(1, -(-(view.member_used_blocks(m) + extra) // bpi))
            if k == len(insts):
                continue
            if free is None:
                held = {i for a in alloc for i in a}
                free = [i for i in range(view.num_instances) if i not in held]
            if k < len(insts):
                alloc[m] = insts[:k]
                free.extend(insts[k:])
            elif free:
                take = free[:k - len(insts)]
                alloc[m] = insts + tuple(take)
                free = free[len(take):]
            if k > len(alloc[m]) and (view.member_used_blocks(m) + len(running[m])
                                      > len(alloc[m]) * bpi):
                merges.extend(self._merge_for_room(view, alloc, busy, running, m, extra))
        return merges

    def _merge_for_room(self, view: GroupView, alloc: list[tuple[int, ...]], busy: list[bool],
                        running: list[Sequence[Request]], m: int,
                        extra: int) -> list[tuple[int, int]]:
        """Member ``m`` outgrows its instances and no instance is free: merge it into the
        busy member whose instances and ``m``'s together hold both members' KV and next
        tokens, the most used first (ESP's scale-up of a decode: its KV spreads over the
        instances another batch holds). Nothing if none can; updates ``alloc``, ``busy``
        and ``running`` in place."""
        bpi = view.num_kv_blocks_per_instance
        need = view.member_used_blocks(m) + extra
        targets = []
        for d, insts in enumerate(alloc):
            if d == m or not insts or not busy[d]:
                continue
            used_d = view.member_used_blocks(d) + self._headroom_blocks(len(running[d]),
                                                                        view.block_size)
            if (len(insts) + len(alloc[m])) * bpi >= need + used_d:
                targets.append((-used_d, d))
        if not targets:
            return []
        d = min(targets)[1]
        alloc[d], alloc[m] = alloc[d] + alloc[m], ()
        running[d], running[m] = [*running[d], *running[m]], []
        busy[m] = False
        self.num_merges += 1
        return [(m, d)]

    def _headroom_blocks(self, num_running: int, block_size: int) -> int:
        """Blocks a decode member keeps free for its requests' next ``max_wait_steps``
        tokens (one each now, and one per block those steps may cross)."""
        return num_running * (1 + self.max_wait_steps // block_size)

    @staticmethod
    def _idle_instances(alloc: list[tuple[int, ...]], busy: list[bool]) -> tuple[int, ...]:
        owned = {i for m, a in enumerate(alloc) if busy[m] for i in a}
        return tuple(i for i in range(len(alloc)) if i not in owned)

    def _refill(self, view: GroupView, waiting: Sequence[Request],
                before: Sequence[tuple[int, ...]], alloc: list[tuple[int, ...]],
                busy: list[bool], running: list[Sequence[Request]], ahead: list[int],
                cap: int, now_s: float) -> list[Request]:
        """The code's greedy refill (``req_queue.py::generate_greedy_req_list``): while a
        prefill iteration runs, the instances no batch holds take, in queue order, the
        waiting requests whose KV reservation fits and whose prefill on all of them together
        is predicted to end before the iteration does."""
        idle = self._idle_instances(alloc, busy)
        if not idle:
            return []
        predictor = self.predictor
        assert predictor is not None
        predict, k = predictor.predict_s, len(idle)
        left_s = self._iteration_end_s - now_s
        num_running = sum(len(rs) for rs in running)
        if num_running >= self.max_running:
            return []
        # Walked alone (nothing taken yet), a request fits only if it is short enough; when
        # the prediction grows with the tokens, the shortest one failing means all do.
        shortest = min(r.num_tokens for r in waiting)
        if predictor.grows(k) and predict(k, shortest, shortest * shortest) > left_s:
            return []
        used = self._used_by_instance(view, before, cap, idle)
        limit = min(self.batch_max_tokens, sum(cap - used[i] for i in idle))
        if shortest > limit:
            return []
        self._refill_walked = True
        reserved = Reservation(
            [(r.num_computed_tokens + d, r.max_output_tokens - r.num_output_tokens - d)
             for rs, d in zip(running, ahead, strict=True) for r in rs],
            view.num_instances * cap)
        taken: list[Request] = []
        s1 = s2 = 0
        for req in waiting:
            length = req.num_tokens
            entry = (length, req.max_output_tokens - req.num_output_tokens - 1)
            if (num_running + len(taken) < self.max_running
                    and s1 + length <= limit
                    and predict(k, s1 + length, s2 + length * length) <= left_s
                    and reserved.fits(entry)):
                taken.append(req)
                reserved.add(entry)
                s1, s2 = s1 + length, s2 + length * length
        return taken

    def _prefill(self, view: GroupView, chosen: list[Request], alloc: list[tuple[int, ...]],
                 busy: list[bool], running: list[Sequence[Request]], emitted: list[int],
                 used: list[int], cap: int, assign: list[tuple[int, int]],
                 merge: list[tuple[int, int]], now_s: float) -> bool:
        """Plan the prefill iteration of ``chosen``: pause decode members, cut the requests
        into batches over instances (the DP), and make each batch a member. False (nothing
        changed) if they do not fit the instances it may use."""
        if not self.elastic:
            assign.extend((r.id, 0) for r in chosen)
            self._count(len(alloc[0]))
            return True
        predict = self.predictor.predict_s  # type: ignore[union-attr]
        new = sorted(chosen, key=lambda r: (-r.num_tokens, r.id))  # longest first (the DP)
        lengths = [r.num_tokens for r in new]
        s1, s2 = float(sum(lengths)), float(sum(x * x for x in lengths))
        inv = sum(1.0 / x for x in lengths)
        merge.extend(self._consolidate(view, alloc, busy, running, emitted, used, cap, s1,
                                       s2))
        owned = {i for m, a in enumerate(alloc) if busy[m] for i in a}
        idle = [i for i in range(len(alloc)) if i not in owned]
        decode_members = [m for m in range(len(alloc)) if busy[m] and alloc[m]]

        def room(m: int) -> int:
            return sum(cap - used[i] for i in alloc[m])

        kept = sorted(decode_members, key=lambda m: (room(m), -m))  # most room last
        need = s1 - sum(cap - used[i] for i in idle)
        paused: list[int] = []
        while kept and need > 0:
            m = kept.pop()
            need -= room(m)
            paused.append(m)
        lent = len(idle) + sum(len(alloc[m]) for m in paused)
        for m in list(kept):
            t_idle, t_lent = predict(lent, s1, s2), predict(lent + len(alloc[m]), s1, s2)
            if should_pause(t_idle, t_lent, inv, len(running[m]), emitted[m]):
                paused.append(m)
                lent += len(alloc[m])
        available = idle + [i for m in paused for i in alloc[m]]
        available.sort(key=lambda i: (used[i], i))
        plan = plan_prefill(lengths, [cap - used[i] for i in available], predict)
        if plan is None:
            return False
        batches = [([new[x] for x in b.requests], {available[x] for x in b.instances})
                   for b in plan.batches]
        self._iteration_end_s = now_s + max(
            predict(len(b.instances), float(sum(lengths[x] for x in b.requests)),
                    float(sum(lengths[x] ** 2 for x in b.requests))) for b in plan.batches)
        self._form_members(batches, paused, alloc, busy, used, assign)
        return True

    def _consolidate(self, view: GroupView, alloc: list[tuple[int, ...]], busy: list[bool],
                     running: list[Sequence[Request]], emitted: list[int], used: list[int],
                     cap: int, s1: float, s2: float) -> list[tuple[int, int]]:
        """Free instances for the prefill by merging the decode member with the least KV
        into the most used one that has room for it (and its next iterations' tokens), while
        one more idle instance gains the prefill at least the move's time (the code's
        ``_minimize_decoding_occupied_instances``, one member at a time). Updates the
        allocation, the members' requests and KV in place; returns the merges."""
        predict = self.predictor.predict_s  # type: ignore[union-attr]
        n, bs = len(alloc), view.block_size
        merges: list[tuple[int, int]] = []
        while True:
            decoding = [m for m in range(n) if busy[m] and alloc[m]]
            kv = {m: sum(used[i] for i in alloc[m]) for m in decoding}
            num_owned = sum(len(alloc[m]) for m in decoding)
            if len(decoding) < 2 or num_owned <= -(-sum(used) // cap):
                return merges
            src = min(decoding, key=lambda m: (kv[m], m))
            need = kv[src] + bs * self._headroom_blocks(len(running[src]), bs)
            targets = sorted((m for m in decoding if m != src
                              and len(alloc[m]) * cap - kv[m] >= need),
                             key=lambda m: (-kv[m], m))
            if not targets:
                return merges
            num_idle = n - num_owned
            if s1 <= num_idle * cap:
                gain = predict(num_idle, s1, s2) - predict(num_idle + len(alloc[src]), s1, s2)
                if not migration_pays(gain, view.kv_move_s(kv[src])):
                    return merges
            dst = targets[0]
            merges.append((src, dst))
            running[dst] = [*running[dst], *running[src]]
            running[src] = []
            emitted[dst] += emitted[src]
            emitted[src] = 0
            busy[src] = False
            for i in alloc[src]:
                used[i] = 0
            left = kv[dst] + kv[src]
            for i in alloc[dst]:
                used[i] = min(cap, left)
                left -= used[i]
            alloc[src] = ()
            self.num_merges += 1

    def _form_members(self, batches: list[tuple[list[Request], set[int]]], paused: list[int],
                      alloc: list[tuple[int, ...]], busy: list[bool], used: list[int],
                      assign: list[tuple[int, int]]) -> None:
        """Each batch becomes a member. A paused member's KV lies on its instances, so the
        batch that takes any of them takes all (batches sharing a paused member merge) and
        its requests; a paused member no batch touches decodes on."""
        groups: list[tuple[list[Request], set[int], list[int]]] = []
        for reqs, insts in batches:
            touched = [m for m in paused if insts & set(alloc[m])]
            merged_reqs, merged_insts = list(reqs), set(insts)
            merged_from: list[int] = list(touched)
            for g in list(groups):
                if set(g[2]) & set(touched):
                    merged_reqs = g[0] + merged_reqs
                    merged_insts |= g[1]
                    merged_from = sorted(set(merged_from) | set(g[2]))
                    groups.remove(g)
            for m in touched:
                merged_insts |= set(alloc[m])
            groups.append((merged_reqs, merged_insts, merged_from))
        self.num_paused += sum(1 for m in paused if any(m in g[2] for g in groups))
        spare = [m for m in range(len(alloc)) if not alloc[m] and not busy[m]]
        for m in paused:
            if any(m in g[2] for g in groups):
                alloc[m] = ()
        for reqs, insts, merged_from in groups:
            slot = min(merged_from) if merged_from else spare.pop(0)
            alloc[slot] = tuple(sorted(insts, key=lambda i: (-used[i], i)))
            assign.extend((r.id, slot) for r in reqs)
            self._count(len(insts))

    def _count(self, dop: int) -> None:
        self.num_prefill_batches += 1
        self.dop_histogram[dop] = self.dop_histogram.get(dop, 0) + 1
