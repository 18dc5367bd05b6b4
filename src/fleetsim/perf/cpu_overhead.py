"""vLLM V0's per-step CPU cost, fixed plus per sequence, from Vidur's published measurements.

vLLM's V0 engine (2023-2024) ran each step as: schedule, prepare the input tensors, launch the
forward pass, sample, then turn the sampled tokens into Python objects, detokenize and check
stop conditions (``_process_model_outputs``), all on one CPU thread and mostly not overlapped
with the GPU. Each of these walks the batch in Python, so the step's CPU time grows with the
number of sequences. Vidur (Agrawal et al., MLSys'24) profiled exactly these phases of vLLM on
A100 GPUs and published the medians: ``data/profiling/a100/cpu_overheads.csv`` of
github.com/microsoft/vidur (MIT licence), rows ``meta-llama/Llama-2-7b-hf``, batch 8-64, tensor
parallel 1/2/4, in milliseconds. The vLLM RFCs that removed this cost report the same size:
``_process_model_outputs`` alone took 3.4 ms at batch 32 against 0.2 ms at batch 1 (vLLM issue
#6913, Llama-3-70B on 4xH100), and the multi-step RFC (#6854) measured 4 ms GPU bubbles per
decode step on Llama-3-8B / H100.

``vllm_v0_overhead(tp)`` turns the table into ``(fixed_s, per_seq_s)`` for the step model:
the sum of the scheduler, sampler, input-preparation and output-processing medians, less the
LM-head GEMM and sampling kernels that the step model already prices (V0's sampler computed
the logits), fitted by least squares against the batch size. Nothing here is fitted to the
validation data of docs/validation.md.

Not included: Vidur's ``RAY_COMM_TIME`` (3-8 ms per step at tp 2-4), the per-step Ray RPC of
vLLM releases before the shared-memory broadcast of mid-2024; and today's vLLM V1, which
vectorizes and overlaps this work (its default per-sequence cost is 0).
"""

from __future__ import annotations

from functools import cache

import numpy as np

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf.breakdown import build_step_model

# tp -> rows of (batch size, SCHEDULE_MEDIAN, SAMPLER_E2E_MEDIAN, PREPARE_INPUTS_E2E_MEDIAN,
# PROCESS_MODEL_OUTPUTS_MEDIAN), milliseconds per step, copied (4 decimals) from Vidur's
# data/profiling/a100/cpu_overheads.csv, model meta-llama/Llama-2-7b-hf.
VIDUR_A100_LLAMA2_7B_MS: dict[int, tuple[tuple[float, ...], ...]] = {
    1: (
        (8, 0.1651, 0.8878, 0.2932, 0.6244),
        (16, 0.2783, 0.9446, 0.4391, 1.1354),
        (24, 0.3817, 0.9560, 0.5363, 1.6339),
        (32, 0.5798, 1.1264, 0.6710, 2.2457),
        (40, 0.6169, 1.0757, 0.7922, 2.6512),
        (48, 0.7416, 1.1630, 0.9148, 3.2317),
        (56, 0.8395, 1.2473, 1.0398, 3.6074),
        (64, 0.9522, 1.3703, 1.1630, 4.1083),
    ),
    2: (
        (8, 0.1785, 1.1560, 0.3810, 0.6791),
        (16, 0.3107, 1.2105, 0.4863, 1.3485),
        (24, 0.4471, 1.3113, 0.6132, 1.8833),
        (32, 0.5112, 1.2853, 0.7040, 2.2773),
        (40, 0.7254, 1.6603, 0.8428, 3.0012),
        (48, 0.8967, 1.7950, 0.9831, 3.6074),
        (56, 1.0233, 1.6972, 1.0909, 4.0919),
        (64, 1.1468, 1.7736, 1.2324, 4.4952),
    ),
    4: (
        (8, 0.1832, 1.1653, 0.3749, 0.7906),
        (16, 0.3151, 1.2674, 0.4912, 1.3139),
        (24, 0.4435, 1.3324, 0.5916, 1.8130),
        (32, 0.5684, 1.3868, 0.7312, 2.3989),
        (40, 0.7269, 1.6736, 0.8825, 2.9654),
        (48, 0.9277, 2.0198, 1.0274, 3.6147),
        (56, 1.0757, 1.8946, 1.1400, 4.1413),
        (64, 1.2251, 1.9602, 1.2956, 4.6693),
    ),
}
VIDUR_SOURCE = (
    "Vidur data/profiling/a100/cpu_overheads.csv (github.com/microsoft/vidur), "
    "Llama-2-7b-hf medians: schedule + sampler + prepare_inputs + process_model_outputs"
)


@cache
def vllm_v0_overhead(tp: int) -> tuple[float, float]:
    """``(fixed_s, per_seq_s)`` of vLLM V0's per-step CPU cost at tensor parallel ``tp``.

    tp above 4 uses the tp=4 rows (the largest Vidur measured). Deterministic; ~0.3 s the first
    time (it builds the A100 Llama-2-7B step model to subtract its LM head).
    """
    measured_tp = min((t for t in VIDUR_A100_LLAMA2_7B_MS if t >= tp), default=4)
    rows = VIDUR_A100_LLAMA2_7B_MS[measured_tp]
    sm = build_step_model(get_model("Llama-2-7B"), get_gpu("a100"), measured_tp)
    batch = np.array([r[0] for r in rows], dtype=float)
    # The step model's own LM head + sampling for B sequences (the per-sequence grid term).
    modelled = np.array([sm.per_sequence_s(int(b)) for b in batch])
    cpu_s = np.array([sum(r[1:]) for r in rows]) * 1e-3 - modelled
    (fixed_s, per_seq_s), *_ = np.linalg.lstsq(np.c_[np.ones_like(batch), batch], cpu_s,
                                               rcond=None)
    return float(fixed_s), float(per_seq_s)
