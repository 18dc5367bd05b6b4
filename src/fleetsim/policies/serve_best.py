"""``serve_best``: each step serves only the best ``max_serving`` requests by an ordering,
running or waiting; the other running requests stay resident with their KV, paused.

A one-slot on-device engine with a priority rule (Agent.xpu's attribution ablation, arXiv
2506.24045: an iGPU engine that stops a proactive request between two steps while a reactive
one runs) is ``max_serving = 1`` with the ``priority`` ordering: a reactive arrival takes the
next step, and the proactive request it overtook resumes, KV kept, when no reactive work is
left. A prompt is computed whole in one step (no chunking), as those engines do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsim.policies.batch_steps import next_chunk
from fleetsim.policies.batching import register_batch
from fleetsim.policies.ordering import make_ordering
from fleetsim.serving.contract import OrderKey, StepPlan
from fleetsim.serving.views import ReplicaView


@register_batch("serve_best")
@dataclass(slots=True)
class ServeBestPlanner:
    """The best ``max_serving`` requests (running or waiting, by ``ordering``) get their
    next tokens: a whole prompt, or one decode token; nobody else computes this step."""

    max_serving: int = 1
    """Requests served per step (the rest of ``engine.max_running`` stay resident, paused)."""
    ordering: str = "fcfs"
    """The order that picks them: fcfs | sjf | priority | pkg.mod:key_function (it also
    orders the replica's queues, in place of ``policy.ordering``)."""
    order_key: OrderKey = field(init=False, repr=False)

    splits_prompts = False  # a prompt is computed whole

    def __post_init__(self) -> None:
        if isinstance(self.max_serving, bool) or not isinstance(self.max_serving, int) or \
                self.max_serving < 1:
            raise ValueError(f"max_serving must be an integer >= 1, got {self.max_serving!r}")
        self.order_key = make_ordering(self.ordering)

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        k = self.max_serving
        key = self.order_key
        # Both queues are sorted by this key: the best k of their heads are the best k.
        heads = sorted([*view.running[:k], *view.waiting[:k]], key=lambda r: key(r, now_s))
        budget = view.max_batched_tokens
        kv = view.kv
        available = kv.num_available_blocks
        num_running = len(view.running) + view.num_swapping_in
        waiting = {r.id for r in view.waiting[:k]}
        tokens: dict[int, int] = {}
        preempt: list[int] = []
        victims = list(reversed(view.running))  # worst first
        admitted = False
        for req in heads:
            if len(tokens) == k:
                break
            if req.id in preempt:
                continue
            if req.id in waiting:
                if preempt:
                    # A victim's blocks were counted free above, and those include prefix
                    # entries this request may match and pin: not now, next step's view is exact.
                    continue
                todo = req.num_tokens - kv.num_prefix_hit_tokens(req)
                needed = kv.admission_blocks(req, todo)
                if todo > budget or needed > available or num_running >= view.max_running:
                    # not now: the running requests go on, and free their KV as they end
                    continue
                num_running += 1
                admitted = True
                num_new = todo
            else:
                num_new, needed = next_chunk(req, budget, kv.block_size, kv.blocks_per_entry)
                # Short of KV: recompute paused requests later, the worst first -- unless a
                # waiting request was admitted this step: it may have pinned prefix entries a
                # victim holds, so the victim's blocks would be counted twice.
                while needed > available and victims and victims[0] is not req \
                        and not admitted:
                    victim = victims.pop(0)
                    if victim.id in tokens:
                        break
                    preempt.append(victim.id)
                    available += kv.reclaimable_blocks(victim)
                if needed > available:
                    break
            tokens[req.id] = num_new
            budget -= num_new
            available -= needed
        return StepPlan(tokens, tuple(preempt))
