"""Speculative decoding in the engine: how many tokens a decode step emits, and the KV slots it
reserves (the settings and their sources are in ``fleetsim.models.speculative``).

Emission schedule. A sequence's accepted length varies step to step; the engine uses a
deterministic schedule with the right mean instead of drawing it: with ``tau = p / q`` tokens
per step (a rational, so the arithmetic is exact integers), the decode step after ``d`` tokens
emitted since the first one emits ``F(m + 1) - d`` tokens, where ``F(n) = floor(n * tau)`` and
``m`` is the step count that reached ``d`` (``F(m) <= d < F(m + 1)``; ``d`` is off the
schedule only after a preemption whose recompute sampled one token, and the next step puts it
back on).
Over n steps a sequence emits exactly ``floor(n * tau)`` tokens, so every request's mean tokens
per step, TPOT and step count are those of the mean acceptance to within one step; the
step-to-step variance (a step emits ``floor(tau)`` or ``ceil(tau)``, never 1 or k + 1 when
tau is between) is not modelled. Why a schedule rather than a seeded draw: the emission of a
step then depends only on the request's own progress, not on a random stream whose order
would change with batching, preemption or fast-forward, so runs stay deterministic and
independent of how the engine steps (fast-forward windows use the same closed forms,
``window.py``). A request's phase restarts with each request (d = 0 at its first token), so
requests that start apart are not in lock-step.

KV. vLLM's V1 scheduler schedules ``1 + k`` tokens for a speculating decode (the verified
positions) and, for EAGLE-family drafters, ``k`` lookahead slots more for the draft's KV
(``vllm/v1/core/sched/scheduler.py``: ``num_lookahead_tokens = num_spec_tokens`` when
``use_eagle()``); rejected positions are overwritten next step. A request on a speculating
replica carries those slots as ``Request.num_lookahead_tokens``, which ``blocks_short`` adds
to every block count, so the policies' KV checks and the engine's allocations agree.
"""

from __future__ import annotations


class Emission:
    """The emission schedule and KV lookahead of one speculating replica."""

    __slots__ = ("max_tokens", "num_lookahead_tokens", "tau_den", "tau_num")

    def __init__(self, tau_num: int, tau_den: int, num_speculative_tokens: int,
                 draft_kv: bool) -> None:
        if not tau_den <= tau_num <= (num_speculative_tokens + 1) * tau_den:
            raise ValueError(f"tokens per step {tau_num}/{tau_den} must be in [1, "
                             f"{num_speculative_tokens + 1}]")
        self.tau_num = tau_num
        self.tau_den = tau_den
        self.max_tokens = num_speculative_tokens + 1  # accepted drafts plus the bonus token
        # Slots past the computed tokens: the k draft positions verified with the new token,
        # plus k for the drafter's own KV (EAGLE family).
        self.num_lookahead_tokens = num_speculative_tokens * (2 if draft_kv else 1)

    def _last_step(self, num_emitted: int) -> int:
        """The step count ``m`` with ``F(m) <= num_emitted < F(m + 1)``."""
        return -(-(num_emitted + 1) * self.tau_den // self.tau_num) - 1

    def steps_for(self, num_emitted: int, num_tokens: int) -> int:
        """Decode steps that take a request from ``num_emitted`` tokens past its first to
        ``num_tokens`` more (the last step may emit fewer: the request's output ends)."""
        p, q = self.tau_num, self.tau_den
        return -(-(num_emitted + num_tokens) * q // p) - self._last_step(num_emitted)

    def emitted(self, num_emitted: int, num_steps: int) -> int:
        """Tokens ``num_steps`` decode steps emit from ``num_emitted`` (before clipping at the
        output limit): ``next_tokens`` summed."""
        if num_steps <= 0:
            return 0
        return ((self._last_step(num_emitted) + num_steps) * self.tau_num // self.tau_den
                - num_emitted)

    def next_tokens(self, num_emitted: int) -> int:
        """Tokens the next decode step emits after ``num_emitted`` tokens past the first
        (before clipping at the request's output limit): ``F(m + 1) - num_emitted``, at
        least 1 and at most ``ceil(tau) <= k + 1``."""
        return ((self._last_step(num_emitted) + 1) * self.tau_num // self.tau_den
                - num_emitted)
