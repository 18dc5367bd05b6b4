"""Standalone times: a call alone on an idle replica, and a program's T_w (HexAGenT's
standalone completion time) as the critical path of its calls and tool waits.

Computed with the engine's own step model (``serving.standalone``): prefill of the prompt
tokens the prefix cache cannot supply, in chunks of the step budget, then one decode step per
output token after the first at batch size 1. Prefix reuse is the best case a program alone
gets (``dag.shared_prefix_tokens``), so T_w is a lower bound of what the engine can do with
the program alone: batching with sibling calls only lengthens steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetsim.perf.base import StepTimeModel
from fleetsim.programs.dag import Program, shared_prefix_tokens
from fleetsim.serving.standalone import decode_time_s


@dataclass(slots=True)
class CallTimer:
    """Seconds of one call alone: the fastest prefill pool, then (P/D) the KV handoff over
    an idle link and the fastest decode pool; every pool when the cluster is mixed."""

    prefill_models: Sequence[StepTimeModel]
    max_batched_tokens: int
    decode_models: Sequence[StepTimeModel] = ()
    """Decode pools (P/D); empty when pools are mixed."""
    handoff_s_per_token: float = 0.0
    """P/D: seconds per prompt token over the fastest idle link (KV bytes / bandwidth)."""
    handoff_latency_s: float = 0.0
    alone_caches: Sequence[dict[tuple[int, int, int], float]] = ()
    """Mixed pools: per prefill model, a call's seconds on that model alone, keyed
    (prompt, hit, output tokens); a caller that builds equal step models again (the same
    model, GPU, TP and engine) passes the same dicts, so its simulations share them. Empty:
    fresh ones."""
    _cache: dict[tuple[int, int, int], float] = field(default_factory=dict, repr=False)
    _decode_candidates: Sequence[StepTimeModel] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._decode_candidates = _never_slower(self.decode_models)
        if not self.alone_caches:
            self.alone_caches = [{} for _ in self.prefill_models]
        elif len(self.alone_caches) != len(self.prefill_models):
            raise ValueError(f"alone_caches must hold one dict per prefill model "
                             f"({len(self.prefill_models)}), got {len(self.alone_caches)}")

    def call_s(self, num_prompt_tokens: int, num_hit_tokens: int, num_output_tokens: int
               ) -> float:
        key = (num_prompt_tokens, num_hit_tokens, num_output_tokens)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if self.decode_models and num_output_tokens > 1:  # (one token: done at prefill)
            t = (min(_prefill_s(m, num_prompt_tokens, num_hit_tokens, self.max_batched_tokens)
                     for m in self.prefill_models)
                 + self.handoff_latency_s + self.handoff_s_per_token * num_prompt_tokens
                 + min(decode_time_s(m, num_prompt_tokens, num_output_tokens)
                       for m in self._decode_candidates))
        else:
            t = min(self._alone_s(m, alone, key)
                    for m, alone in zip(self.prefill_models, self.alone_caches, strict=True))
        self._cache[key] = t
        return t

    def _alone_s(self, model: StepTimeModel, alone: dict[tuple[int, int, int], float],
                 key: tuple[int, int, int]) -> float:
        t = alone.get(key)
        if t is None:
            num_prompt_tokens, num_hit_tokens, num_output_tokens = key
            t = alone[key] = (
                _prefill_s(model, num_prompt_tokens, num_hit_tokens, self.max_batched_tokens)
                + decode_time_s(model, num_prompt_tokens, num_output_tokens))
        return t

    def calls_s(self, program: Program, block_tokens: int) -> list[float]:
        """Standalone seconds of each call of ``program``."""
        hits = shared_prefix_tokens(program, block_tokens)
        return [self.call_s(c.num_prompt_tokens, h, c.num_output_tokens)
                for c, h in zip(program.calls, hits, strict=True)]


def _never_slower(models: Sequence[StepTimeModel]) -> Sequence[StepTimeModel]:
    """``models`` cut to one whose decode steps at batch size 1 are never slower than any
    other's, where there is one: the least of their decode times is then its own, and the
    others need not be summed (the same float: ties are equal). A decode step is
    ``(base + per_kv * kv) + extra`` (``decode_terms_s``) and float rounding is monotone, so
    terms no greater give steps no longer at every KV size, and their sums, added in the same
    order, no greater. Without ``decode_terms_s`` on every model: all of them."""
    terms = []
    for m in models:
        decode_terms_s = getattr(m, "decode_terms_s", None)
        if decode_terms_s is None:
            return models
        terms.append(decode_terms_s(1))
    for i, (base, per_kv, extra) in enumerate(terms):
        if all(base <= b and per_kv <= p and extra <= e for b, p, e in terms):
            return (models[i],)
    return models


def _prefill_s(model: StepTimeModel, num_prompt_tokens: int, num_hit_tokens: int,
               max_batched_tokens: int) -> float:
    total, done = 0.0, num_hit_tokens
    while done < num_prompt_tokens:
        chunk = min(max_batched_tokens, num_prompt_tokens - done)
        total += model.step_time_s([(chunk, done)], 0, 0)
        done += chunk
    return total


def critical_path_s(program: Program, call_s: Sequence[float]) -> float:
    """Longest path from the program's arrival to its last call's end: calls take
    ``call_s``, and a parent's tool time lies on every edge out of it."""
    end = [0.0] * program.num_calls
    for i, call in enumerate(program.calls):
        start = max((end[p] + program.calls[p].tool_s for p in call.parents), default=0.0)
        end[i] = start + call_s[i]
    return max(end)
