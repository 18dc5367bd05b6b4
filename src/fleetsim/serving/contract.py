"""The engine's plug-in contract: what a batching policy, an ordering key, a router, a group
planner, a request source and a controller are to the engine, typed once, here.

The engine (``replica.py``, ``cluster.py``) is written against these protocols only, and
``fleetsim.policies`` implements them; policies re-export the names from their old homes
(``policies.batching``, ``policies.routing``, ``policies.ordering``, ``serving.sources``,
``serving.cluster``), so an existing import keeps working. Each protocol has one deciding
method that reads an exact view at ``now_s`` and returns a plan or a choice (STYLE.md section 5).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.request import Request
from fleetsim.serving.views import KVView, ReplicaView

if TYPE_CHECKING:  # the controller's context is the cluster, which imports this module
    from fleetsim.serving.cluster import Cluster

# ---- ordering ------------------------------------------------------------------------------
SortKey = tuple[float | int, ...]
OrderKey = Callable[[Request, float], SortKey]
"""An ordering policy: ``(request, now_s) -> key``; smaller runs first, and is preempted last."""


# ---- batching ------------------------------------------------------------------------------
class StepPlan(NamedTuple):
    """What one step does. The engine applies the verbs in this order, then the tokens:
    ``rekey`` (re-sort requests whose ordering key changed), ``preempt`` (recompute later),
    ``swap_out`` (KV to host memory), ``migrate`` (KV to another replica), ``swap_in`` (KV
    back from host memory: the request runs again once the copy is done, so it gets tokens
    in a later plan). Running requests the plan gives no tokens stay resident, paused.

    Immutable, and a named tuple rather than a frozen dataclass: one is built every planned
    step, and a frozen dataclass's ``__init__`` cost three times as much."""

    tokens_by_request: Mapping[int, int]  # request_id -> tokens to compute this step
    preempt: tuple[int, ...] = ()  # running request_ids to evict (recompute later), in order
    swap_out: tuple[int, ...] = ()  # running request_ids whose KV moves to host memory
    swap_in: tuple[int, ...] = ()  # swapped request_ids whose KV comes back
    migrate: tuple[tuple[int, int], ...] = ()  # (running request_id, destination replica_id)
    rekey: tuple[int, ...] = ()  # request_ids whose ordering key changed (re-sorted first)
    # No tokens now: sleep until a replica sharing this one's resource starts or ends a step
    # (``ReplicaView.co_resident_steps``): a veto of work that would slow what runs there.
    wait_for_co_resident: bool = False
    # Why the plan waits (``WaitRule``): the engine may then keep the replica asleep through
    # a co-resident step that the rule says it would wait on again, instead of waking it to
    # plan the same wait (and may fast-forward the co-resident's decode steps beside it).
    wait_rule: WaitRule | None = None
    # The policy promises that this plan, if it decodes every running request once, repeats
    # step after step while nothing arrives or finishes and free KV only shrinks (what
    # ``Capabilities.fast_forward_safe`` promises of every such plan): the engine may then
    # fast-forward it (``serving/window.py``). For a policy whose plans repeat only in some
    # states (``agent_xpu``: one class of requests running).
    repeats: bool = False
    # A plan that decodes some running requests once (no prefill, no verbs) and repeats until
    # a rule of the policy's own says otherwise (``RepeatRule``): the engine runs a window
    # over those requests only, the others paused, exact step by step (``serving/window.py``).
    repeat_rule: RepeatRule | None = None


# A named tuple from a tuple of all its fields, without the named tuple's Python-level
# ``__new__`` (about 2.5k instructions a call from the compiled engine):
# ``new_named_tuple(T, fields)`` equals ``T(*fields)``.
new_named_tuple = tuple.__new__
# ``StepPlan``'s fields after ``tokens_by_request`` and ``preempt``, at their defaults.
PLAN_DEFAULTS = tuple(StepPlan._field_defaults[f] for f in StepPlan._fields[2:])


class RepeatRule(Protocol):
    """How long a decode-only plan repeats, for a policy whose plans change with what the
    steps do (FastServe: demotions on attained service, a free-block reserve, a starvation
    check every so many iterations). Given with a plan (``StepPlan.repeat_rule``), it lets
    the engine run that plan as a window whose every request record, attained-service sum and
    timeline row equals step by step's, while nothing outside happens (an arrival, a swap
    done, a read of the replica: they cut the window back, as any window's)."""

    @property
    def max_steps(self) -> int:
        """Steps the plan repeats at most, the planned one included (>= 1)."""

    @property
    def max_new_blocks(self) -> int:
        """KV blocks the steps after the first may take at most (a reserve the plan keeps)."""

    @property
    def per_step(self) -> bool:
        """Whether the policy reads what each step adds (FastServe: attained service): the
        window then adds it, and writes the timeline, one step at a time, as step by step
        does. False: as an ordinary window does (one sum a request, one row a stretch)."""

    def steps_within(self, decodes: Sequence[Request], start_s: float,
                     ends_s: Sequence[float]) -> int:
        """Of the steps that would start at ``start_s`` and end at ``ends_s`` (each the
        previous one's end plus its duration, as step by step), how many the plan repeats
        through (>= 1): the plan after the last of them may differ."""

    def ran(self, num_steps: int, last_start_s: float) -> None:
        """The window's first ``num_steps`` steps started (the planned one and
        ``num_steps - 1`` the policy did not plan), the last at ``last_start_s``: advance
        what the policy counts per plan as if it had planned each."""


class WaitRule(Protocol):
    """Why a plan waits (``StepPlan.wait_for_co_resident``), for a policy whose veto depends
    only on its own state and on the co-resident step: the plan stays a wait, the policy
    promises, as long as nothing reaches this replica (an arrival or a handoff wakes it
    anyway) and every step the one other replica on the resource starts is slowed by the
    plan's step more than ``max_slowdown`` allows. The engine asks instead of waking the
    replica to plan the same wait again, and may fast-forward the other's decode steps while
    each of them is (``serving/window.py``). Read only where the resource has one other
    replica: with more, every step wakes it."""

    @property
    def prefill_chunks(self) -> Sequence[tuple[int, int]]:
        """The step the plan would run but for the veto, as
        ``ReplicaView.co_resident_slowdowns`` takes it: (tokens, computed) per chunk..."""

    @property
    def num_decode(self) -> int:
        """... its decode tokens ..."""

    @property
    def decode_kv_tokens(self) -> int:
        """... and its decoders' computed tokens."""

    def max_slowdown(self, decodes: Sequence[Request]) -> float:
        """The most the step above may slow a co-resident step that decodes ``decodes``
        (and prefills whatever it does): the plan would wait again beside it when
        ``co_resident_slowdowns`` says more (``math.inf``: it would not wait on it)."""


class BatchPolicy(Protocol):
    """``plan(view, now_s) -> StepPlan``, plus ``splits_prompts`` (False if a prompt is never
    split across steps: then every prompt must fit the budget) and, optionally, a class
    attribute ``capabilities`` (``fleetsim.serving.capabilities``: declared per class, never
    inherited) and an ``order_key`` (a policy whose priorities change as requests run orders
    the queues itself, naming the requests whose key changed in ``StepPlan.rekey``)."""

    splits_prompts: bool

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan: ...


# ---- routing -------------------------------------------------------------------------------
class RoutableReplica(Protocol):
    """What a router reads of one replica (``ReplicaView`` implements it), exact at now."""

    @property
    def replica_id(self) -> int: ...
    @property
    def load_tokens(self) -> int: ...
    @property
    def running(self) -> Sequence[Request]: ...
    @property
    def waiting(self) -> Sequence[Request]: ...
    @property
    def kv(self) -> KVView: ...


class ClusterView(Protocol):
    """What a router reads: the replicas it may choose from and the run's routing stream."""

    @property
    def replicas(self) -> Sequence[RoutableReplica]: ...
    @property
    def rng(self) -> np.random.Generator: ...
    @property
    def next_stage(self) -> Sequence[RoutableReplica]:
        """P/D entry routing: the decode replicas a call will move to."""


class Router(Protocol):
    """``route`` returns an index into ``view.replicas``. A router may also define
    ``report() -> dict`` of counters (its fallbacks, say): ``run`` puts them in the summary
    under ``routing``; and ``attach(cluster)``, called once before any arrival, if it
    manages more than the choice (TokenLake's cluster-wide prefix pool)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int: ...


# ---- instance groups -----------------------------------------------------------------------
class GroupPlan(NamedTuple):
    """An instance group's allocation and its assignments (``groups.py``).

    ``instances_by_member[m]``: the instances member ``m`` runs on, one entry per member
    (empty: the member is off); the sets are disjoint, and a member's degree of parallelism
    is its set's size. A member that loses all its instances while it holds requests hands
    them (with their KV, which stays on those instances) to the member that takes its lowest
    instance. ``assign``: (waiting request id, member) pairs, queued there once the
    allocation is in place. ``wake_s``: plan again then (None: at the next arrival or idle
    member only). ``merge``: (member, into member) pairs: every request of the first joins
    the second, its KV moved onto the second's instances (the move's time is not charged:
    the planner weighs it, ``GroupView.kv_move_s``)."""

    instances_by_member: tuple[tuple[int, ...], ...]
    assign: tuple[tuple[int, int], ...] = ()
    wake_s: float | None = None
    merge: tuple[tuple[int, int], ...] = ()


class MemberState(NamedTuple):
    """A group member exact at now, read without cutting its fast-forward window: its queues
    (best first) and the decode steps ``num_steps_ahead`` that every running request has done
    beyond what its token counts show (add them to ``num_computed_tokens`` and
    ``num_output_tokens``; 0 outside a window)."""

    running: Sequence[Request]
    waiting: Sequence[Request]
    num_steps_ahead: int


class GroupView(Protocol):
    """What a group planner reads, exact at now: the group's queue (requests not yet given
    to a member, in arrival order), its members (replica views) and their instances."""

    @property
    def num_instances(self) -> int: ...
    @property
    def num_kv_blocks_per_instance(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def waiting(self) -> Sequence[Request]: ...
    @property
    def members(self) -> Sequence[ReplicaView]: ...
    @property
    def instances_by_member(self) -> tuple[tuple[int, ...], ...]: ...
    def member_state(self, member: int) -> MemberState:
        """Member ``member``'s queues at now, its window left running (cheaper than reading
        ``members``, which cuts it)."""
    def member_used_blocks(self, member: int) -> int:
        """Member ``member``'s KV blocks in use at now, its window left running (a pass
        over the window's decoders: ask only when needed)."""
    def member_used_blocks_range(self, member: int) -> tuple[int, int]:
        """(fewest, most) KV blocks member ``member`` may have in use at now, without a
        pass over its window (equal outside a window): enough for a decision that is the
        same at both ends."""
    def step_time_s(self, degree: int, prefill_chunks: Sequence[tuple[int, int]],
                    num_decode: int, kv_tokens: int) -> float:
        """One step of a member of ``degree`` instances (the group's step model)."""
    def kv_move_s(self, num_tokens: int) -> float:
        """Seconds to move ``num_tokens`` of KV from one instance to another."""
    def member_step_end_s(self, member: int) -> float | None:
        """When member ``member``'s step in flight ends (a fast-forward window: its last
        step); None between steps. Until then its queues stay as they are (unless the group
        changes them), and so do its token counts in one ordinary step; in a window its
        requests advance a token a step."""
    def member_used_blocks_at_step_end(self, member: int) -> int:
        """The most KV blocks member ``member`` may hold when its step in flight ends (a
        window's last step); its blocks now between steps."""
    @property
    def step_model_key(self) -> Hashable | None:
        """Equal keys: ``step_time_s`` equal at every degree, in this run and any other (a
        planner may reuse what it derived from it, as ESP's analytical fit); None: no
        such promise."""


class GroupPlanner(Protocol):
    """Plans an instance group at its boundaries: when a request arrives, when a member runs
    out of work, after a step in which a request finished, and at the time its last plan
    asked for. Returning the current allocation
    changes nothing; another one is applied at the next common step boundary of the members
    it changes (their fast-forward windows are cut back to the step in progress)."""

    def plan(self, view: GroupView, now_s: float) -> GroupPlan: ...


# ---- request sources -----------------------------------------------------------------------
class SourceContext(Protocol):
    """What a source may do with the simulation (the cluster implements it)."""

    @property
    def now_s(self) -> float: ...
    def new_request_id(self) -> int: ...
    def submit_at(self, at_s: float, req: Request) -> None: ...


class RequestSource(Protocol):
    """Feeds requests to a cluster. ``wants_finishes``: call ``on_finish`` (else it is
    never called, which keeps plain trace replays fast)."""

    wants_finishes: bool

    def start(self, ctx: SourceContext) -> None:
        """Schedule the first arrival(s)."""

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        """``req`` arrives now (before it is routed): schedule what comes next."""

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        """``req`` finished now."""

    @property
    def num_requests(self) -> int | None:
        """Requests it will submit, when known in advance (progress bars)."""


# ---- controllers ---------------------------------------------------------------------------
class Controller(Protocol):
    """Wakes at times it chooses and may change the cluster's policies at run time."""

    def start(self, cluster: Cluster) -> float | None:
        """The first time to wake (None: never)."""

    def on_tick(self, cluster: Cluster, now_s: float) -> float | None:
        """Woken at ``now_s``: act (``cluster.set_policies``, ...) and say when to wake
        next (None: never again)."""


MakeBatchPolicy = Callable[[], BatchPolicy]
"""Builds one fresh batching policy (one per replica: policies may keep per-replica state)."""


# ---- deployment planners and re-planning triggers (``serving/elastic_control.py``) ---------
@dataclass(frozen=True, slots=True, kw_only=True)
class PoolState:
    """One pool as a deployment planner sees it at a monitoring point."""

    name: str
    role: str
    """The pool's configured role (mixed, or prefill/decode of a P/D cluster)."""
    num_gpus_per_replica: int
    max_replicas: int
    """Replicas the GPUs the pool has now can hold (the join/leave schedule moves it)."""
    num_replicas_by_role: Mapping[str, int]
    """role -> replicas serving or loading in it now (leaving ones not counted)."""
    step_model: StepTimeModel
    """The pool's performance model: what a planner profiles instead of a GPU."""
    num_kv_blocks: int
    block_size: int
    max_running: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitorWindow:
    """What was measured over the last monitoring interval ``[start_s, end_s)``: arrivals
    (count and prompt lengths, as a front end sees them) and the requests that finished in
    it (output lengths and latencies). Means are NaN when nothing was counted."""

    start_s: float
    end_s: float
    num_arrivals: int
    mean_prompt_tokens: float
    num_finished: int
    mean_output_tokens: float
    mean_ttft_s: float
    mean_itl_s: float
    """Mean time per output token after the first, over finished requests."""
    num_waiting: int
    """Requests queued (not running) on serving replicas at ``end_s``."""
    num_in_flight_by_role: Mapping[str, int]
    """role -> requests running or waiting on serving replicas of that role at ``end_s``."""
    arrivals: tuple[tuple[float, int, int], ...] = ()
    """(arrival_s, prompt tokens, output tokens) of each arrival in the window, in order: what
    a replay of the window serves (``serving/replay.py``; the output lengths are the ones the
    requests will generate, which a live system learns as they finish)."""
    carried: tuple[tuple[float, int, int], ...] = ()
    """(start_s, prompt tokens left to compute, output tokens) of each request on a serving
    replica whose prefill had not finished at ``start_s``: the backlog the window started
    with (requests already decoding are not in it)."""
    backlog: tuple[tuple[float, int, int], ...] = ()
    """The same for the requests in flight at ``end_s``: what the next window starts with
    (an evolving planner replays its forecast of the next window from it)."""

    @property
    def interval_s(self) -> float:
        return self.end_s - self.start_s


Deployment = Mapping[tuple[str, str], int]
"""A planner's plan: (pool name, role) -> replicas. Pairs left out keep their count; the
engine clamps each pool to its ``max_replicas`` and keeps one replica of every stage."""


class DeploymentPlanner(Protocol):
    """``plan(pools, window, now_s) -> Deployment``: the replicas each pool should run in
    each role, from the pools' state and the last monitoring window (STYLE.md section 5: a
    view in, a plan out). May keep state (the static planner remembers its first plan)."""

    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment: ...


class ReplanTrigger(Protocol):
    """``should_replan(window) -> bool``: is this monitoring point one to plan at?"""

    def should_replan(self, window: MonitorWindow) -> bool: ...
