"""Step time of a speculating replica: the target verifies k + 1 positions per decoding
sequence, and the drafter proposes the next k (the settings: ``fleetsim.models.speculative``).

Verify. A decode of a speculating sequence feeds ``1 + k`` tokens through the target (the
last emitted token and k drafts): the token-indexed terms (GEMMs, MoE, all-reduce,
elementwise) see ``T = chunks + n (k + 1)`` tokens, the LM head and sampler ``n (k + 1)``
positions (vLLM's rejection sampler takes the target's logits at every verified position),
and decode attention reads each sequence's KV once, as for one query: the ``k + 1`` queries
of a sequence share its KV read, and at k + 1 <= 16 queries a decode attention kernel stays
bound by that read (FlashAttention/FlashInfer decode kernels process the query positions of a
sequence in one tile).

Draft (eagle, eagle3, mtp). vLLM V1's EAGLE proposer (``vllm/v1/spec_decode/eagle.py``, which
also runs DeepSeek's MTP module) runs its head once over all the step's tokens, then ``k - 1``
times over one token per sequence. The head is one decoder layer of the target's shape (EAGLE,
EAGLE-3: one Llama layer, arXiv:2401.15077 and 2503.01840; DeepSeek-V3's MTP module: one
transformer block, arXiv:2412.19437 sec. 2.2) with its own one-layer KV, plus an LM head over
the sampled positions: each pass is priced as one average target layer (the table's per-token
terms and decode attention over the same KV length, divided by the layer count) plus the LM
head and sampler. Left out, each small beside a layer: EAGLE-3's fusion of three hidden states
(a 3h x h GEMM), MTP's 2h x h projection, and EAGLE-3's smaller draft vocabulary (its LM head
is priced at the target's vocabulary, an upper bound).

Draft (ngram). vLLM's n-gram proposer matches the last tokens against the sequence on the
CPU (a numba-compiled KMP search, ``vllm/v1/spec_decode/ngram_proposer.py``); it costs no GPU
time and its CPU time is not modelled (it is per request and small beside the step's fixed
CPU cost).

A step with no decoding sequence (prefill only) is priced as without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.models import ModelSpec
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.perf.base import StepTimeModel
from fleetsim.perf.pipeline import PipelineStepModel


class SpeculativeStepModel:
    """``StepTimeModel`` of a speculating replica around the built-in table model."""

    def __init__(self, inner: StepTimeModel, model: ModelSpec, spec: SpeculativeConfig) -> None:
        if not hasattr(inner, "step_parts_s"):
            raise FleetsimInputError(
                "engine.speculative", spec.method,
                f"speculative decoding is priced with the built-in table step model; "
                f"{type(inner).__name__} cannot price verify and draft passes (use "
                f"engine.step_model = {{name = \"table\"}})")
        self.inner = inner
        self.num_layers = model.num_layers
        self.num_verify = spec.num_speculative_tokens + 1
        self.num_draft_passes = 0 if spec.method == "ngram" else spec.num_speculative_tokens
        self.sources: dict[str, str] = dict(getattr(inner, "sources", {}))
        # expert parallelism underneath (``EpStepModel``): its balancer's slowdown, reported
        self.ep_balance_ratio: float | None = getattr(inner, "balance_ratio", None)
        draft = ("n-gram lookup on the CPU (not priced)" if spec.method == "ngram" else
                 f"{spec.method} head: {self.num_draft_passes} one-layer passes")
        self.sources["speculative"] = (f"verify {self.num_verify} positions per decode; "
                                       f"draft: {draft}")

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        inner = self.inner
        if not num_decode:
            return inner.step_time_s(prefill_chunks, 0, 0)
        chunk_tokens = 0
        for new, _ in prefill_chunks:
            chunk_tokens += new
        verify = num_decode * self.num_verify
        num_tokens = chunk_tokens + verify
        num_seqs = len(prefill_chunks) + num_decode
        kernels = inner.step_parts_s(  # type: ignore[attr-defined]
            prefill_chunks, num_tokens, len(prefill_chunks) + verify, num_decode,
            decode_kv_tokens)
        passes = self.num_draft_passes
        if passes:
            layer = inner.layer_pass_s  # type: ignore[attr-defined]
            first = layer(num_tokens, num_decode, decode_kv_tokens, self.num_layers)
            rest = layer(num_decode, num_decode, decode_kv_tokens, self.num_layers)
            kernels += first + (passes - 1) * rest
        return kernels + inner.cpu_s(num_seqs, kernels)  # type: ignore[attr-defined]

    def decode_step_times_s(self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
                            ) -> NDArray[np.float64]:
        return np.array([self.step_time_s((), num_decode, int(kv)) for kv in decode_kv_tokens])


def speculative_step_model(inner: StepTimeModel, model: ModelSpec, spec: SpeculativeConfig
                           ) -> StepTimeModel:
    """Speculative decoding over ``inner``: a pipeline verifies on every stage and drafts on
    the last (``PipelineStepModel.with_speculation``); a table model, or expert parallelism
    over one (``EpStepModel``), is wrapped in ``SpeculativeStepModel``."""
    if isinstance(inner, PipelineStepModel):
        passes = 0 if spec.method == "ngram" else spec.num_speculative_tokens
        draft = ("n-gram lookup on the CPU (not priced)" if not passes else
                 f"{spec.method} head on the last stage: {passes} one-layer passes")
        return inner.with_speculation(
            spec.num_speculative_tokens, passes,
            f"verify {spec.num_speculative_tokens + 1} positions per decode on every stage; "
            f"draft: {draft}")
    return SpeculativeStepModel(inner, model, spec)
