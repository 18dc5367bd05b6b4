"""A request's standalone latency: served alone on an idle replica, no queueing, no batching.

HexAGenT's ReqX SLO scale divides each request's latency by this. Prefill runs in chunks of
the step budget (each chunk attends to the ones before it), then every output token after the
first takes one decode step at batch size 1 with the KV growing by one token per step.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from fleetsim.perf.base import StepTimeModel


def prefill_time_s(step_model: StepTimeModel, num_prompt_tokens: int,
                   max_batched_tokens: int) -> float:
    """Seconds to prefill a prompt alone, in chunks of ``max_batched_tokens``."""
    total = 0.0
    done = 0
    while done < num_prompt_tokens:
        chunk = min(max_batched_tokens, num_prompt_tokens - done)
        total += step_model.step_time_s([(chunk, done)], 0, 0)
        done += chunk
    return total


def decode_time_s(step_model: StepTimeModel, num_prompt_tokens: int,
                  num_output_tokens: int) -> float:
    """Seconds for the decode steps after the first token, alone (batch size 1)."""
    if num_output_tokens <= 1:
        return 0.0
    kv = num_prompt_tokens + np.arange(num_output_tokens - 1, dtype=np.int64)
    return float(step_model.decode_step_times_s(1, kv).sum())


def standalone_latency_s(
    step_model: StepTimeModel,
    num_prompt_tokens: NDArray[np.int64],
    num_output_tokens: NDArray[np.int64],
    max_batched_tokens: int,
    *,
    decode_step_model: StepTimeModel | None = None,
    transfer_s: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """End-to-end standalone latency of each request (seconds).

    For prefill/decode disaggregation pass the decode pool's model as ``decode_step_model``
    and each request's KV transfer time as ``transfer_s``.
    """
    decode_model = decode_step_model or step_model
    out = np.empty(len(num_prompt_tokens), dtype=np.float64)
    prefill_cache: dict[int, float] = {}
    for i, (p, o) in enumerate(zip(num_prompt_tokens.tolist(), num_output_tokens.tolist(),
                                   strict=True)):
        pre = prefill_cache.get(p)
        if pre is None:
            pre = prefill_cache[p] = prefill_time_s(step_model, p, max_batched_tokens)
        out[i] = pre + decode_time_s(decode_model, p, o)
    if transfer_s is not None:
        out += transfer_s
    return out
