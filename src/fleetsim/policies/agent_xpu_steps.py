"""Agent.xpu's per-step loops (``policies/agent_xpu.py``): plain functions over the replica's
view, compiled with the engine by ``make native`` (the planner class stays interpreted so
users can subclass it), as ``batch_steps.py`` is for the token-budget planners. They run every
step over the running and waiting requests of the SoC's replicas."""

from __future__ import annotations

import math
from collections.abc import Sequence

from fleetsim.policies.batch_steps import as_list, next_chunk, serve_running
from fleetsim.serving.contract import PLAN_DEFAULTS, StepPlan, new_named_tuple
from fleetsim.serving.request import Request
from fleetsim.serving.views import CoResidentStep, KVView, ReplicaView

# A veto (``StepPlan.wait_for_co_resident``): no tokens, sleep until a co-resident replica
# starts or ends a step.
WAIT = StepPlan({}, wait_for_co_resident=True)


def _fields(name: str, value: object) -> list[object]:
    """``StepPlan``'s fields after ``preempt``, ``name`` set to ``value``, the others at their
    defaults (a plan is then built without the named tuple's Python-level ``__new__``)."""
    return [value if f == name else StepPlan._field_defaults[f] for f in StepPlan._fields[2:]]


# A plan that repeats (``StepPlan.repeats``).
_REPEATING: tuple[object, ...] = tuple(_fields("repeats", True))
# Where a wait's rule and a plan's repeat rule go in those fields (``_WAITING``: a wait's).
_WAITING: list[object] = _fields("wait_for_co_resident", True)
_WAIT_RULE = StepPlan._fields.index("wait_rule") - 2
_REPEAT_RULE = StepPlan._fields.index("repeat_rule") - 2
NO_LIMIT = 1 << 62  # (steps or blocks: more than any window takes)

# Every class ``urgency`` gives, most urgent first (with preemption: reactive, proactive).
PREEMPTIVE_CLASSES: tuple[tuple[int, int], ...] = ((0, 0), (1, 0))
CLASSES: tuple[tuple[int, int], ...] = ((0, 0), (0, 1), (1, 0), (1, 1))

ClassStep = tuple[dict[int, int], list[int], tuple[int, int] | None, bool, int, int, bool]
"""A class's step: tokens per request, the requests preempted (ids, in order), the prefill
chunk (tokens, computed) if any, whether every running request is of the class, the budget
and blocks left, and whether the class stays as the step has it while a decode window runs
(every running request of the class decodes in it, and none of its waiting prompts could be
admitted: none waits, or the slots are full; KV only shrinks in a window, the slots stay)."""


def plan_step(view: ReplicaView, chunk_tokens: int, reactive_slack: float,
              max_reactive_priority: int, preemptive: bool, bandwidth_aware: bool,
              reserve_full_isl: bool = True) -> StepPlan:
    """``AgentXpuPlanner.plan``, compiled (the class stays interpreted so users can
    subclass it; its settings come as arguments): the most urgent class with a step that
    can run leads it (``class_step``), the other decodes piggyback within the slack, and
    bandwidth-aware dispatch may turn it into a wait. Nothing fits: every running request,
    best first, preempting from the worst end."""
    for urgent in PREEMPTIVE_CLASSES if preemptive else CLASSES:
        if not class_present(view, urgent, max_reactive_priority, preemptive):
            continue
        step = class_step(view, urgent, chunk_tokens, max_reactive_priority, preemptive,
                          reserve_full_isl)
        if step is None:
            continue
        tokens, preempt, chunk, one_class, budget, available, steady = step
        if one_class:
            # Every running request is of this class: if the step decodes them all, it
            # repeats (``StepPlan.repeats``; see ``AgentXpuPlanner.plan``).
            preempted: tuple[int, ...] = ()
            rest = _REPEATING
        else:
            rule = piggyback(view, tokens, set(preempt), chunk, urgent, budget, available,
                             reactive_slack, max_reactive_priority, preemptive)
            preempted, rest = tuple(preempt), PLAN_DEFAULTS
            if (rule is not None and steady and not preempt and chunk is None and preemptive
                    and urgent[0] == 0):
                fields = list(PLAN_DEFAULTS)
                fields[_REPEAT_RULE] = rule
                rest = tuple(fields)
        break
    else:
        # Nothing fits (a waiting prompt short of KV or a slot, a class that cannot evict
        # enough): every running request, best first, preempting from the worst end.
        tokens = {}
        _, _, preempt = serve_running(view, tokens, view.max_batched_tokens,
                                      view.kv.num_available_blocks, chunk_tokens)
        preempted, rest = tuple(preempt), PLAN_DEFAULTS
    # Bandwidth-aware dispatch: the step, or a wait if it serves no reactive request and
    # would slow a reactive decode on another replica of the DDR beyond the slack.
    if bandwidth_aware and tokens:
        wait = dispatch_wait(view, tokens, max_reactive_priority, reactive_slack)
        if wait is not None:
            return wait
    # (``StepPlan(tokens, preempted, ...)`` without the named tuple's Python-level __new__)
    return new_named_tuple(StepPlan, (tokens, preempted) + rest)


def urgency(req: Request, started: bool, max_reactive_priority: int,
            preemptive: bool) -> tuple[int, int]:
    """The class ``req`` belongs to (smaller is served first): reactive before proactive;
    without preemption, started (running) work before the rest."""
    reactive = 0 if req.priority <= max_reactive_priority else 1
    return (reactive, 0) if preemptive else (0 if started else 1, reactive)


def in_class(req: Request, started: bool, urgent: tuple[int, int], max_reactive_priority: int,
             preemptive: bool) -> bool:
    """``urgency(req, ...) == urgent``, compared field by field (a tuple ``==`` is a generic
    comparison of two boxed tuples when compiled)."""
    reactive = 0 if req.priority <= max_reactive_priority else 1
    if preemptive:
        return reactive == urgent[0] and urgent[1] == 0
    return (0 if started else 1) == urgent[0] and reactive == urgent[1]


def class_present(view: ReplicaView, urgent: tuple[int, int], max_reactive_priority: int,
                  preemptive: bool) -> bool:
    """Whether a running or waiting request is of class ``urgent``. Asked class by class,
    most urgent first, and only until a class's step can run: the scan stops at the first
    request of the class, which is usually the first one read (a set of the classes of the
    whole queue cost ~6k instructions a plan, 11% of an Agent.xpu run, with the NPU's queue
    ~90 deep)."""
    for r in as_list(view.running):
        if in_class(r, True, urgent, max_reactive_priority, preemptive):
            return True
    for r in as_list(view.waiting):
        if in_class(r, False, urgent, max_reactive_priority, preemptive):
            return True
    return False


def class_step(view: ReplicaView, urgent: tuple[int, int], chunk_tokens: int,
               max_reactive_priority: int, preemptive: bool,
               reserve_full_isl: bool = True) -> ClassStep | None:
    """The step led by class ``urgent``: its decodes (best first), then one prefill chunk of
    its first started prompt, or else of its best waiting prompt (with ``reserve_full_isl``,
    only if its whole input fits the blocks available, though only the chunk's are taken);
    short of KV, requests of other classes are preempted (recompute later), the least urgent
    first. None if none of the class's requests can run now."""
    kv = view.kv
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    budget = view.max_batched_tokens
    available = kv.num_available_blocks
    running = as_list(view.running)
    decoders: list[Request] = []
    prefilling: list[Request] = []
    num_in_class = 0
    for r in running:
        if in_class(r, True, urgent, max_reactive_priority, preemptive):
            num_in_class += 1
            if r.num_tokens_to_next_output == 1:
                decoders.append(r)
            elif r.num_tokens_to_next_output > 1:
                prefilling.append(r)
    victims = [r for r in reversed(running)
               if not in_class(r, True, urgent, max_reactive_priority, preemptive)]
    one_class = not victims
    tokens: dict[int, int] = {}
    preempt: list[int] = []
    for r in decoders:
        num_new, needed = next_chunk(r, 1, bs, per_entry)
        available = _make_room(kv, victims, preempt, needed, available)
        if needed > available or num_new > budget:
            break
        tokens[r.id] = num_new
        budget -= num_new
        available -= needed
    steady = len(tokens) == num_in_class  # (every one of the class decodes)
    chunk: tuple[int, int] | None = None  # (tokens, computed) of the step's prefill chunk
    for r in prefilling:  # a started prompt (best first): its next chunk
        num_new, needed = next_chunk(r, min(budget, chunk_tokens), bs, per_entry)
        if num_new > 0:
            available = _make_room(kv, victims, preempt, needed, available)
            if not (needed > available or num_new > budget):
                tokens[r.id] = num_new
                budget -= num_new
                available -= needed
                chunk = (num_new, r.num_computed_tokens)
        break
    if chunk is None and not preempt:
        # Admit the best waiting prompt of the class. Not in a step that preempts: a
        # victim's blocks were counted free, and they may hold prefix entries it would pin.
        num_running = len(running) + view.num_swapping_in
        for r in as_list(view.waiting):
            if not in_class(r, False, urgent, max_reactive_priority, preemptive):
                continue
            todo = r.num_tokens - kv.num_prefix_hit_tokens(r)
            num_new = min(todo, budget, chunk_tokens)
            needed = kv.admission_blocks(r, num_new)
            if (num_new > 0 and num_running < view.max_running and needed <= available
                    and not (reserve_full_isl and num_new < todo
                             and kv.admission_blocks(r, todo) > available)):
                tokens[r.id] = num_new
                budget -= num_new
                available -= needed
                chunk = (num_new, r.num_computed_tokens)
            elif num_running < view.max_running:
                steady = False  # (short of KV or budget: a finish or a cut may change that)
            break
    if not tokens:
        return None
    return tokens, preempt, chunk, one_class, budget, available, steady


def _make_room(kv: KVView, victims: list[Request], preempt: list[int], needed: int,
               available: int) -> int:
    """Short of KV for ``needed`` blocks: recompute requests of other classes later, the
    least urgent first (``victims`` not yet in ``preempt``, in that order); returns the
    blocks available then."""
    while needed > available and len(preempt) < len(victims):
        victim = victims[len(preempt)]
        preempt.append(victim.id)
        available += kv.reclaimable_blocks(victim)
    return available


def piggyback(view: ReplicaView, tokens: dict[int, int], preempted: set[int],
              chunk: tuple[int, int] | None, urgent: tuple[int, int], budget: int,
              available: int, reactive_slack: float, max_reactive_priority: int,
              preemptive: bool) -> PiggybackRepeat | None:
    """The other classes' decodes join ``tokens`` (best first) while the step stays within
    ``reactive_slack`` of the urgent class's step alone. Returns when the same tests give
    the same decodes at the later steps of a decode window (``PiggybackRepeat``), or None
    where a test other than the slack's (budget, KV) ended the walk."""
    kv = view.kv
    chunks = [chunk] if chunk is not None else []
    num_decode = 0
    kv_tokens = 0
    running = as_list(view.running)
    # (The tests cheapest first, the same answers: a dict lookup boxes and hashes the id.)
    for r in running:
        if r.num_tokens_to_next_output == 1 and r.id in tokens:
            num_decode += 1
            kv_tokens += r.num_computed_tokens
    bound = 1.0 + reactive_slack
    limit = view.step_time_s(chunks, num_decode, kv_tokens) * bound
    rule = PiggybackRepeat(view, num_decode, kv_tokens, bound)
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    for r in running:
        if (r.num_tokens_to_next_output != 1
                or in_class(r, True, urgent, max_reactive_priority, preemptive)
                or r.id in tokens or r.id in preempted):
            continue
        num_new, needed = next_chunk(r, 1, bs, per_entry)
        if budget < 1 or needed > available:
            return None
        if view.step_time_s(chunks, num_decode + 1, kv_tokens + r.num_computed_tokens) > limit:
            rule.rejected = r.num_computed_tokens
            return rule
        tokens[r.id] = num_new
        budget -= 1
        available -= needed
        num_decode += 1
        kv_tokens += r.num_computed_tokens
        rule.joined.append(r.num_computed_tokens)
    return rule


class PiggybackRepeat:
    """When a plan of reactive decodes with proactive ones piggybacked repeats
    (``StepPlan.repeat_rule``): with no prefill chunk, nothing preempted, every reactive
    running request decoding and no reactive prompt admissible, the plan of a later step of
    the window (arrivals, handoffs and finishes cut it) is the same while each piggybacked
    decode still passes the slack test and the one that failed it (if any) still fails:
    the reactive decodes' step alone and each prefix of the piggybacked ones priced as
    ``piggyback`` prices them, with every decoding context one token longer a step (the
    one that failed is paused: its context stays). Budget and KV do not turn a test: the
    rule is given only where the walk ended on the slack test or ran out of candidates,
    the budget stays and free KV only shrinks. Exact: each step is priced, not assumed
    monotone."""

    def __init__(self, view: ReplicaView, num_decode: int, kv_tokens: int,
                 bound: float) -> None:
        self.view = view
        self.num_decode = num_decode  # the reactive decodes at the first step...
        self.kv_tokens = kv_tokens  # ...and their computed tokens
        self.bound = bound  # 1 + the slack
        self.joined: list[int] = []  # computed tokens of the piggybacked decodes, in order
        self.rejected = -1  # computed tokens of the decode that failed the test (-1: none)
        self.max_steps = NO_LIMIT
        self.max_new_blocks = NO_LIMIT
        self.per_step = False  # (nothing the steps add is read: windows as ordinary ones)

    def steps_within(self, decodes: Sequence[Request], start_s: float,
                     ends_s: Sequence[float]) -> int:
        view = self.view
        n = self.num_decode
        k = len(ends_s)
        for j in range(1, k):
            # (``decode_step_time_s``: ``step_time_s`` with no chunks, as ``piggyback`` asks)
            num_decode = n
            kv_tokens = self.kv_tokens + n * j
            limit = view.decode_step_time_s(num_decode, kv_tokens) * self.bound
            for computed in self.joined:
                num_decode += 1
                kv_tokens += computed + j
                if view.decode_step_time_s(num_decode, kv_tokens) > limit:
                    return j
            if self.rejected >= 0 and not view.decode_step_time_s(
                    num_decode + 1, kv_tokens + self.rejected) > limit:
                return j
        return k

    def ran(self, num_steps: int, last_start_s: float) -> None:
        pass  # (the planner counts nothing per plan)


def dispatch_wait(view: ReplicaView, tokens: dict[int, int], max_reactive_priority: int,
                  reactive_slack: float) -> StepPlan | None:
    """Bandwidth-aware dispatch (``plan_step``): the wait that replaces the step giving
    ``tokens``, because it serves no reactive request and would slow a reactive decode on
    another replica of the DDR beyond ``reactive_slack`` (a wait with its reason,
    ``DispatchVeto``), or because another replica starts or ends a step at this instant
    (after it); None: the step runs."""
    limit = max_reactive_priority
    # Serving a reactive request: never a wait (checked first, without building the list).
    running, waiting = as_list(view.running), as_list(view.waiting)
    for r in running:
        if r.priority <= limit and r.id in tokens:
            return None
    for r in waiting:
        if r.priority <= limit and r.id in tokens:
            return None
    others = view.co_resident_steps
    if others is None:
        return WAIT
    if not _any_reactive_decode(others, limit):
        return None
    served = [r for r in running if r.id in tokens] + [r for r in waiting if r.id in tokens]
    chunks: list[tuple[int, int]] = []
    num_decode = kv_tokens = 0
    for r in served:
        if r.num_tokens_to_next_output == 1 and r.num_output_tokens > 0:
            num_decode += 1
            kv_tokens += r.num_computed_tokens
        else:
            chunks.append((tokens[r.id], r.num_computed_tokens))
    slowdowns = view.co_resident_slowdowns(chunks, num_decode, kv_tokens)
    if len(slowdowns) != len(others):
        raise ValueError(f"{len(slowdowns)} slowdowns for {len(others)} co-resident steps")
    bound = 1.0 + reactive_slack
    for i in range(len(others)):
        if slowdowns[i] > bound and _any_reactive_decode((others[i],), limit):
            fields = list(_WAITING)
            fields[_WAIT_RULE] = DispatchVeto(chunks, num_decode, kv_tokens, limit, bound)
            return new_named_tuple(StepPlan, ({}, ()) + tuple(fields))
    return None


class DispatchVeto:
    """Why a step waits (``StepPlan.wait_rule``): it would slow a reactive decode step on
    the other replica of the DDR more than ``bound`` times. Its own state unchanged (an
    arrival or a handoff wakes it), the replica plans the same step and the same wait
    beside any co-resident step that decodes a reactive request and that this step would
    slow more than ``bound`` times: ``dispatch_wait``'s test, asked by the engine."""

    def __init__(self, chunks: list[tuple[int, int]], num_decode: int, kv_tokens: int,
                 limit: int, bound: float) -> None:
        self.prefill_chunks = chunks
        self.num_decode = num_decode
        self.decode_kv_tokens = kv_tokens
        self.limit = limit  # the largest reactive priority
        self.bound = bound  # 1 + the slack

    def max_slowdown(self, decodes: Sequence[Request]) -> float:
        for r in decodes:
            if r.priority <= self.limit:
                return self.bound
        return math.inf  # (no reactive decode: never a reason to wait)


def _any_reactive_decode(steps: tuple[CoResidentStep, ...], limit: int) -> bool:
    """Whether one of ``steps`` decodes a reactive request (a plain loop: compiled, ``any``
    over a generator is a generic call, and this runs at every wait of a proactive step)."""
    for step in steps:
        for r in step.decodes:
            if r.priority <= limit:
                return True
    return False
