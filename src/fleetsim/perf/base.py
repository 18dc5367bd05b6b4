"""The interface between the replica engine and any performance model.

A step (one forward pass of a continuous batch) is described by its prefill chunks and its
decode requests. The engine calls ``step_time_s`` once per step, and ``decode_step_times_s``
to fast-forward many decode-only steps with one vectorized call.

Contract (tested): ``decode_step_times_s(n, kv)[i] == step_time_s((), n, int(kv[i]))`` bit for
bit, so fast-forward and step-by-step simulation give identical times.

Optionally a model also gives ``decode_terms_s(n) -> (base, per_kv, extra)`` with
``step_time_s((), n, kv) == (base + per_kv * kv) + extra`` bit for bit (Python floats): then
the engine adds up short windows in plain Python, which beats numpy's per-call cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray


class StepTimeModel(Protocol):
    """Predicts the wall time of one engine step on one replica (all TP ranks together)."""

    def step_time_s(
        self,
        prefill_chunks: Sequence[tuple[int, int]],
        num_decode: int,
        decode_kv_tokens: int,
    ) -> float:
        """Seconds for one step.

        prefill_chunks: per prefilling request, ``(num_new_tokens, num_context_tokens)``, where
            context is the tokens already in its KV cache before this chunk (prefix hits and
            earlier chunks); attention cost is computed per chunk.
        num_decode: requests that compute exactly one new token this step.
        decode_kv_tokens: sum over those decode requests of their KV length before the step
            (tokens already cached); decode attention is affine in each request's own length,
            so the sum carries each request's cost exactly.
        """
        ...

    def decode_step_times_s(
        self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """``step_time_s((), num_decode, kv)`` for each ``kv`` in the array, vectorized."""
        ...


class ConstantStepModel:
    """Every step takes ``step_time_s`` seconds, whatever the batch (tests, queueing goldens)."""

    def __init__(self, step_time_s: float) -> None:
        if not step_time_s > 0:
            raise ValueError(f"step_time_s must be > 0, got {step_time_s}")
        self._step_time_s = float(step_time_s)

    def step_time_s(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int, decode_kv_tokens: int
    ) -> float:
        return self._step_time_s

    def decode_step_times_s(
        self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        return np.full(len(decode_kv_tokens), self._step_time_s)

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        return self._step_time_s, 0.0, 0.0


class LinearStepModel:
    """``t = base + per_token * tokens + per_kv * kv_tokens``: a simple analytic model for tests.

    ``tokens`` counts all tokens computed in the step; ``kv_tokens`` counts attention reads
    (context of prefill chunks plus decode KV lengths).
    """

    def __init__(self, base_s: float, per_token_s: float, per_kv_token_s: float = 0.0) -> None:
        self.base_s = float(base_s)
        self.per_token_s = float(per_token_s)
        self.per_kv_token_s = float(per_kv_token_s)

    def step_time_s(
        self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int, decode_kv_tokens: int
    ) -> float:
        tokens = num_decode
        kv = decode_kv_tokens
        for new, ctx in prefill_chunks:
            tokens += new
            kv += ctx
        return self.base_s + self.per_token_s * tokens + self.per_kv_token_s * kv

    def decode_step_times_s(
        self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        kv = decode_kv_tokens.astype(np.float64)
        return self.base_s + self.per_token_s * num_decode + self.per_kv_token_s * kv

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        return self.base_s + self.per_token_s * num_decode, self.per_kv_token_s, 0.0
