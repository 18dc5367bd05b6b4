"""A step model whose attention kernels run slower by given factors (AReaL-TIK's unified,
bitwise-aligned rollout kernels: ``experimental/figures/attention_performance.csv`` of
areal-project/AReaL-TIK gives vendor-kernel latency over unified-kernel latency per GPU).

Everything but attention is the base ``TableStepModel``'s. Decode-only steps are computed from
``decode_terms_s`` in both ``step_time_s`` and ``decode_step_times_s``, so fast-forward stays
bit-identical to stepping (the contract of ``perf/base.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fleetsim.perf.step_model import TableStepModel


class AttentionScaledStepModel:
    """``base`` with decode attention ``decode`` times and prefill attention ``prefill``
    times slower (both >= 1)."""

    def __init__(self, base: TableStepModel, *, decode: float, prefill: float) -> None:
        if decode < 1 or prefill < 1:
            raise ValueError(f"slowdowns must be >= 1, got decode={decode}, prefill={prefill}")
        self.base, self.decode, self.prefill = base, float(decode), float(prefill)
        self.sources = {**getattr(base, "sources", {}),
                        "attention_slowdown": f"decode x{decode:.3f}, prefill x{prefill:.3f}"}

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        b = self.base
        base_s, per_kv, extra = b.decode_terms_s(num_decode)
        a = b._dec_a.at(num_decode)
        return base_s + (self.decode - 1.0) * a, per_kv * self.decode, extra

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        if not prefill_chunks:
            base_s, per_kv, extra = self.decode_terms_s(num_decode)
            return (base_s + per_kv * decode_kv_tokens) + extra
        b = self.base
        t = b.step_time_s(prefill_chunks, num_decode, decode_kv_tokens)
        dec = b._dec_a.at(num_decode) + b._dec_c.at(num_decode) * decode_kv_tokens
        return t + (self.decode - 1.0) * dec + (self.prefill - 1.0) * b._prefill_attention_s(
            prefill_chunks)

    def decode_step_times_s(self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
                            ) -> NDArray[np.float64]:
        base_s, per_kv, extra = self.decode_terms_s(num_decode)
        kv = np.asarray(decode_kv_tokens).astype(np.float64)
        return (base_s + per_kv * kv) + extra
