"""Batching policies: each step, decide how many tokens every request computes.

A step is vLLM v1's token-budget allocation: prefill, chunked prefill and decode are all
"tokens for request r". The policy returns a ``StepPlan``; the engine applies and checks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from fleetsim.policies.batch_steps import ReplicaView, admit_waiting, serve_running
from fleetsim.policies.registry import PolicySpec, build, lookup, make_registry


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step computes."""

    tokens_by_request: Mapping[int, int]  # request_id -> tokens to compute this step
    preempt: tuple[int, ...] = ()  # running request_ids to evict (recompute later), in order


class BatchPolicy(Protocol):
    # False if a prompt is never split across steps (then every prompt must fit the budget).
    splits_prompts: bool
    # True if, after a plan that only decodes the running requests, the same plan repeats as
    # long as nothing arrives or finishes and free KV only shrinks. Lets the engine
    # fast-forward decode-only stretches.
    fast_forward_safe: bool
    # True if, whenever nothing waits, every running request is decoding, they number at
    # most the token budget and the free KV blocks hold one more token for each, the plan
    # decodes each running request once. Lets the engine skip planning those steps.
    decodes_all_when_idle: bool

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan: ...


BATCH_POLICIES, register_batch = make_registry("batching")


@register_batch("token_budget")
@dataclass(slots=True)
class TokenBudgetPlanner:
    """vLLM v1's scheduler: running requests first, then waiting ones, under a token budget.

    Running requests (best first) get the tokens they need, capped by the budget; when KV
    blocks run out, the worst running request is preempted (recompute) until the current one
    fits. If nothing was preempted, waiting requests are admitted in order while the budget,
    ``max_running`` and KV allow; the first one that does not fit stops admission (no
    overtaking, so the ordering policy is strict).

    Fast-forward is safe: with no admission and no preemption, a later decode-only step
    differs only by fewer available blocks, which cannot admit anything new.
    """

    enable_chunked_prefill: bool = True
    """Split long prefills across steps (vLLM's chunked prefill); else a prompt goes whole."""
    long_prefill_token_threshold: int | None = None
    """Cap on one request's prefill chunk per step (vLLM's long_prefill_token_threshold)."""

    fast_forward_safe = True
    decodes_all_when_idle = True  # serve_running gives each decoder its one token

    @property
    def splits_prompts(self) -> bool:
        """False when a whole prompt (plus outputs, after a preemption) must fit one step."""
        return self.enable_chunked_prefill

    def __post_init__(self) -> None:
        t = self.long_prefill_token_threshold
        if t is not None and t < 1:
            raise ValueError(f"long_prefill_token_threshold must be >= 1 or None, got {t}")

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        budget = view.max_batched_tokens
        cap = self.long_prefill_token_threshold or budget
        tokens: dict[int, int] = {}
        budget, available, preempt = serve_running(
            view, tokens, budget, view.kv.num_available_blocks, cap)
        if not preempt:
            admit_waiting(view, tokens, budget, available, cap, self.enable_chunked_prefill)
        return StepPlan(tokens, tuple(preempt))


@register_batch("prefill_first")
@dataclass(slots=True)
class PrefillFirstPlanner:
    """vLLM v0's default scheduler (2023): a step is either prefills or decodes, never both.

    Whenever waiting requests can be admitted, the step prefills them (whole prompts, under
    the token budget) and running requests pause; otherwise every running request decodes one
    token. This is the colocated baseline of DistServe and Splitwise: prefills stall decodes.
    When KV runs out during a decode step, the worst running request is preempted.
    """

    fast_forward_safe = True  # a decode-only plan repeats until an arrival or a finish
    decodes_all_when_idle = True  # nothing to admit: every running request decodes

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        budget = view.max_batched_tokens
        available = view.kv.num_available_blocks
        tokens: dict[int, int] = {}
        admit_waiting(view, tokens, budget, available, budget, chunked=False)
        if tokens:
            return StepPlan(tokens)
        _, _, preempt = serve_running(view, tokens, budget, available, budget)
        return StepPlan(tokens, tuple(preempt))

    @property
    def splits_prompts(self) -> bool:
        return False


def make_batch_policy(spec: PolicySpec) -> BatchPolicy:
    """Build the batching policy named by ``spec`` with its args."""
    cls = lookup(BATCH_POLICIES, spec.name, "policy.batching.name")
    policy: BatchPolicy = build(cls, spec.args, "policy.batching")
    return policy
