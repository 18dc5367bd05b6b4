"""LoongServe's per-plan work (``policies/esp.py``): plain functions over the group's view
and a state record no one subclasses, compiled with the engine by ``make native`` (the
planner class stays interpreted so users can subclass it), as ``fastserve_steps.py`` is for
FastServe. The group asks for a plan after every arrival and finish and every
``max_wait_steps`` decode iterations (147,193 plans in the full reproduction), so this was
most of a compiled LoongServe run's cost while interpreted."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from fleetsim.esp.admission import Admission, Pending, Reservation, Resident
from fleetsim.esp.cost import AnalyticalModel
from fleetsim.esp.dp import coefficients_of, plan_prefill
from fleetsim.esp.rules import migration_pays, should_pause
from fleetsim.policies.batch_steps import as_list
from fleetsim.serving.contract import GroupPlan, GroupView, new_named_tuple
from fleetsim.serving.request import Request


class EspState:
    """The planner's settings (read once, from its fields) and what it keeps between plans:
    counters, the next admission, the polls left out, the requests it admitted, and the last
    plan's reading of its members (``plan_step`` leaves them for ``skip_polls``)."""

    __slots__ = ("admission", "avg_decoding_s", "batch_max_tokens", "busy", "dop_histogram",
                 "dp_coefficients", "elastic", "iteration_end_s", "max_prefill_s", "max_running",
                 "max_wait_steps", "may_skip", "next_admit_s", "num_merges", "num_paused",
                 "num_prefill_batches", "num_refills", "outstanding", "predictor", "prefills",
                 "refill_idle", "refill_walked", "running", "skipped")

    def __init__(self, admission: Admission, *, max_running: int, max_wait_steps: int,
                 max_prefill_s: float, batch_max_tokens: int, avg_decoding_s: float,
                 elastic: bool, refill_idle: bool) -> None:
        self.admission = admission
        self.max_running = max_running
        self.max_wait_steps = max_wait_steps
        self.max_prefill_s = max_prefill_s
        self.batch_max_tokens = batch_max_tokens
        self.avg_decoding_s = avg_decoding_s
        self.elastic = elastic
        self.refill_idle = refill_idle
        self.predictor: AnalyticalModel | None = None
        # The predictor's (A, B, C) per instance count as the prefill DP reads them, with
        # the predictor they were read from.
        self.dp_coefficients: tuple[AnalyticalModel,
                                    list[tuple[float, float, float]]] | None = None
        self.num_prefill_batches = 0
        self.num_paused = 0
        self.num_refills = 0
        self.num_merges = 0
        self.dop_histogram: dict[int, int] = {}  # degree of parallelism -> prefill batches
        self.iteration_end_s = 0.0
        self.next_admit_s = 0.0
        # Polls left out (``skip_polls``): the first one's time and the wake that ends them.
        self.skipped: tuple[float, float] | None = None
        self.refill_walked = False
        self.outstanding: list[Request] = []  # admitted, not yet seen finished
        self.may_skip = False  # the last plan may leave polls out (``skip_polls``)
        self.busy: list[bool] = []
        self.prefills: list[bool] = []
        self.running: list[list[Request]] = []


def plan_leaving_out_polls(st: EspState, view: GroupView, now_s: float) -> GroupPlan:
    """The plan at ``now_s`` with the polls after it that cannot change anything left out
    (``plan_step``, then ``skip_polls``): ``EspPlanner.plan``'s work in one compiled call
    (interpreted, the planner's own frame, the named tuple's ``_replace`` and a second
    method call cost about 8.6k instructions a plan, 8% of a run on Mixed lengths)."""
    plan = plan_step(st, view, now_s)
    wake_s = plan.wake_s
    if st.may_skip and wake_s is not None:
        later_s = skip_polls(st, view, st.busy, st.prefills, st.running, wake_s)
        if later_s != wake_s:
            return new_named_tuple(GroupPlan, (plan.instances_by_member, plan.assign, later_s,
                                               plan.merge))
    return plan


def plan_step(st: EspState, view: GroupView, now_s: float) -> GroupPlan:
    """The plan at ``now_s`` (``EspPlanner.plan``, whose docstring is the design), before
    any polls are left out: ``st.may_skip`` says whether ``skip_polls`` may move its wake."""
    n = view.num_instances
    cap = view.num_kv_blocks_per_instance * view.block_size
    predictor = st.predictor
    assert predictor is not None
    if st.skipped is not None:
        catch_up(st, now_s)
    poll_s = st.max_wait_steps * st.avg_decoding_s
    # Members read without cutting their windows: a running request's token counts lag by
    # its member's ``num_steps_ahead`` (the same for all of them).
    running: list[list[Request]] = []  # (read, not changed: the members' own lists)
    ahead: list[int] = []
    busy: list[bool] = []
    # Members with a prefill queued or in progress (a window's lag cancels in the test, and
    # a window with steps done holds only decodes).
    prefills: list[bool] = []
    prefilling = False
    for m in range(n):
        state = view.member_state(m)
        # (the member's list itself, typed so: compiled, a list is walked natively and a
        # ``Sequence`` through the iterator protocol, per request per walk)
        rs = as_list(state.running)
        running.append(rs)
        ahead.append(state.num_steps_ahead)
        is_busy = bool(rs) or bool(state.waiting)
        busy.append(is_busy)
        is_prefill = bool(state.waiting) or (not state.num_steps_ahead and _any_prefill(rs))
        prefills.append(is_prefill)
        prefilling = prefilling or is_prefill
    used: list[int] | None = None  # KV tokens per instance, read when needed
    before = view.instances_by_member
    alloc = list(before)
    merge: list[tuple[int, int]] = []
    if st.elastic:
        merge = scale(st, view, alloc, busy, prefills, running)
    else:
        alloc = [tuple(range(n))] + [()] * (n - 1)
    assign: list[tuple[int, int]] = []
    waiting = as_list(view.waiting)  # (the group's own list: walked natively, as ``rs``)
    num_waiting = len(waiting)
    # A prefill iteration ends when its longest prefill does; the next admission comes
    # ``max_wait_steps`` decode iterations later (or as soon as nothing runs).
    if prefilling:
        st.next_admit_s = max(st.next_admit_s, now_s + poll_s)
    may_admit = not _any(busy) or now_s >= st.next_admit_s
    st.refill_walked = False
    if (num_waiting and not may_admit and prefilling and st.elastic and st.refill_idle
            and now_s < st.iteration_end_s):
        taken = refill(st, view, waiting, before, alloc, busy, running, ahead, cap, now_s)
        if taken:
            slot = next(m for m in range(n) if not alloc[m] and not busy[m])
            alloc[slot] = idle_instances(alloc, busy)
            assign.extend((r.id, slot) for r in taken)
            count(st, len(alloc[slot]))
            st.num_refills += 1
            num_waiting -= len(taken)
            st.outstanding.extend(taken)
    if num_waiting and may_admit:
        residents = [Resident(r.num_computed_tokens + d, r.max_output_tokens
                              - r.num_output_tokens - d, r.num_output_tokens + d)
                     for rs, d in zip(running, ahead, strict=True) for r in rs]
        if used is None:
            used = used_by_instance(view, before, cap, None)
        note_finishes(st)
        # Read lazily: admission may stop before the end of the queue.
        chosen = [waiting[i] for i in st.admission.take(
            _pending(waiting), residents, used, cap, predictor)]
        if chosen:
            # Output tokens each member's requests have emitted (the pause rule's input).
            emitted = [_num_emitted(rs) + d * len(rs)
                       for rs, d in zip(running, ahead, strict=True)]
            if prefill(st, view, chosen, alloc, busy, running, emitted, used, cap, assign,
                       merge, now_s):
                st.next_admit_s = now_s + poll_s
                num_waiting -= len(chosen)
                st.outstanding.extend(chosen)
    # Plan again when the next admission is due, and every ``max_wait_steps`` iterations
    # while anything runs (scaling). An admission refused now is retried at those times and
    # after each finish (the group asks then): what it waits for (KV, running slots) only
    # frees at finishes, where the code retries every iteration.
    wake_s: float | None = None
    if _any(busy) or assign:
        wake_s = now_s + poll_s
    if num_waiting and st.next_admit_s > now_s:
        wake_s = min(wake_s, st.next_admit_s) if wake_s is not None else st.next_admit_s
    # Polls are left out while a prefill runs, or while the queue is empty (then a poll only
    # rescales, and an arrival plans at once).
    st.may_skip = (wake_s is not None and (prefilling or not num_waiting) and not assign
                   and not merge and _same(alloc, before))
    if st.may_skip:
        st.busy, st.prefills, st.running = busy, prefills, running
    # (every field given: the tuple as is, without the named tuple's Python-level __new__)
    return new_named_tuple(GroupPlan, (tuple(alloc), tuple(assign), wake_s, tuple(merge)))


# The plan's tests over lists as plain loops: compiled, ``any``/``all`` over a list or a
# generator are generic calls (with ``zip``, about 1.4k instructions a plan each).
def _any(flags: list[bool]) -> bool:
    for flag in flags:  # noqa: SIM110 (a native loop compiled; ``any`` is a generic call)
        if flag:
            return True
    return False


def _same(alloc: list[tuple[int, ...]], before: Sequence[tuple[int, ...]]) -> bool:
    """``alloc == list(before)``, item by item (the same lengths: ``alloc`` is a copy)."""
    if len(alloc) != len(before):
        raise ValueError(f"an allocation of {len(alloc)} members against {len(before)}")
    for i in range(len(alloc)):  # noqa: SIM110 (as ``_any``)
        if alloc[i] != before[i]:
            return False
    return True


def _merged_into(merges: list[tuple[int, int]], member: int) -> bool:
    """Does any of ``merges`` (source, destination) merge into ``member``?"""
    for _src, dst in merges:  # noqa: SIM110 (as ``_any``)
        if dst == member:
            return True
    return False


def _any_in(instances: tuple[int, ...], only: Sequence[int]) -> bool:
    for i in instances:  # noqa: SIM110 (as ``_any``)
        if i in only:
            return True
    return False


def _num_emitted(running: list[Request]) -> int:
    """Output tokens the requests have emitted (a loop: compiled, ``sum`` over a list of
    them boxed each and was a generic call)."""
    total = 0
    for r in running:
        total += r.num_output_tokens
    return total


def _any_prefill(running: list[Request]) -> bool:
    for r in running:  # noqa: SIM110 (as ``_any``)
        if r.num_computed_tokens < r.num_tokens - 1:
            return True
    return False


def _pending(waiting: list[Request]) -> Iterator[Pending]:
    for r in waiting:
        yield Pending(r.num_tokens, r.max_output_tokens - r.num_output_tokens)


def skip_polls(st: EspState, view: GroupView, busy: list[bool], prefills: list[bool],
               running: list[list[Request]], wake_s: float) -> float:
    """The wake that replaces the polls this plan would be followed by while nothing can
    change. This plan changes nothing, a member prefills or the queue is empty, and every
    busy member is in a step: one prefill step, or decodes whose instances stay what they
    need until the step ends (the scaling bound at both ends of the step gives the count
    they have). Until the first of those steps ends (or an arrival or a finish, which plan
    at once) every poll reads the same queues and the same scaling, so it changes nothing
    either (the refill's prediction only gets later against a nearer iteration end, when it
    failed before its walk or the running requests do not move; admission waits while a
    prefill runs; with the queue empty there is nothing to admit or refill) and, while a
    prefill runs, only moves the next admission on (``catch_up`` does that when the next
    plan comes). The polls' times are the same chain of sums, so the plan after them comes
    at the same time."""
    bpi, bs = view.num_kv_blocks_per_instance, view.block_size
    end_s = math.inf
    for m, is_busy in enumerate(busy):
        if not is_busy:
            continue
        step_end_s = view.member_step_end_s(m)
        if step_end_s is None:
            return wake_s
        # A prefilling member is in one ordinary step (a window opens only with nothing to
        # prefill, and a request queued on a member cuts its window): its counts hold until
        # the step ends.
        if not prefills[m]:  # decoding: its KV grows, its scaling must not change
            if st.refill_walked:
                return wake_s
            if st.elastic:
                extra = headroom_blocks(st, len(running[m]), bs)
                fewest = view.member_used_blocks_range(m)[0]
                most = view.member_used_blocks_at_step_end(m)
                k = -(-(most + extra) // bpi)
                # (more than it has: no instance was free, and a merge for room may come)
                if -(-(fewest + extra) // bpi) != k or k > len(view.instances_by_member[m]):
                    return wake_s
        end_s = min(end_s, step_end_s)
    if wake_s >= end_s or wake_s + st.max_wait_steps * st.avg_decoding_s <= wake_s:
        return wake_s  # (a poll period of 0 steps, max_wait_steps = 0, moves no clock)
    first_s = wake_s
    while wake_s < end_s:
        wake_s = wake_s + st.max_wait_steps * st.avg_decoding_s
    if _any(prefills):  # the polls left out would each have moved the next admission on
        st.skipped = (first_s, wake_s)
    return wake_s


def catch_up(st: EspState, now_s: float) -> None:
    """What the polls left out before ``now_s`` would have done: each put the next
    admission ``max_wait_steps`` iterations after it (a prefill was running)."""
    assert st.skipped is not None
    poll_s, until_s = st.skipped
    st.skipped = None
    while poll_s < now_s and poll_s < until_s:
        st.next_admit_s = max(st.next_admit_s, poll_s + st.max_wait_steps * st.avg_decoding_s)
        poll_s = poll_s + st.max_wait_steps * st.avg_decoding_s


def note_finishes(st: EspState) -> None:
    done = [r for r in st.outstanding if not math.isnan(r.finish_s)]
    if done:
        for r in done:
            st.admission.finished(r.num_output_tokens)
        st.outstanding = [r for r in st.outstanding if math.isnan(r.finish_s)]


def used_by_instance(view: GroupView, alloc: Sequence[tuple[int, ...]], cap: int,
                     only: Sequence[int] | None) -> list[int]:
    """KV tokens on each instance: a member's KV fills its instances in order (the code's
    placement keeps it on as few as possible, most used first). ``only``: exact for these
    instances (the members holding them are read), 0 for the others."""
    used = [0] * view.num_instances
    bs = view.block_size
    for m, insts in enumerate(alloc):
        if not insts or (only is not None and not _any_in(insts, only)):
            continue
        left = view.member_used_blocks(m) * bs
        for i in insts:
            used[i] = min(cap, left)
            left -= used[i]
    return used


def scale(st: EspState, view: GroupView, alloc: list[tuple[int, ...]], busy: list[bool],
          prefills: list[bool], running: list[list[Request]]) -> list[tuple[int, int]]:
    """Idle members give their instances back; decoding members keep what their KV and the
    next ``max_wait_steps`` tokens of each request need, taking idle instances when they need
    more, or, when none is idle and their KV leaves no block for each request's next token,
    merging into another member (``merge_for_room``). Returns the merges."""
    bpi, bs = view.num_kv_blocks_per_instance, view.block_size
    for m, insts in enumerate(alloc):
        if insts and not busy[m]:
            alloc[m] = ()
    free: list[int] | None = None  # the instances no member holds, found when needed
    merges: list[tuple[int, int]] = []
    for m in range(len(alloc)):
        insts = alloc[m]
        if not insts or prefills[m] or not busy[m] or _merged_into(merges, m):
            continue  # off, still prefilling, or just merged into (its KV read later)
        extra = headroom_blocks(st, len(running[m]), bs)
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
            merges.extend(merge_for_room(st, view, alloc, busy, running, m, extra))
    return merges


def merge_for_room(st: EspState, view: GroupView, alloc: list[tuple[int, ...]],
                   busy: list[bool], running: list[list[Request]], m: int,
                   extra: int) -> list[tuple[int, int]]:
    """Member ``m`` outgrows its instances and no instance is free: merge it into the busy
    member whose instances and ``m``'s together hold both members' KV and next tokens, the
    most used first (ESP's scale-up of a decode: its KV spreads over the instances another
    batch holds). Nothing if none can; updates ``alloc``, ``busy`` and ``running`` in
    place."""
    bpi = view.num_kv_blocks_per_instance
    need = view.member_used_blocks(m) + extra
    targets: list[tuple[int, int]] = []
    for d, insts in enumerate(alloc):
        if d == m or not insts or not busy[d]:
            continue
        used_d = view.member_used_blocks(d) + headroom_blocks(st, len(running[d]),
                                                              view.block_size)
        if (len(insts) + len(alloc[m])) * bpi >= need + used_d:
            targets.append((-used_d, d))
    if not targets:
        return []
    d = min(targets)[1]
    alloc[d], alloc[m] = alloc[d] + alloc[m], ()
    running[d], running[m] = [*running[d], *running[m]], []
    busy[m] = False
    st.num_merges += 1
    return [(m, d)]


def headroom_blocks(st: EspState, num_running: int, block_size: int) -> int:
    """Blocks a decode member keeps free for its requests' next ``max_wait_steps`` tokens
    (one each now, and one per block those steps may cross)."""
    return num_running * (1 + st.max_wait_steps // block_size)


def idle_instances(alloc: list[tuple[int, ...]], busy: list[bool]) -> tuple[int, ...]:
    """The instances no busy member holds, in order (plain loops: compiled, the set and
    the generator they replace were about 2k instructions a call)."""
    n = len(alloc)
    owned = [False] * n
    for m in range(n):
        if busy[m]:
            for i in alloc[m]:
                owned[i] = True
    return tuple([i for i in range(n) if not owned[i]])


def refill(st: EspState, view: GroupView, waiting: list[Request],
           before: Sequence[tuple[int, ...]], alloc: list[tuple[int, ...]], busy: list[bool],
           running: list[list[Request]], ahead: list[int], cap: int,
           now_s: float) -> list[Request]:
    """The code's greedy refill (``req_queue.py::generate_greedy_req_list``): while a
    prefill iteration runs, the instances no batch holds take, in queue order, the waiting
    requests whose KV reservation fits and whose prefill on all of them together is
    predicted to end before the iteration does."""
    idle = idle_instances(alloc, busy)
    if not idle:
        return []
    predictor = st.predictor
    assert predictor is not None
    k = len(idle)
    left_s = st.iteration_end_s - now_s
    num_running = 0
    for rs in running:
        num_running += len(rs)
    if num_running >= st.max_running:
        return []
    # Walked alone (nothing taken yet), a request fits only if it is short enough; when the
    # prediction grows with the tokens, the shortest one failing means all do.
    shortest = waiting[0].num_tokens  # (a loop: ``min`` over a list is a generic call)
    for r in waiting:
        if r.num_tokens < shortest:
            shortest = r.num_tokens
    if predictor.grows(k) and predictor.predict_s(k, shortest, shortest * shortest) > left_s:
        return []
    used = used_by_instance(view, before, cap, idle)
    limit = min(st.batch_max_tokens, sum([cap - used[i] for i in idle]))
    if shortest > limit:
        return []
    st.refill_walked = True
    reserved = Reservation(
        [(r.num_computed_tokens + d, r.max_output_tokens - r.num_output_tokens - d)
         for rs, d in zip(running, ahead, strict=True) for r in rs],
        view.num_instances * cap)
    taken: list[Request] = []
    s1 = s2 = 0
    for req in waiting:
        length = req.num_tokens
        entry = (length, req.max_output_tokens - req.num_output_tokens - 1)
        if (num_running + len(taken) < st.max_running
                and s1 + length <= limit
                and predictor.predict_s(k, s1 + length, s2 + length * length) <= left_s
                and reserved.fits(entry)):
            taken.append(req)
            reserved.add(entry)
            s1, s2 = s1 + length, s2 + length * length
    return taken


def prefill(st: EspState, view: GroupView, chosen: list[Request], alloc: list[tuple[int, ...]],
            busy: list[bool], running: list[list[Request]], emitted: list[int],
            used: list[int], cap: int, assign: list[tuple[int, int]],
            merge: list[tuple[int, int]], now_s: float) -> bool:
    """Plan the prefill iteration of ``chosen``: pause decode members, cut the requests into
    batches over instances (the DP), and make each batch a member. False (nothing changed)
    if they do not fit the instances it may use."""
    if not st.elastic:
        assign.extend((r.id, 0) for r in chosen)
        count(st, len(alloc[0]))
        return True
    predictor = st.predictor
    assert predictor is not None
    new = sorted(chosen, key=_longest_first)  # longest first (the DP)
    lengths = [r.num_tokens for r in new]
    s1, s2 = float(sum(lengths)), float(sum([x * x for x in lengths]))
    inv = sum([1.0 / x for x in lengths])
    merge.extend(consolidate(st, view, alloc, busy, running, emitted, used, cap, s1, s2))
    idle = list(idle_instances(alloc, busy))
    decode_members = [m for m in range(len(alloc)) if busy[m] and alloc[m]]
    room = {m: sum([cap - used[i] for i in alloc[m]]) for m in decode_members}
    kept = sorted(decode_members, key=lambda m: (room[m], -m))  # most room last
    need = s1 - sum([cap - used[i] for i in idle])
    paused: list[int] = []
    while kept and need > 0:
        m = kept.pop()
        need -= room[m]
        paused.append(m)
    lent = len(idle) + sum([len(alloc[m]) for m in paused])
    for m in list(kept):
        t_idle = predictor.predict_s(lent, s1, s2)
        t_lent = predictor.predict_s(lent + len(alloc[m]), s1, s2)
        if should_pause(t_idle, t_lent, inv, len(running[m]), emitted[m]):
            paused.append(m)
            lent += len(alloc[m])
    available = idle + [i for m in paused for i in alloc[m]]
    available.sort(key=lambda i: (used[i], i))
    cached = st.dp_coefficients
    if cached is None or cached[0] is not predictor:
        cached = st.dp_coefficients = (predictor, coefficients_of(predictor.predict_s,
                                                                   len(alloc)))
    plan = plan_prefill(lengths, [cap - used[i] for i in available], predictor.predict_s,
                        cached[1])
    if plan is None:
        return False
    batches = [([new[x] for x in b.requests], {available[x] for x in b.instances})
               for b in plan.batches]
    st.iteration_end_s = now_s + max([
        predictor.predict_s(len(b.instances), float(sum([lengths[x] for x in b.requests])),
                            float(sum([lengths[x] ** 2 for x in b.requests])))
        for b in plan.batches])
    form_members(st, batches, paused, alloc, busy, used, assign)
    return True


def _longest_first(r: Request) -> tuple[int, int]:
    return (-r.num_tokens, r.id)


def consolidate(st: EspState, view: GroupView, alloc: list[tuple[int, ...]], busy: list[bool],
                running: list[list[Request]], emitted: list[int], used: list[int],
                cap: int, s1: float, s2: float) -> list[tuple[int, int]]:
    """Free instances for the prefill by merging the decode member with the least KV into
    the most used one that has room for it (and its next iterations' tokens), while one more
    idle instance gains the prefill at least the move's time (the code's
    ``_minimize_decoding_occupied_instances``, one member at a time). Updates the
    allocation, the members' requests and KV in place; returns the merges."""
    predictor = st.predictor
    assert predictor is not None
    n, bs = len(alloc), view.block_size
    merges: list[tuple[int, int]] = []
    # (Plain loops over the few members: compiled, ``min``/``sorted`` with a key call it
    # generically per member, and this runs at every prefill.)
    while True:
        decoding: list[int] = []  # in member order
        kv = [0] * n  # KV tokens of each decoding member
        num_owned = 0
        for m in range(n):
            if busy[m] and alloc[m]:
                decoding.append(m)
                tokens = 0
                for i in alloc[m]:
                    tokens += used[i]
                kv[m] = tokens
                num_owned += len(alloc[m])
        total_used = 0
        for tokens in used:
            total_used += tokens
        if len(decoding) < 2 or num_owned <= -(-total_used // cap):
            return merges
        src = decoding[0]  # the least KV (the first member of it)
        for m in decoding:
            if kv[m] < kv[src]:
                src = m
        need = kv[src] + bs * headroom_blocks(st, len(running[src]), bs)
        dst = -1  # the most KV among those with room (the first member of it)
        for m in decoding:
            if (m != src and len(alloc[m]) * cap - kv[m] >= need
                    and (dst < 0 or kv[m] > kv[dst])):
                dst = m
        if dst < 0:
            return merges
        num_idle = n - num_owned
        if s1 <= num_idle * cap:
            gain = (predictor.predict_s(num_idle, s1, s2)
                    - predictor.predict_s(num_idle + len(alloc[src]), s1, s2))
            if not migration_pays(gain, view.kv_move_s(kv[src])):
                return merges
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
        st.num_merges += 1


def form_members(st: EspState, batches: list[tuple[list[Request], set[int]]],
                 paused: list[int], alloc: list[tuple[int, ...]], busy: list[bool],
                 used: list[int], assign: list[tuple[int, int]]) -> None:
    """Each batch becomes a member. A paused member's KV lies on its instances, so the
    batch that takes any of them takes all (batches sharing a paused member merge) and its
    requests; a paused member no batch touches decodes on."""
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
    st.num_paused += sum([1 for m in paused if any(m in g[2] for g in groups)])
    spare = [m for m in range(len(alloc)) if not alloc[m] and not busy[m]]
    for m in paused:
        if any(m in g[2] for g in groups):
            alloc[m] = ()
    for reqs, insts, merged_from in groups:
        slot = min(merged_from) if merged_from else spare.pop(0)
        alloc[slot] = tuple(sorted(insts, key=lambda i: (-used[i], i)))
        assign.extend((r.id, slot) for r in reqs)
        count(st, len(insts))


def count(st: EspState, dop: int) -> None:
    st.num_prefill_batches += 1
    st.dop_histogram[dop] = st.dop_histogram.get(dop, 0) + 1
