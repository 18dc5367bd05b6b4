"""Build step models and explain one step: seconds by op class, per layer, with sources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf.step_model import (
    ASYNC_STEP_GAP_S,
    OP_CLASSES,
    STEP_OVERHEAD_PER_SEQ_S,
    STEP_OVERHEAD_S,
    TableStepModel,
)

BACKENDS = ("auto", "roofline")
_PER_LAYER_CLASSES = ("gemm", "attention", "moe", "communication")


def check_tp(model: ModelSpec, gpu: GPUSpec, tp: int) -> None:
    """Raise ``FleetsimInputError`` unless ``tp`` is a valid tensor-parallel degree."""
    if not isinstance(tp, int) or tp < 1 or tp & (tp - 1):
        raise FleetsimInputError("tp", tp, "must be a power of two (1, 2, 4, 8)")
    if tp > gpu.num_gpus_per_node:
        raise FleetsimInputError(
            "tp",
            tp,
            f"{gpu.name} nodes have {gpu.num_gpus_per_node} GPUs; "
            "use tp <= that (tensor parallelism stays inside a node)",
        )
    if model.num_attention_heads % tp:
        raise FleetsimInputError(
            "tp", tp, f"must divide {model.name}'s {model.num_attention_heads} attention heads"
        )


# Why a mode is refused, per missing tensor-core format (the fix names what vLLM would do).
_MISSING_FORMAT_FIX = {
    "fp8": "has no FP8 tensor cores (FP8 needs Ada, Hopper or Blackwell; its datasheet gives "
           "no FP8 rate); vLLM would run an FP8 checkpoint weight-only there (FP8 Marlin, "
           "W8A16), which fleetsim prices as quantization = \"int8_wo\"",
    "fp4": "has no FP4 tensor cores (FP4 is Blackwell-only: B200, GB200); use fp8 or int4_wo",
    "int8": "has no INT8 rate in the GPU catalog (peak_int8_ops); add it or use fp8",
}


def check_quantization(model: ModelSpec, gpu: GPUSpec) -> None:
    """Raise ``FleetsimInputError`` unless ``gpu`` has the tensor cores ``model``'s
    quantization computes in (weight-only modes compute in BF16 and run anywhere)."""
    q = model.quantization
    if q is None:
        return
    for fmt in q.compute_formats:
        if fmt not in gpu.compute_formats:
            raise FleetsimInputError("quantization", q.name,
                                     f"{gpu.name} {_MISSING_FORMAT_FIX[fmt]}")


def build_step_model(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    backend: str = "auto",
    *,
    step_overhead_s: float = STEP_OVERHEAD_S,
    step_overhead_per_seq_s: float = STEP_OVERHEAD_PER_SEQ_S,
    kernel_time_scale: float = 1.0,
    async_scheduling: bool = False,
    async_step_gap_s: float = ASYNC_STEP_GAP_S,
) -> TableStepModel:
    """Step-time model of one replica (``tp`` GPUs) serving ``model`` on ``gpu``.

    backend "auto": measured aiconfigurator-core vLLM tables where they cover the GPU and
    shape, roofline elsewhere (per op); "roofline": roofline everywhere. The result's
    ``sources`` says which was used per op class. Grids are cached per (model, gpu, tp, backend).
    ``step_overhead_s`` is the fixed per-step CPU cost added to every step (default 1.5 ms);
    ``step_overhead_per_seq_s`` is added once per sequence in the step (default 0; vLLM V0's
    measured value is ``fleetsim.perf.cpu_overhead.vllm_v0_overhead``);
    ``kernel_time_scale`` multiplies every kernel (GPU) term. ``async_scheduling`` overlaps
    that CPU cost with the GPU's work (vLLM >= 0.14's default), leaving ``async_step_gap_s``
    between steps unless the CPU is the slower of the two.
    """
    if backend not in BACKENDS:
        raise FleetsimInputError("backend", backend, f"use one of {', '.join(BACKENDS)}")
    check_tp(model, gpu, tp)
    check_quantization(model, gpu)
    if not 0.0 <= step_overhead_s < 1.0:
        raise FleetsimInputError(
            "step_overhead_s", step_overhead_s, "must be in [0, 1) seconds, e.g. 0.0015"
        )
    if not 0.0 <= step_overhead_per_seq_s < 0.01:
        raise FleetsimInputError(
            "step_overhead_per_seq_s", step_overhead_per_seq_s,
            "must be in [0, 0.01) seconds per sequence, e.g. 0.0001",
        )
    if not 0.05 <= kernel_time_scale <= 20:
        raise FleetsimInputError(
            "kernel_time_scale", kernel_time_scale, "must be in [0.05, 20], e.g. 1.1"
        )
    if not 0.0 <= async_step_gap_s < 0.1:
        raise FleetsimInputError(
            "async_step_gap_s", async_step_gap_s, "must be in [0, 0.1) seconds, e.g. 0.00016"
        )
    return TableStepModel(
        model, gpu, tp, backend == "auto", step_overhead_s, step_overhead_per_seq_s,
        kernel_time_scale, async_scheduling, async_step_gap_s,
    )


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Predicted time of one step by op class (seconds), and where each number comes from."""

    model: str
    gpu: str
    tp: int
    prefill_tokens: int
    context_tokens: int  # per decode request; a prefill-only step: the chunk's cached tokens
    decode_batch: int
    prefill_context_tokens: int  # tokens cached before the prefill chunk
    total_s: float
    by_class_s: dict[str, float]  # op class -> seconds for the whole step
    per_layer_s: dict[str, float]  # op class -> seconds in one (average) layer
    sources: dict[str, str]  # op class -> "measured: ..." or "roofline"
    quantization: str | None = None  # the model's quantization mode, None: its own dtype
    kv_cache_dtype: str = "auto"  # "fp8" for a one-byte cache


def predict_breakdown(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int = 1,
    *,
    prefill_tokens: int | None = None,
    context_tokens: int = 0,
    decode_batch: int | None = None,
    prefill_context_tokens: int | None = None,
    backend: str = "auto",
    async_scheduling: bool = False,
) -> StepBreakdown:
    """One step: a prefill chunk of ``prefill_tokens`` new tokens, a decode batch of
    ``decode_batch`` requests with ``context_tokens`` of KV each, or both at once (a mixed
    step, as chunked prefill schedules them).

    The chunk's cached tokens are ``prefill_context_tokens``; for a prefill-only step they
    default to ``context_tokens`` (so ``prefill_tokens=N, context_tokens=C`` is a chunk over C),
    for a mixed step to 0. ``async_scheduling`` prices the step as vLLM >= 0.14 runs it (the
    CPU cost overlapped with the GPU's work)."""
    if prefill_tokens is None and decode_batch is None:
        raise FleetsimInputError(
            "step",
            {"prefill_tokens": prefill_tokens, "decode_batch": decode_batch},
            "give prefill_tokens, decode_batch, or both (a mixed step)",
        )
    for name, value in (("prefill_tokens", prefill_tokens), ("decode_batch", decode_batch)):
        if value is not None and value < 1:
            raise FleetsimInputError(name, value, "must be >= 1")
    if context_tokens < 0:
        raise FleetsimInputError("context_tokens", context_tokens, "must be >= 0")
    if prefill_context_tokens is None:
        prefill_context_tokens = context_tokens if decode_batch is None else 0
    if prefill_context_tokens < 0:
        raise FleetsimInputError("prefill_context_tokens", prefill_context_tokens, "must be >= 0")
    sm = build_step_model(model, gpu, tp, backend, async_scheduling=async_scheduling)
    chunks = [(prefill_tokens, prefill_context_tokens)] if prefill_tokens is not None else []
    n = int(decode_batch or 0)
    kv = n * context_tokens
    by_class = sm.breakdown_s(chunks, n, kv)
    layers = {"moe": max(model.num_moe_layers, 1)}
    per_layer = {k: by_class[k] / layers.get(k, model.num_layers) for k in _PER_LAYER_CLASSES}
    return StepBreakdown(
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        prefill_tokens=prefill_tokens or 0,
        context_tokens=context_tokens,
        decode_batch=n,
        prefill_context_tokens=prefill_context_tokens if prefill_tokens is not None else 0,
        total_s=sm.step_time_s(chunks, n, kv),
        by_class_s=by_class,
        per_layer_s=per_layer,
        sources=dict(sm.sources),
        quantization=model.quantization.name if model.quantization else None,
        kv_cache_dtype="fp8" if model.kv_dtype_bytes == 1 else "auto",
    )


def breakdown_to_dict(b: StepBreakdown) -> dict[str, Any]:
    """JSON-ready dict (seconds as floats)."""
    return {
        "model": b.model,
        "gpu": b.gpu,
        "tp": b.tp,
        "prefill_tokens": b.prefill_tokens,
        "context_tokens": b.context_tokens,
        "decode_batch": b.decode_batch,
        "prefill_context_tokens": b.prefill_context_tokens,
        "total_s": b.total_s,
        # only when set, so default output reads as it always has
        **({"quantization": b.quantization} if b.quantization else {}),
        **({"kv_cache_dtype": b.kv_cache_dtype} if b.kv_cache_dtype != "auto" else {}),
        "ops": {
            k: {
                "total_s": b.by_class_s[k],
                "per_layer_s": b.per_layer_s.get(k),
                "source": b.sources.get(k, ""),
            }
            for k in OP_CLASSES
        },
    }


def breakdown_table(b: StepBreakdown):  # -> rich.table.Table (rich imported lazily)
    """A rich table: op class, per-layer ms, total ms, share, source."""
    from rich.table import Table

    parts = []
    if b.prefill_tokens:
        parts.append(f"prefill {b.prefill_tokens} tokens over {b.prefill_context_tokens} cached")
    if b.decode_batch:
        parts.append(f"decode batch {b.decode_batch} at context {b.context_tokens}")
    what = " + ".join(parts)
    dtypes = ", ".join(x for x in (b.quantization,
                                   "kv fp8" if b.kv_cache_dtype == "fp8" else None) if x)
    model = f"{b.model} ({dtypes})" if dtypes else b.model
    table = Table(title=f"{model} on {b.gpu} x{b.tp}: {what} = {b.total_s * 1e3:.3f} ms")
    for col, justify in (
        ("op", "left"),
        ("per layer ms", "right"),
        ("total ms", "right"),
        ("share", "right"),
        ("source", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for k in OP_CLASSES:
        per_layer = b.per_layer_s.get(k)
        table.add_row(
            k,
            "" if per_layer is None else f"{per_layer * 1e3:.4f}",
            f"{b.by_class_s[k] * 1e3:.3f}",
            f"{b.by_class_s[k] / b.total_s:.1%}",
            b.sources.get(k, ""),
        )
    return table
