"""``agent_xpu``: Agent.xpu's online scheduler (Wei et al., arXiv:2506.24045) as a batching
policy. Mechanisms from the paper's two abstracts; details ours where the text was not
reachable, marked [R].

Agent.xpu runs on the engine as a P/D cluster on the SoC (``cluster.soc``): a prefill pool on
the accelerator the device model finds faster for a prefill chunk (the NPU on the Core Ultra)
and a decode pool on the one faster for a decode step (the iGPU), the KV handed over in place
(one DDR; v2 "decoupling prefill and decode", the heterogeneous execution graph's affinity).
This policy runs on both replicas; on a mixed replica it fuses the two halves in one step.

- Reactive first, kernel-level preemption (v1 "kernel-level preemption", v2 "fine-grained
  preemption"): every step serves the most urgent class of requests present, reactive
  (``priority <= max_reactive_priority``; ``serving/agent_flows.py`` gives reactive requests
  priority 0) before proactive. A prompt runs one ``chunk_tokens`` chunk per step, so a
  reactive arrival waits at most one chunk of proactive prefill, which stays resident (KV
  kept) and resumes when no reactive work is left. ``preemptive = False`` switches this off:
  work already started runs before anything that has not (reactive first only among those).
- Slack-aware piggybacking (v2): the decodes of the less urgent class join the step while it
  stays within ``reactive_slack`` of the urgent class's step alone [R: the slack value].
- Stage-divergent batching (v2): every urgent decode is batched in one step; one prefill chunk
  per step (one job on the prefill accelerator).
- Bandwidth-aware dispatch (v1 "bandwidth-aware dispatch", v2 "reduce bandwidth contention"):
  a step that serves no reactive request starts only if its DDR share slows every reactive
  decode step running on the other accelerator by at most ``reactive_slack`` [R: the test, the
  same slack]. The replica reads the other's step through ``ReplicaView.co_resident_steps``
  and ``co_resident_slowdowns`` (the DDR shared max-min, ``soc_pools.py``); a vetoed replica
  sleeps (``StepPlan.wait_for_co_resident``) until the other starts or ends a step, and so
  does one that finds the other between steps at this instant (it decides after the other
  has: a handed-off reactive request's first decode step is placed before proactive work).
  A veto says why (``StepPlan.wait_rule``, ``DispatchVeto``): the engine then leaves the
  replica asleep through the other's steps it would veto again, and may fast-forward them.
  ``bandwidth_aware = False`` switches this off.

Not modelled here (a difference from the earlier SoC-only loop, docs/reproductions.md):
elastic binding of a prefill chunk to an idle decode accelerator (a P/D decode replica never
prefills; switched off alone in the old loop, it moved none of its figures).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsim.policies.agent_xpu_steps import plan_step
from fleetsim.policies.batching import register_batch
from fleetsim.policies.ordering import make_ordering
from fleetsim.serving.contract import OrderKey, StepPlan
from fleetsim.serving.views import ReplicaView


@register_batch("agent_xpu")
@dataclass(slots=True)
class AgentXpuPlanner:
    """Each step: the most urgent class's decodes and one prefill chunk of its best request,
    plus the other decodes the slack allows."""

    chunk_tokens: int = 256
    """Prefill tokens per step: the preemption granularity for a reactive arrival."""
    reactive_slack: float = 0.10
    """How much less urgent decodes may slow the urgent class's step (0: never joined)."""
    max_reactive_priority: int = 0
    """Requests whose ``priority`` is at most this are reactive."""
    preemptive: bool = True
    """False: started work is never overtaken (the mechanism switched off)."""
    bandwidth_aware: bool = True
    """Proactive steps wait while they would slow a reactive decode on a replica sharing the
    DDR by more than ``reactive_slack`` (False: the mechanism switched off)."""
    reserve_full_isl: bool = True
    """Start a prompt only if its whole input fits the free KV, though each step takes only
    its chunk's blocks (vLLM v1's ``scheduler_reserve_full_isl``, "prevents over-admission
    and KV cache thrashing with chunked prefill"). False: the first chunk's blocks suffice,
    and a prompt started when they were free may find no blocks for its next chunk while
    the prefill replica's KV waits to be handed over; it is then recomputed."""
    order_key: OrderKey = field(init=False, repr=False)

    splits_prompts = True

    def __post_init__(self) -> None:
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int) or \
                self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be an integer >= 1, got {self.chunk_tokens!r}")
        if not 0.0 <= self.reactive_slack <= 1.0:
            raise ValueError(f"reactive_slack must be in [0, 1], got {self.reactive_slack!r}")
        if not isinstance(self.preemptive, bool):
            raise ValueError(f"preemptive must be true or false, got {self.preemptive!r}")
        if not isinstance(self.bandwidth_aware, bool):
            raise ValueError(f"bandwidth_aware must be true or false, got "
                             f"{self.bandwidth_aware!r}")
        if not isinstance(self.reserve_full_isl, bool):
            raise ValueError(f"reserve_full_isl must be true or false, got "
                             f"{self.reserve_full_isl!r}")
        # The replica's queues in (priority, arrival) order: reactive requests at the front.
        self.order_key = make_ordering("priority")

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        """The step. A step that decodes every running request, all of one class, repeats
        while nothing arrives or finishes and free KV only shrinks (``StepPlan.repeats``: the
        engine fast-forwards it): the classes ahead of it have no running request and their
        best waiting prompt stays short of a slot or KV; its own best waiting prompt too;
        nothing of another class runs, so nothing piggybacks or is preempted; and a step of a
        replica sharing the DDR, which could change the dispatch, cuts the window. With
        other classes running, a step of reactive decodes with proactive ones piggybacked
        brings a rule instead (``StepPlan.repeat_rule``, ``PiggybackRepeat``): the slack
        tests' outcomes change as contexts grow, and the rule finds the step where one
        does. (The loop is ``agent_xpu_steps.plan_step``, compiled.)"""
        return plan_step(view, self.chunk_tokens, self.reactive_slack,
                         self.max_reactive_priority, self.preemptive, self.bandwidth_aware,
                         self.reserve_full_isl)
