"""Trajectory-level policies for agentic RL rollout (Heddle, arXiv 2603.28101, and the
baselines it measures against): where each step (LLM call) of a multi-step trajectory runs,
and in which order a worker serves the steps queued on it.

A trajectory is a program (``fleetsim.programs``) whose calls are its steps; the rollout
driver (``fleetsim.rl.agentic_rollout``) keeps a ``TrajectoryPlan`` in each program's
``policy`` slot: the predicted length, refined after every step, and the worker Heddle's
placement chose. The routers and the ordering read it; on a plain request (no program) every
policy falls back to least-requests routing and arrival order.

Routers (the paper's baselines, as its evaluation names them; from secondary summaries of the
paper, whose body could not be read):
- ``least_requests``: slime, per-step least-load routing: every step goes to the worker with
  the fewest calls in flight (running plus waiting), wherever the trajectory's KV is;
- ``sticky``: verl, cache-aware sticky placement: a trajectory's first step goes to the least
  loaded worker, and all its later steps follow it there (its prefix cache);
- ``sticky_skew``: verl*, sticky until the worker's load passes ``skew_threshold`` times the
  mean, then least-load (and sticky to the new worker from then on);
- ``trajectory_plan``: Heddle, the worker its placement chose (``TrajectoryPlan.worker``).

Batching: ``progressive_priority`` (Heddle): the token-budget planner whose queues put the
trajectory predicted longest first, with preemption (below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fleetsim.policies.batch_steps import admit_waiting, serve_running_swapping
from fleetsim.policies.batching import TokenBudgetPlanner, register_batch
from fleetsim.policies.routing import num_in_flight, register_router
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.contract import ClusterView, StepPlan
from fleetsim.serving.request import Request
from fleetsim.serving.views import ReplicaView


class TrajectoryPlan:
    """What the rollout driver tells the policies about one trajectory (kept in its
    program's ``policy`` slot)."""

    __slots__ = ("predicted_tokens", "worker")

    def __init__(self, predicted_tokens: float, worker: int | None = None) -> None:
        self.predicted_tokens = predicted_tokens
        """Predicted total generated tokens (refined after every step)."""
        self.worker = worker
        """The worker the placement chose (None: the router decides)."""


def trajectory_of(req: Request) -> tuple[int, TrajectoryPlan | None] | None:
    """(program id, plan) of a trajectory's step, or None for a plain request."""
    tag = req.program
    program = getattr(tag, "program", None)
    if program is None:
        return None
    plan = program.policy
    return program.id, plan if isinstance(plan, TrajectoryPlan) else None


def least_requests(view: ClusterView) -> int:
    """The replica with the fewest calls in flight (first on ties)."""
    reps = view.replicas
    return min(range(len(reps)), key=lambda i: (num_in_flight(reps[i]), i))


@register_router("least_requests")
@dataclass(slots=True)
class LeastRequests:
    """slime: every call to the replica with the fewest calls in flight."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        return least_requests(view)


@register_router("sticky")
@dataclass(slots=True)
class Sticky:
    """verl: a trajectory's first call to the least loaded replica, the rest follow it."""

    replica_by_trajectory: dict[int, int] = field(default_factory=dict)
    """program id -> the replica its calls stick to (state, fresh per run)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        traj = trajectory_of(req)
        if traj is None:
            return least_requests(view)
        i = self.replica_by_trajectory.get(traj[0])
        if i is None:
            i = self.replica_by_trajectory[traj[0]] = least_requests(view)
        return i


@register_router("sticky_skew")
@dataclass(slots=True)
class StickySkew:
    """verl*: sticky, but when the sticky replica's calls in flight exceed ``skew_threshold``
    times the mean over replicas, the call goes to the least loaded one (and sticks there)."""

    skew_threshold: float = 1.5
    """Load over mean above which balance wins over stickiness (our assumption: the paper's
    threshold is not in what we could read)."""
    replica_by_trajectory: dict[int, int] = field(default_factory=dict)
    """program id -> the replica its calls stick to."""
    num_skew_routes: int = 0
    """Calls sent away from their sticky replica (reported)."""

    def __post_init__(self) -> None:
        if not self.skew_threshold >= 1:
            raise ValueError(f"skew_threshold must be >= 1, got {self.skew_threshold}")

    def report(self) -> dict[str, int]:
        return {"num_skew_routes": self.num_skew_routes}

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        traj = trajectory_of(req)
        if traj is None:
            return least_requests(view)
        reps = view.replicas
        i = self.replica_by_trajectory.get(traj[0])
        if i is not None:
            mean = sum(num_in_flight(r) for r in reps) / len(reps)
            if num_in_flight(reps[i]) <= self.skew_threshold * max(mean, 1.0):
                return i
            self.num_skew_routes += 1
        i = self.replica_by_trajectory[traj[0]] = least_requests(view)
        return i


@register_router("trajectory_plan")
@dataclass(slots=True)
class TrajectoryPlanRouter:
    """Heddle: the replica the trajectory's placement chose (least requests without one)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        traj = trajectory_of(req)
        if traj is None or traj[1] is None or traj[1].worker is None:
            return least_requests(view)
        w = traj[1].worker
        reps = view.replicas
        if 0 <= w < len(reps) and reps[w].replica_id == w:
            return w
        # The cluster hides replicas too small to hold a step alone (a low-TP worker of
        # heterogeneous pools, a long context): the view's index is not the worker's id.
        for i, r in enumerate(reps):
            if r.replica_id == w:
                return i
        if w < 0:
            raise ValueError(f"trajectory_plan: worker {w} of trajectory {traj[0]} is not a "
                             f"replica (0 to {len(reps) - 1})")
        return least_requests(view)  # its worker cannot hold this step: the least loaded


Key = tuple[float, ...]


@register_batch("progressive_priority")
@dataclass(slots=True)
class ProgressivePriority(TokenBudgetPlanner):
    """Heddle's progressive priority: the trajectory predicted longest first.

    A step's key is its trajectory's predicted total tokens when it is queued, and the
    prediction is refined after every step, so a trajectory revealed to be long-tail climbs
    the queue at its next step instead of re-queueing behind the short ones (FCFS's
    cumulative queueing delay). Preemptive: when the best waiting step cannot be admitted for
    want of a running slot or KV blocks while a running step has a worse key, the worst
    running one is preempted, one per plan, until the best waiting one fits or every running
    step is better. A preempted step is recomputed (``preemption_mode`` recompute, SGLang's
    retract) or its KV is swapped to host memory and back (swap): swapped steps come back
    ahead of waiting ones only when their key is better, so a step swapped out for a better
    one does not take its place back before it runs.

    Keys do not change while a step is queued (a trajectory's prediction changes only
    between its steps), so a plan that only decodes repeats while nothing arrives or
    finishes: fast-forward is safe.
    """

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)

    @property
    def order_key(self) -> Callable[[Request, float], Key]:
        return self.key

    def key(self, req: Request, now_s: float) -> Key:
        traj = trajectory_of(req)
        predicted = traj[1].predicted_tokens if traj is not None and traj[1] is not None else 0.0
        key = (-predicted, req.arrival_s, float(req.id))
        req.policy_state = key
        return key

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        plan = TokenBudgetPlanner.plan(self, view, now_s)
        if plan.preempt or not view.waiting or not view.running:
            return plan
        head = view.waiting[0]
        if head.id in plan.tokens_by_request:
            return plan
        worst = view.running[-1]
        if not head.policy_state < worst.policy_state:
            return plan
        need = view.kv.admission_blocks(head, min(head.num_prompt_tokens,
                                                  view.max_batched_tokens))
        if len(view.running) >= view.max_running or need > view.kv.num_available_blocks:
            if self.preemption_mode == "swap" and view.num_blocks_swapping_out == 0:
                host_blocks = view.kv.num_blocks_for(worst.num_computed_tokens)
                if 0 < host_blocks <= view.num_free_host_blocks:
                    return StepPlan({}, (), swap_out=(worst.id,))
            if self.preemption_mode == "swap" and view.num_blocks_swapping_out:
                return plan  # blocks are on their way out: wait for them
            return StepPlan({}, (worst.id,))
        return plan

    def _plan_swapping(self, view: ReplicaView, tokens: dict[int, int], budget: int,
                       cap: int) -> StepPlan:
        """Swap preemption under KV pressure (``serve_running_swapping``); then swapped steps
        come back, best key first, while they are better than the best waiting one; then
        waiting ones are admitted."""
        budget, available, preempt, swap_out = serve_running_swapping(
            view, tokens, budget, view.kv.num_available_blocks, cap)
        if preempt or swap_out:
            return StepPlan(tokens, tuple(preempt), swap_out=tuple(swap_out))
        head = view.waiting[0] if view.waiting else None
        kv = view.kv
        slots = view.max_running - len(view.running) - view.num_swapping_in
        back: list[int] = []
        waiting_blocked = False
        num_kv_blocks = view.num_kv_blocks
        watermark = -(-num_kv_blocks // 100)
        for req in sorted(view.swapped, key=lambda r: r.policy_state):
            if head is not None and not req.policy_state < head.policy_state:
                break  # keys are set when a step is queued, so every swapped one has one
            # vLLM v0's swap-in check keeps a watermark of 1% of the blocks free, so a step
            # brought back is not swapped out again by the next decode's block; a step whose
            # context needs more than the cache less the watermark comes back into the whole
            # cache (routing let it in because it fits alone), else it never would
            need = min(kv.num_blocks_for(req.num_computed_tokens + 1) + watermark,
                       num_kv_blocks)
            if slots <= 0 or need > available:
                waiting_blocked = True  # a better swapped step waits: nothing overtakes it
                break
            back.append(req.id)
            available -= need
            slots -= 1
        if not back and not waiting_blocked and not view.num_swapping_in:
            admit_waiting(view, tokens, budget, available, cap, self.enable_chunked_prefill,
                          self.reserve_full_isl)
        return StepPlan(tokens, (), swap_in=tuple(back))
