"""Program-level scheduling: Workflow-FCFS, Autellix PLAS and ATLAS, Workflow-LLF and
HexAGenT's risk priority (batching policies that bring their own queue order), Autellix's
locality-aware balancer and HexAGenT's heterogeneity-aware placement (routers).

Each call submitted by a program source carries a tag in ``Request.program``
(``fleetsim.programs.ProgramCall``: its program's arrival, attained service and revealed
horizon, the call's standalone estimate); these policies read it by attribute, so they also
run on plain requests (no tag: the request is a one-call program that arrived when it did,
with no service yet). The planner is vLLM's token budget (``TokenBudgetPlanner``) in every
case; only the order of the engine's queues changes, and a key is computed when a call
enters a queue (the engine keeps queues sorted by it):

- ``workflow_fcfs``: programs in arrival order (SGLang's FCFS at program granularity,
  HexAGenT's W-FCFS baseline);
- ``plas`` / ``atlas`` (Autellix, Luo et al., arXiv 2502.13965): least attained service
  first, per program (PLAS: the engine seconds of its finished calls) or along the critical
  path (ATLAS: the most, over the call's parents, of their path service), discretised into
  queues with boundaries ``base_quantum_s * ratio**k`` (the paper's multi-level queues; the
  boundaries are our assumption). Anti-starvation: a call whose program has waited longer
  than ``starvation_ratio`` times its attained service goes to the top queue (Autellix
  promotes by wait/service ratio). Keys change as programs attain service and wait: at every
  plan, waiting calls whose key changed are re-keyed (``StepPlan.rekey``) before anything is
  admitted, as Autellix's queues are;
- ``workflow_llf``: least laxity first, deadline ``a_w + slo_scale * H_w`` (H_w the revealed
  critical path in standalone seconds; T_w itself is unknown online), laxity = deadline minus
  the revealed work left on the call's path;
- ``hexagent``: highest projected risk ``R = ((t - a_w) + Delta) / H_w`` first (HexAGenT,
  arXiv 2605.16637: the risk is the local queue priority). Delta is the projected completion
  of the call under the plan its router chose (``HexAGenTPlacement``: prefill queue and
  prefill, KV transfer P->D, decode wait and decode), or its standalone time without one.
  The risk grows with t, so each plan re-evaluates the waiting calls' risks at t and
  re-keys them when the queue's order no longer follows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetsim.policies.batching import TokenBudgetPlanner, register_batch
from fleetsim.policies.routing import register_router
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.contract import ClusterView, StepPlan
from fleetsim.serving.request import RUNNING, Request
from fleetsim.serving.views import ReplicaView

Key = tuple[float, ...]


def _tag(req: Request) -> Any:
    """The program tag, or None for a plain request."""
    tag = req.program
    return tag if hasattr(tag, "program") and hasattr(tag, "path_s") else None


def _level(service_s: float, base_s: float, ratio: float, num_levels: int) -> int:
    if service_s < base_s:
        return 0
    return min(num_levels - 1, 1 + int(math.log(service_s / base_s, ratio)))


@dataclass(slots=True)
class _ProgramOrdered(TokenBudgetPlanner):
    """A token-budget planner whose queues follow a program-level key."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)

    @property
    def order_key(self) -> Callable[[Request, float], Key]:
        return self.key

    def key(self, req: Request, now_s: float) -> Key:
        """Workflow-FCFS, the base order: programs by arrival, then calls by readiness."""
        tag = _tag(req)
        arrival = tag.program.arrival_s if tag is not None else req.arrival_s
        return (arrival, req.arrival_s, req.id)


@register_batch("workflow_fcfs")
@dataclass(slots=True)
class WorkflowFCFS(_ProgramOrdered):
    """Programs in arrival order; within one, calls in the order they became ready (the
    base class's key)."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)


@register_batch("plas")
@dataclass(slots=True)
class AutellixPLAS(_ProgramOrdered):
    """Autellix PLAS: least attained service of the program first, in discrete queues.

    A waiting call's key follows its program's attained service (which grows when another of
    its calls finishes, on any replica) and its wait (anti-starvation): each plan first
    re-keys the waiting calls whose key changed (a plan of only ``rekey``; the engine then
    asks again with the queue re-sorted). So the plan can change with time alone while calls
    wait: not ``fast_forward_safe`` (as FastServe's MLFQ); with nothing waiting every running
    call decodes.
    """

    base_quantum_s: float = 1.0
    """Upper bound of the top queue, engine seconds of attained service (our assumption)."""
    quantum_ratio: float = 2.0
    """Each queue's bound over the previous one's."""
    num_levels: int = 8
    """Queues."""
    starvation_ratio: float = 3.0
    """A call that waited this many times its program's attained service (counted when it
    enters a queue) goes to the top queue (anti-starvation)."""
    preemptive: bool = True
    """Preempt running calls of lower queues for a waiting call of a higher one that KV or
    the running slots keep out (Autellix's schedulers "preempt and prioritize LLM calls
    based on their programs' previously completed calls", arXiv 2502.13965 abstract; a call
    that exhausts its queue's quantum is demoted, its Figure 10). A running call's queue
    counts its own service too. False: order only (queues, no preemption)."""
    _level_by_service: dict[float, int] = field(default_factory=dict, init=False, repr=False)
    # (every plan re-keys the queued calls, most with the service they had at the last one)

    capabilities = Capabilities(fast_forward_safe=False, decodes_all_when_idle=True)

    def __post_init__(self) -> None:
        TokenBudgetPlanner.__post_init__(self)
        if not self.base_quantum_s > 0 or not self.quantum_ratio > 1 or self.num_levels < 1:
            raise ValueError("base_quantum_s > 0, quantum_ratio > 1 and num_levels >= 1 "
                             f"required, got {self.base_quantum_s}, {self.quantum_ratio}, "
                             f"{self.num_levels}")
        if not self.starvation_ratio > 0:
            raise ValueError(f"starvation_ratio must be > 0, got {self.starvation_ratio}")

    def service_s(self, tag: Any) -> float:
        return float(tag.program.service_s)

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        # The key each queued call was queued under is kept in its policy_state. Running
        # calls are re-keyed only while calls wait: their order matters then alone (whom to
        # preempt), and a plan of only re-keys needs a waiting call to plan again for.
        queued = (*view.waiting, *view.running) if self.preemptive and view.waiting else (
            view.waiting)
        stale = tuple(r.id for r in queued
                      if r.program is not None and self._key(r, now_s) != r.policy_state)
        if stale:
            return StepPlan({}, rekey=stale)
        plan = TokenBudgetPlanner.plan(self, view, now_s)
        if not self.preemptive or plan.preempt or plan.swap_out or not view.waiting:
            return plan
        return self._preempt_for(view, plan)

    def _preempt_for(self, view: ReplicaView, plan: StepPlan) -> StepPlan:
        """``plan`` with the lowest-queue running calls preempted (recompute, vLLM's default
        for one sequence) when the first waiting call it left out is in a higher queue and
        KV blocks or a running slot, not the token budget, keep it out."""
        tokens = plan.tokens_by_request
        head = next((r for r in view.waiting if r.id not in tokens), None)
        budget = view.max_batched_tokens - sum(tokens.values())
        if head is None or budget <= 0 or not isinstance(head.policy_state, tuple):
            return plan
        kv = view.kv
        need = kv.admission_blocks(head, max(1, min(
            head.num_tokens - kv.num_prefix_hit_tokens(head), budget)))
        free = kv.num_available_blocks - sum(
            kv.blocks_needed(r, tokens[r.id]) if r.state == RUNNING
            else kv.admission_blocks(r, tokens[r.id])
            for r in (*view.running, *view.waiting) if r.id in tokens)
        slots = (view.max_running - len(view.running) - view.num_swapping_in
                 - sum(1 for r in view.waiting if r.id in tokens))
        victims: list[Request] = []
        for r in reversed(view.running):  # worst first (the queue is sorted best first)
            if free >= need and slots >= 1:
                break
            if not isinstance(r.policy_state, tuple) or r.policy_state[0] <= head.policy_state[0]:
                return plan  # no lower-queue call left to make room: no preemption
            victims.append(r)
            free += kv.reclaimable_blocks(r) + (kv.blocks_needed(r, tokens[r.id])
                                                if r.id in tokens else 0)
            slots += 1
        if not victims or free < need or slots < 1:
            return plan
        out = {rid: n for rid, n in tokens.items() if rid not in {r.id for r in victims}}
        return StepPlan(out, preempt=tuple(r.id for r in victims))

    def key(self, req: Request, now_s: float) -> Key:
        key = self._key(req, now_s)
        req.policy_state = key
        return key

    def _key(self, req: Request, now_s: float) -> Key:
        tag = _tag(req)
        if tag is None:
            return (0, req.arrival_s, req.id)
        # A preemptive scheduler counts the call's own service too: a call that exhausts its
        # queue's quantum while it runs is demoted (the paper's Figure 10).
        service = self.service_s(tag) + (req.service_s if self.preemptive else 0.0)
        waited = now_s - tag.program.arrival_s - service
        levels = self._level_by_service
        level = levels.get(service)
        if level is None:
            if len(levels) >= 4096:  # (running calls bring a new service every step)
                levels.clear()
            level = levels[service] = _level(service, self.base_quantum_s, self.quantum_ratio,
                                             self.num_levels)
        if service > 0 and waited > self.starvation_ratio * service:
            level = 0
        return (level, tag.program.arrival_s, req.arrival_s, req.id)


@register_batch("atlas")
@dataclass(slots=True)
class AutellixATLAS(AutellixPLAS):
    """Autellix ATLAS: PLAS along the critical path (the call's parents' path service)."""

    capabilities = Capabilities(fast_forward_safe=False, decodes_all_when_idle=True)

    def service_s(self, tag: Any) -> float:
        return float(tag.path_service_s)


@register_batch("workflow_llf")
@dataclass(slots=True)
class WorkflowLLF(_ProgramOrdered):
    """Least laxity first against the deadline ``a_w + slo_scale * H_w``."""

    slo_scale: float = 2.0
    """s of the deadline s x H_w (HexAGenT's LLF baseline; search it with repro/slo-scale)."""

    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)

    def __post_init__(self) -> None:
        TokenBudgetPlanner.__post_init__(self)
        if not self.slo_scale >= 1:
            raise ValueError(f"slo_scale must be >= 1, got {self.slo_scale}")

    def key(self, req: Request, now_s: float) -> Key:
        tag = _tag(req)
        if tag is None:
            return (req.arrival_s, req.id)
        program = tag.program
        deadline = program.arrival_s + self.slo_scale * program.horizon_s
        # Revealed work left from this call's start along its path: the call and what the
        # horizon holds beyond it (the rest is unknown online).
        work_left = program.horizon_s - (tag.path_s - tag.est_s)
        return (deadline - work_left, req.arrival_s, req.id)


@register_batch("hexagent")
@dataclass(slots=True)
class HexAGenTPriority(_ProgramOrdered):
    """HexAGenT: the highest projected risk ``((t - a_w) + Delta) / H_w`` first, Delta the
    call's projected completion under its router's plan (``Plan.delta_s``; the standalone
    time ``est_s`` when no HexAGenT router planned it).

    The risk is a function of time: it grows at 1 / H_w, so a program with a short horizon
    overtakes a longer one that was ahead when both were queued, and H_w itself grows as a
    program reveals calls. Each plan therefore evaluates the waiting calls' risks at ``t``
    and, when their queue order no longer follows it, re-keys them all (a plan of only
    ``rekey``; the engine re-sorts and asks again). The plan can change with time alone
    while calls wait: not ``fast_forward_safe``; with nothing waiting every running call
    decodes."""

    capabilities = Capabilities(fast_forward_safe=False, decodes_all_when_idle=True)

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        waiting = view.waiting
        if len(waiting) > 1:
            key = self.key
            prev = key(waiting[0], now_s)
            for i in range(1, len(waiting)):  # up to the first call out of order
                k = key(waiting[i], now_s)
                if prev > k:
                    return StepPlan({}, rekey=tuple(r.id for r in waiting))
                prev = k
        return TokenBudgetPlanner.plan(self, view, now_s)

    def key(self, req: Request, now_s: float) -> Key:
        tag = _tag(req)
        if tag is None:
            return (0.0, req.arrival_s, req.id)
        program = tag.program
        plan = tag.policy
        delta = plan.delta_s if isinstance(plan, Plan) else tag.est_s
        risk = ((now_s - program.arrival_s) + delta) / max(program.horizon_s, 1e-9)
        return (-risk, program.arrival_s, req.arrival_s, req.id)


# ---- routers -------------------------------------------------------------------------
@register_router("autellix_locality")
@dataclass(slots=True)
class AutellixLocality:
    """Autellix's locality-aware balancer: a program whose attained service passed
    ``long_program_s`` stays on the replica of its previous call (its context is cached
    there); other calls go to the least loaded replica."""

    long_program_s: float = 2.0
    """Attained engine seconds above which a program is pinned (our assumption)."""
    num_pinned_routes: int = 0
    _home: dict[int, int] = field(default_factory=dict, repr=False)  # program id -> replica id

    def report(self) -> dict[str, int]:
        return {"num_pinned_routes": self.num_pinned_routes}

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        reps = view.replicas
        tag = _tag(req)
        if tag is not None and tag.program.service_s >= self.long_program_s:
            home = self._home.get(tag.program.id)
            for i, r in enumerate(reps):
                if r.replica_id == home:
                    self.num_pinned_routes += 1
                    return i
        best = min(range(len(reps)), key=lambda i: (reps[i].load_tokens, i))
        if tag is not None:
            self._home[tag.program.id] = reps[best].replica_id
        return best


@dataclass(frozen=True, slots=True)
class Plan:
    """HexAGenT's stage plan for one call (kept in its tag's ``policy``)."""

    decode_replica_id: int | None  # None: prefill and decode on one (mixed) replica
    delta_s: float  # projected seconds from routing to the call's last token


@register_router("hexagent")
@dataclass(slots=True)
class HexAGenTPlacement:
    """HexAGenT's placement on heterogeneous pools: the (prefill, decode) plan whose call
    would complete first, by greedy enumeration of every pair (the paper's joint choice).

    A plan's completion Delta = the prefill queue and the prefill at that replica's own speed
    ((backlog + prompt) tokens at its per-token prefill time), the KV transfer P->D over the slower
    of the two links, the decode wait, and the decode (output tokens at the step time of the decode
    replica's batch plus one). Decode KV feasibility: a decode replica whose free KV cannot hold the
    call (or that has no free running slot) now waits one such decode first, so it is chosen only
    when no feasible one is faster. On mixed replicas the plan is one replica (no transfer). The
    plan goes into the call's tag (``Plan``: the batching policy's Delta); at the handoff, the
    decode router takes the planned replica if it can still hold the KV, else plans the decode stage
    again. Output lengths are the generator's (an oracle, as the paper's estimates). The scheduler's
    own decision time is off the critical path (the paper applies plans asynchronously). Backends
    without a performance model (the live gateway's) are weighed by backlog plus prompt tokens
    alone."""

    replan_decode: bool = True
    """At the handoff, send the call to another decode replica when that would now finish
    its decode sooner than the planned one (the plan was made at prefill routing, before the
    prefill queue; measured on LATS at 8 programs/s, stale plans kept the A100 decode
    replicas idle while the H200s queued). Our addition within the paper's Delta (decode wait
    plus decode); False: the handoff checks KV feasibility only, the paper's check as we have
    it."""
    _per_token_s: dict[tuple[int, int], float] = field(default_factory=dict, repr=False)

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        reps: Sequence[Any] = view.replicas
        if reps and getattr(reps[0], "role", "mixed") == "decode":
            return self._route_decode(reps, req)
        tag = _tag(req)
        # Each decode replica's (id, link, decode seconds), read once per decision; the pairs
        # are then plain float arithmetic (a Plan is made for the chosen one only).
        decodes = [(d.replica_id, d.link_bw_bytes_per_s, self._decode_s(d, req))
                   for d in getattr(view, "next_stage", ())]
        best, best_decode, best_delta = 0, None, math.inf
        for i, p in enumerate(reps):
            prefill_s = self._prefill_s(p, req)
            if not decodes:
                decode_id, delta = None, prefill_s + self._decode_s(p, req)
            else:
                n_bytes = p.kv_bytes_per_token * req.num_prompt_tokens
                p_bw = p.link_bw_bytes_per_s
                decode_id, delta = None, math.inf
                for d_id, d_bw, decode_s in decodes:  # the first pair that completes first
                    pair = prefill_s + n_bytes / min(p_bw, d_bw) + decode_s
                    if decode_id is None or pair < delta:
                        decode_id, delta = d_id, pair
            if delta < best_delta:
                best, best_decode, best_delta = i, decode_id, delta
        if tag is not None:
            tag.policy = Plan(best_decode, best_delta)
        return best

    def _route_decode(self, reps: Sequence[Any], req: Request) -> int:
        tag = _tag(req)
        plan = tag.policy if tag is not None else None
        if isinstance(plan, Plan):
            for i, d in enumerate(reps):
                if d.replica_id == plan.decode_replica_id and self._fits(d, req):
                    if not self.replan_decode:
                        return i
                    # the planned replica first among equals
                    times = [self._decode_s(r, req) for r in reps]
                    best = _first_min(times)
                    return i if times[i] == times[best] else best
        return _first_min([self._decode_s(d, req) for d in reps])

    def _prefill_s(self, r: Any, req: Request) -> float:
        # The whole prompt: with prefix hits in the estimate, calls piled onto the replicas
        # holding their programs' contexts (docs/programs.md, measured).
        n = max(req.num_prompt_tokens, 1)
        key = (r.replica_id, n)
        per = self._per_token_s.get(key)
        if per is None:
            step = getattr(r, "step_time_s", None)
            per = float(step([(n, 0)], 0, 0)) / n if step is not None else 1.0
            self._per_token_s[key] = per
        return float(r.load_tokens + n) * per

    def _decode_s(self, d: Any, req: Request) -> float:
        """Decode wait + decode seconds of ``req`` on ``d``: its output tokens at the step
        time of d's batch plus this call (the calls running there at their contexts, those
        waiting or arriving there and this one at this call's mean context), doubled where
        d cannot take it now (it waits about one such decode)."""
        step = getattr(d, "step_time_s", None)
        if step is None:
            return 0.0
        # (read without cutting d's decode window: every decision reads every decode replica)
        num_running, running_tokens, num_waiting, num_available_blocks = d.decode_load()
        queued = num_waiting + d.num_incoming + 1
        context = req.num_prompt_tokens + req.max_output_tokens // 2
        kv_tokens = running_tokens + queued * context
        decode_s = req.max_output_tokens * float(step((), num_running + queued, kv_tokens))
        if _room(d, req, num_running, num_available_blocks):
            return decode_s
        return 2 * decode_s

    @staticmethod
    def _fits(d: Any, req: Request) -> bool:
        load = getattr(d, "decode_load", None)
        if load is None:
            return True
        num_running, _, _, num_available_blocks = load()
        return _room(d, req, num_running, num_available_blocks)


def _room(d: Any, req: Request, num_running: int, num_available_blocks: int) -> bool:
    """Whether decode replica ``d`` (``num_running`` calls, ``num_available_blocks`` free) can
    take ``req`` now: blocks for its whole sequence and a running slot."""
    need = -(-(req.num_prompt_tokens + req.max_output_tokens) // d.block_size)
    return bool(need <= num_available_blocks and num_running + d.num_incoming < d.max_running)


@register_router("speed_aware")
@dataclass(slots=True)
class SpeedAware(HexAGenTPlacement):
    """A speed-aware router for baselines on heterogeneous pools: each stage on its own, the
    replica where the call would finish its stage first, by HexAGenT's stage estimates
    (prefill: backlog plus prompt at that replica's per-token prefill time; decode: output
    tokens at the step time of the replica's batch plus one, doubled where it cannot take the
    call now). No joint plan, no Delta for the batching policy, no transfer term: the
    least-loaded router made aware of GPU speed, so that a baseline does not lose to
    HexAGenT only for sending calls to A100s as readily as to H200s (our construction; the
    paper names its baselines' schedulers, not their routers)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        reps: Sequence[Any] = view.replicas
        role = getattr(reps[0], "role", "mixed") if reps else "mixed"
        if role == "decode":
            return _first_min([self._decode_s(d, req) for d in reps])
        if role == "prefill":
            return _first_min([self._prefill_s(p, req) for p in reps])
        return _first_min([self._prefill_s(r, req) + self._decode_s(r, req) for r in reps])


def _first_min(times: Sequence[float]) -> int:
    """The index of the first smallest of ``times`` (``min`` by (time, index))."""
    best = 0
    for i in range(1, len(times)):
        if times[i] < times[best]:
            best = i
    return best
