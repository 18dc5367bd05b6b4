"""Batching policies: each step, decide how many tokens every request computes.

A step is vLLM v1's token-budget allocation: prefill, chunked prefill and decode are all
"tokens for request r". The policy returns a ``StepPlan``; the engine applies and checks it.
``StepPlan`` and ``BatchPolicy`` are the engine's contract (``serving/contract.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.policies.batch_steps import (
    admit_waiting,
    plan_token_budget,
    serve_running,
    serve_running_swapping,
    swap_in_in_order,
)
from fleetsim.registry import PolicySpec, build, lookup, make_registry
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.contract import BatchPolicy as BatchPolicy  # re-exported
from fleetsim.serving.contract import StepPlan as StepPlan  # re-exported
from fleetsim.serving.views import ReplicaView

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
    reserve_full_isl: bool = False
    """Admit a prompt only if the blocks of its whole input fit the free ones, though only the
    chunk's are taken (vLLM v1's ``scheduler_reserve_full_isl``, on in its recent releases;
    off here by default, as in v0.8-v0.13: admission by the chunk)."""
    preemption_mode: str = "recompute"
    """recompute (drop a victim's KV, compute it again later) | swap (copy it to host memory,
    engine.swap_space_gib, and back; vLLM v0's preemption_mode). Swapped requests come back
    before any waiting one is admitted."""

    # serve_running gives each decoder its one token, and with no admission and no
    # preemption a later decode-only step differs only by fewer available blocks. A lone
    # running prompt given the whole budget takes it again while its rest is at least the
    # budget (serve_running, running requests first), which leaves admission nothing, and
    # swap mode swaps nothing in with no request swapped out or swapping in. With decodes
    # ahead of it in the batch, the prompt gets the budget they leave, again and again while
    # no decode finishes (each keeps needing one token), the blocks their steps take are
    # free (no preemption) and its rest exceeds that chunk: the budget stays full.
    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True,
                                prefill_chunks_repeat=True, mixed_chunks_repeat=True)

    @property
    def splits_prompts(self) -> bool:
        """False when a whole prompt (plus outputs, after a preemption) must fit one step."""
        return self.enable_chunked_prefill

    def __post_init__(self) -> None:
        t = self.long_prefill_token_threshold
        if t is not None and t < 1:
            raise ValueError(f"long_prefill_token_threshold must be >= 1 or None, got {t}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be recompute or swap, got "
                             f"{self.preemption_mode!r}")

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        if self.preemption_mode == "swap":
            budget = view.max_batched_tokens
            cap = self.long_prefill_token_threshold or budget
            return self._plan_swapping(view, {}, budget, cap)
        return plan_token_budget(view, self.enable_chunked_prefill,
                                 self.long_prefill_token_threshold, self.reserve_full_isl)

    def _plan_swapping(self, view: ReplicaView, tokens: dict[int, int], budget: int,
                       cap: int) -> StepPlan:
        budget, available, preempt, swap_out = serve_running_swapping(
            view, tokens, budget, view.kv.num_available_blocks, cap)
        swap_in: tuple[int, ...] = ()
        if not preempt and not swap_out:
            if view.swapped or view.num_swapping_in:  # vLLM v0: swapped ones before new ones
                swap_in, available = swap_in_in_order(view, available)
            else:
                admit_waiting(view, tokens, budget, available, cap,
                              self.enable_chunked_prefill, self.reserve_full_isl)
        return StepPlan(tokens, tuple(preempt), swap_out=tuple(swap_out), swap_in=swap_in)


@register_batch("prefill_first")
@dataclass(slots=True)
class PrefillFirstPlanner:
    """vLLM v0's default scheduler (2023): a step is either prefills or decodes, never both.

    Whenever waiting requests can be admitted, the step prefills them (whole prompts, under
    the token budget) and running requests pause; otherwise every running request decodes one
    token. This is the colocated baseline of DistServe and Splitwise: prefills stall decodes.
    When KV runs out during a decode step, the worst running request is preempted.
    """

    # A decode-only plan repeats until an arrival or a finish; with nothing to admit, every
    # running request decodes.
    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True)

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
