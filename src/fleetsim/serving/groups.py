"""Instance groups: instances planned together, whose membership and degree of parallelism
change at run time (LoongServe's elastic sequence parallelism, arXiv 2404.09526, is one).

A group owns ``num_instances`` instances (one tensor-parallel group of GPUs each, with
``num_kv_blocks_per_instance`` KV blocks) and as many *members*: ordinary replicas of the
engine (``Replica``), member ``m`` running on the instances the planner gives it, as one
replica of degree ``len(instances)`` (the group's step model at that degree, the instances'
blocks together). Requests arrive in the group's queue; the group planner (``GroupPlanner``,
``contract.py``) assigns them to members and changes the allocation. It is asked when a
request arrives, when a member runs out of work, after a step in which a request finished,
and at the time its last plan named.

Why this is exact under fast-forward: an allocation change is one more event that cuts a
window, as an arrival does. The members it changes are interrupted (``Replica.interrupt``:
the window is cut back to the step in progress) and held at their next step boundary; once
all of them are there (the common boundary), the group resizes them (``Replica.regroup``),
moves the requests of members left without instances, and wakes them. Members the change
does not touch keep stepping (and keep their windows).

A request moved between members keeps its KV on its instances: no bytes move, and its
cached-prefix references become private blocks of the new member. Members of a group do
not swap or hand off KV (the group refuses a change while a member has moves in flight).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Final, NoReturn

from fleetsim.core.simulator import Simulator
from fleetsim.errors import PlanError
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.contract import GroupPlan, GroupPlanner, MemberState, new_named_tuple
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import RUNNING, WAITING, Request
from fleetsim.serving.views import ReplicaView

GROUP_WAKE: Final = 45  # a planner's own wake-up: after same-time step ends, before wake-ups

StepModelFor = Callable[[int], StepTimeModel]
"""degree of parallelism (instances) -> the step model of a member of that degree."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSetup:
    """An instance group as the engine needs it: its planner and its step models. The
    instances are the replicas of the cluster's one pool (``num_replicas`` instances of
    ``num_kv_blocks`` each)."""

    planner: GroupPlanner
    """Assigns requests and changes the allocation."""
    step_model_for: StepModelFor
    """Step model of a member of k instances (``k = 1`` is the pool's own)."""
    kv_move_s: Callable[[int], float] | None = None
    """Seconds to move KV tokens between two instances, for planners that weigh a merge
    (None: free)."""
    step_model_key: Hashable | None = None
    """Equal keys: equal ``step_model_for`` at every degree, so a planner may reuse what it
    derived from them in an earlier run (None: no such promise)."""


class _View:
    """The ``GroupView`` of one group (read by its planner)."""

    __slots__ = ("_group", "_states")

    def __init__(self, group: InstanceGroup) -> None:
        self._group = group
        # Each member's last ``MemberState``: it holds the member's own queues (lists a
        # replica never rebinds), so it stays true while the steps ahead are the same (an
        # idle member's, always); building one is a generic call of about 850 instructions.
        self._states: list[MemberState | None] = [None] * len(group.members)

    @property
    def num_instances(self) -> int:
        return len(self._group.members)

    @property
    def num_kv_blocks_per_instance(self) -> int:
        return self._group.blocks_per_instance

    @property
    def block_size(self) -> int:
        return self._group.members[0].kv.block_size

    @property
    def waiting(self) -> Sequence[Request]:
        return self._group.waiting

    @property
    def members(self) -> Sequence[ReplicaView]:
        return [m.view for m in self._group.members]

    @property
    def instances_by_member(self) -> tuple[tuple[int, ...], ...]:
        return self._group.instances_by_member

    def _peek(self, member: int, exact: bool) -> tuple[Replica, tuple[int, int, int]]:
        m = self._group.members[member]
        ahead = m.peek_window(exact)
        if ahead is None:  # not one offset for all: make it exact the usual way
            m.interrupt()
            ahead = (0, 0, 0)
        return m, ahead

    def member_state(self, member: int) -> MemberState:
        m, ahead = self._peek(member, False)
        state = self._states[member]
        if state is None or state.num_steps_ahead != ahead[0]:
            state = new_named_tuple(MemberState, (m.running, m.waiting, ahead[0]))
            self._states[member] = state
        return state

    def member_used_blocks(self, member: int) -> int:
        m, ahead = self._peek(member, True)
        return m.kv.num_used_blocks + ahead[1]

    def member_used_blocks_range(self, member: int) -> tuple[int, int]:
        m, ahead = self._peek(member, False)
        used = m.kv.num_used_blocks
        return used + ahead[1], used + ahead[2]

    def step_time_s(self, degree: int, prefill_chunks: Sequence[tuple[int, int]],
                    num_decode: int, kv_tokens: int) -> float:
        return self._group.step_model(degree).step_time_s(prefill_chunks, num_decode,
                                                          kv_tokens)

    @property
    def step_model_key(self) -> Hashable | None:
        return self._group.step_model_key

    def member_step_end_s(self, member: int) -> float | None:
        step = self._group.members[member].current_step
        return step.end_s if step is not None else None

    def member_used_blocks_at_step_end(self, member: int) -> int:
        m = self._group.members[member]
        step = m.current_step
        used = m.kv.num_used_blocks
        if step is None or step.window is None:
            return used
        # Each decoder holds its computed tokens' KV: k steps take at most ceil(k / block
        # size) blocks each (``DecodeWindows.peek``'s bound, at the window's last step).
        return used + -(-step.num_steps // m.kv.block_size) * len(step.decodes)

    def kv_move_s(self, num_tokens: int) -> float:
        move = self._group.kv_move_s
        return move(num_tokens) if move is not None and num_tokens > 0 else 0.0


class InstanceGroup:
    """The group over ``members`` (replicas on ``sim``, one per instance, built alike)."""

    def __init__(self, sim: Simulator, members: Sequence[Replica], setup: GroupSetup) -> None:
        if not members:
            raise ValueError("an instance group needs at least one instance")
        self.sim = sim
        self.members = list(members)
        self.planner = setup.planner
        self._step_model_for = setup.step_model_for
        self.kv_move_s = setup.kv_move_s
        self.step_model_key = setup.step_model_key
        self._models: dict[int, StepTimeModel] = {}
        self.blocks_per_instance = members[0].kv.num_blocks
        self.waiting: list[Request] = []
        self.instances_by_member: tuple[tuple[int, ...], ...] = tuple(
            (i,) for i in range(len(members)))
        self.view = _View(self)
        self.num_regroups = 0
        self._pending: GroupPlan | None = None  # an allocation waiting for its boundary
        self._held: set[int] = set()  # members still stepping towards it
        self._wake_s: float | None = None  # the last plan's wake-up (earlier ones lapse)
        self._finish_wakes: set[float] = set()  # replans after finishes, by time
        self._replan_asked = False
        for m in self.members:
            m.on_idle = self._on_idle
            # A finish frees KV and a running slot, which admission waits for: plan again
            # after the step ends (windows stop at finishes when someone listens, so this
            # is exact under fast-forward). Chained after a request source's hook, if any.
            m.on_finish = _chain(m.on_finish, self._on_finish)
        if GROUP_WAKE not in sim.kind_names:
            sim.on(GROUP_WAKE, InstanceGroup._on_wake, "group_wake")
        self.replan()  # the initial allocation, before any arrival

    def step_model(self, degree: int) -> StepTimeModel:
        model = self._models.get(degree)
        if model is None:
            model = self._models[degree] = self._step_model_for(degree)
        return model

    # ---- inputs ----------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """A request arrives at the group: it waits in the group's queue for the planner."""
        req.state = WAITING
        self.waiting.append(req)
        self.replan()

    def _on_idle(self, member: Replica) -> None:
        if self.waiting or self._pending is not None:
            self.replan()

    def _on_finish(self, req: Request) -> None:
        now_s = self.sim.now_s
        if now_s not in self._finish_wakes:
            self._finish_wakes.add(now_s)
            self.sim.schedule(now_s, GROUP_WAKE, self)

    def _on_wake(self) -> None:
        now_s = self.sim.now_s
        due = now_s == self._wake_s or now_s in self._finish_wakes
        if now_s == self._wake_s:
            self._wake_s = None
        self._finish_wakes.discard(now_s)
        if due:
            self.replan()

    # ---- planning --------------------------------------------------------------------
    def replan(self) -> None:
        """Ask the planner now (deferred while an allocation waits for its boundary)."""
        if self._pending is not None:
            self._replan_asked = True
            return
        plan = self.planner.plan(self.view, self.sim.now_s)
        at = self._check(plan)
        if plan.wake_s is not None and plan.wake_s > self.sim.now_s:
            if plan.wake_s != self._wake_s:
                self._wake_s = plan.wake_s
                self.sim.schedule(plan.wake_s, GROUP_WAKE, self)
        else:
            self._wake_s = None
        if plan.instances_by_member == self.instances_by_member and not plan.merge:
            self._assign(plan, at)  # (the queue as checked: nothing ran in between)
            return
        self._pending = plan
        changed = sorted({m for m, (old, new) in enumerate(zip(
            self.instances_by_member, plan.instances_by_member, strict=True)) if old != new}
            | {m for pair in plan.merge for m in pair})
        for m in changed:
            member = self.members[m]
            member.interrupt()  # cut its window back to the step in progress
            member.group_hold = self._at_boundary
            if not member.at_boundary:
                self._held.add(m)
        if not self._held:
            self._apply()

    def _at_boundary(self, member: Replica) -> None:
        self._held.discard(self.members.index(member))
        if not self._held and self._pending is not None:
            self._apply()

    def _check(self, plan: GroupPlan) -> list[int] | None:
        """A ``PlanError`` for a plan the group cannot apply; where the requests it assigns
        stand in the queue (``_locate``), if it assigns any."""
        n = len(self.members)
        alloc = plan.instances_by_member
        if len(alloc) != n:
            raise PlanError(f"group plan gives {len(alloc)} members instances, the group has "
                            f"{n}: {plan}")
        if alloc != self.instances_by_member:  # (the allocation in force was checked before)
            seen: set[int] = set()
            for insts in alloc:
                for i in insts:
                    if not 0 <= i < n or i in seen:
                        raise PlanError(f"group plan uses instance {i} twice or out of "
                                        f"0..{n - 1}: {plan}")
                    seen.add(i)
        if plan.merge:
            merged: set[int] = set()
            for src, dst in plan.merge:
                if (src == dst or src in merged or not 0 <= src < n or not 0 <= dst < n
                        or not alloc[dst] or dst in merged):
                    raise PlanError(f"group plan merges member {src} into {dst}: not two "
                                    f"distinct members, the second with instances after the "
                                    f"plan: {plan}")
                merged.add(src)
        for rid, m in plan.assign:
            if not 0 <= m < n or not alloc[m]:
                _bad_assignment(rid, m, plan)
        return self._locate(plan) if plan.assign else None

    def _locate(self, plan: GroupPlan) -> list[int]:
        """Where the requests ``plan`` assigns stand in the group's queue, in the plan's
        order (a ``PlanError`` for a request not waiting, or assigned twice). The queue is
        read only as far as the last of them, not copied into a set, a dict and a new list
        at every plan that takes one (a queue of ~50 behind a busy group: LoongServe on Mixed
        lengths)."""
        assign = plan.assign
        order: dict[int, int] = {}
        for k, (rid, m) in enumerate(assign):
            if rid in order:
                _bad_assignment(rid, m, plan)
            order[rid] = k
        at = [-1] * len(assign)
        left = len(assign)
        if left == 1:  # (most plans take one: an int compared natively, not a dict lookup)
            rid = assign[0][0]
            for i, r in enumerate(self.waiting):
                if r.id == rid:
                    at[0] = i
                    return at
        else:
            for i, r in enumerate(self.waiting):
                found = order.get(r.id)
                if found is not None:
                    at[found] = i
                    left -= 1
                    if not left:
                        return at
        for k, (rid, m) in enumerate(assign):  # (one is missing: reported here)
            if at[k] < 0:
                _bad_assignment(rid, m, plan)
        return at

    # ---- applying --------------------------------------------------------------------
    def _apply(self) -> None:
        """The common boundary: every member the plan changes is between steps."""
        plan = self._pending
        assert plan is not None
        old, new = self.instances_by_member, plan.instances_by_member
        bpi = self.blocks_per_instance
        heirs: dict[int, int] = dict(plan.merge)  # member -> who takes its requests
        owner = {i: m for m, insts in enumerate(new) for i in insts}
        for m, insts in enumerate(old):
            if m not in heirs and insts and not new[m] and (
                    self.members[m].running or self.members[m].waiting):
                if min(insts) not in owner:
                    raise PlanError(f"group plan turns member {m} off while it holds requests, "
                                    f"and no member takes its instance {min(insts)}")
                heirs[m] = owner[min(insts)]
        # Grow first, move, then shrink: a member's blocks always fit its capacity.
        for m, insts in enumerate(new):
            if len(insts) > len(old[m]):
                self.members[m].regroup(self.step_model(len(insts)), len(insts) * bpi)
        for src, dst in heirs.items():
            self._move_all(self.members[src], self.members[dst])
        for m, insts in enumerate(new):
            if len(insts) < len(old[m]):
                self.members[m].regroup(self.step_model(max(1, len(insts))), len(insts) * bpi)
        self.instances_by_member = new
        self._pending = None
        self.num_regroups += 1
        for m in sorted({m for m, insts in enumerate(new) if insts != old[m]}
                        | {m for pair in plan.merge for m in pair}):
            self.members[m].group_hold = None
            self.members[m].wake()
        self._assign(plan, None)  # (located again: requests came or left while it waited)
        if self._replan_asked:
            self._replan_asked = False
            self.replan()

    def _assign(self, plan: GroupPlan, at: list[int] | None) -> None:
        """Hand the requests ``plan`` assigns to their members (``at``: where they stand in
        the queue, if located since the queue last changed)."""
        if not plan.assign:
            return
        waiting = self.waiting
        if at is None:
            at = self._locate(plan)
        for (_rid, m), i in zip(plan.assign, at, strict=True):
            self.members[m].submit(waiting[i])
        for i in sorted(at, reverse=True):  # (later ones first: the earlier keep their places)
            del waiting[i]

    def _move_all(self, src: Replica, dst: Replica) -> None:
        """Every request of ``src`` joins ``dst``; running ones keep their KV (as private
        blocks: the instances holding it now belong to ``dst``)."""
        if src.swapped or src.moves.holds_blocks_for_others() or src.moves.incoming:
            raise PlanError(f"group moves the requests of replica {src.replica_id} while its "
                            f"KV moves (swap or handoff): not supported in a group")
        for req in list(src.waiting):
            taken = src.take_waiting(req.id)
            assert taken is not None
            dst.submit(taken)
        need = sum(src.kv.num_held_blocks(r) for r in src.running)
        if need > dst.kv.num_available_blocks:
            raise PlanError(f"group moves {need} KV blocks of replica {src.replica_id} into "
                            f"replica {dst.replica_id}, which has "
                            f"{dst.kv.num_available_blocks} available")
        for req in list(src.running):
            assert req.state == RUNNING
            src.leave_running(req, "regroups")
            src.forget(req)
            src.add_load_tokens(-(req.num_tokens - req.num_computed_tokens))
            held = src.kv.num_held_blocks(req)
            src.kv.release(req)
            dst.adopt(req)
            dst.kv.allocate(req, held)
            dst.join_running(req)


def _bad_assignment(rid: int, member: int, plan: GroupPlan) -> NoReturn:
    raise PlanError(f"group plan assigns request {rid} to member {member}: not a waiting "
                    f"request, or not a member with instances: {plan}")


def _chain(first: Callable[[Request], None] | None, then: Callable[[Request], None]
           ) -> Callable[[Request], None]:
    if first is None:
        return then

    def both(req: Request) -> None:
        first(req)
        then(req)

    return both
