"""Explain one step of a ``tp`` x ``pp`` replica: each stage's time, each send between stages,
and the step time the engine uses (``fleetsim perf --pp N``).

The numbers are ``PipelineStepModel``'s own parts (``perf/pipeline.py``): the step's work is
split into ``m = min(num_seqs, pp)`` equal micro-batches; each stage's time is one
micro-batch's kernels on it, each send one micro-batch's activations over that boundary's link.
The step time is the pipeline's period: the larger of one micro-batch's trip (CPU cost + every
stage + every send) and ``m`` x the busiest server (the slowest stage, or the CPU). The parts
are computed with the same float operations as ``step_time_s``, so the step time printed is
the one a run uses, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf.pipeline import (
    build_pipeline_step_model,
    crosses_node,
    cyclic_period_s,
    p2p_s,
    stage_layer_ranges,
)
from fleetsim.perf.step_model import ASYNC_STEP_GAP_S, STEP_OVERHEAD_PER_SEQ_S, STEP_OVERHEAD_S


@dataclass(frozen=True, slots=True)
class StageTime:
    """One stage's share of a micro-batch."""

    first_layer: int
    end_layer: int  # exclusive
    kernel_s: float
    """Its kernels for one micro-batch (the LM head and sampler on the last stage)."""
    send_s: float | None
    """Sending one micro-batch's activations to the next stage (None on the last)."""
    link: str | None
    """``nvlink`` or ``network`` (the boundary crosses a node edge); None on the last."""


@dataclass(frozen=True, slots=True)
class PipelineBreakdown:
    """One step of a pipeline replica (seconds), as the engine prices it."""

    model: str
    gpu: str
    tp: int
    pp: int
    prefill_tokens: int
    context_tokens: int
    decode_batch: int
    prefill_context_tokens: int
    num_micro_batches: int
    stages: tuple[StageTime, ...]
    cpu_s: float
    """CPU cost of scheduling one micro-batch."""
    trip_cpu_s: float
    """The CPU time on a micro-batch's trip (async scheduling leaves only the step gap)."""
    trip_s: float
    """One micro-batch through CPU, every stage and every send (its latency)."""
    step_time_s: float
    """Seconds between two steps of a request: the pipeline's period."""
    bound: str
    """What sets the period: ``trip``, ``slowest stage`` or ``cpu``."""
    async_scheduling: bool = False
    quantization: str | None = None
    kv_cache_dtype: str = "auto"


def predict_pipeline_breakdown(
    model: ModelSpec, gpu: GPUSpec, tp: int, pp: int, *, prefill_tokens: int | None = None,
    context_tokens: int = 0, decode_batch: int | None = None,
    prefill_context_tokens: int | None = None, backend: str = "auto",
    async_scheduling: bool = False,
) -> PipelineBreakdown:
    """One step (a prefill chunk, a decode batch, or both, as ``predict_breakdown`` takes
    them) on ``tp`` x ``pp`` GPUs, with the engine's default CPU costs."""
    if prefill_tokens is None and decode_batch is None:
        raise FleetsimInputError("step", None, "give prefill_tokens, decode_batch, or both")
    if prefill_context_tokens is None:
        prefill_context_tokens = context_tokens if decode_batch is None else 0
    sm = build_pipeline_step_model(
        model, gpu, tp, pp, backend, step_overhead_s=STEP_OVERHEAD_S,
        step_overhead_per_seq_s=STEP_OVERHEAD_PER_SEQ_S, kernel_time_scale=1.0,
        async_scheduling=async_scheduling, async_step_gap_s=ASYNC_STEP_GAP_S)
    chunks = [(prefill_tokens, prefill_context_tokens)] if prefill_tokens is not None else []
    n = int(decode_batch or 0)
    # PipelineStepModel.step_time_s, its parts kept
    num_tokens = n + sum(c for c, _ in chunks)
    num_seqs = n + len(chunks)
    m = min(num_seqs, pp) or 1
    att = [s._prefill_attention_s(chunks) / m for s in sm.stages] if chunks else None
    cpu, sends, fixed, per_kv = sm._parts_s(num_tokens / m, num_seqs / m, n / m, att)
    kv = n * context_tokens / m
    stage_s = [f + c * kv for f, c in zip(fixed, per_kv, strict=True)]
    trip_cpu = sm.async_step_gap_s if sm.async_scheduling else cpu
    period = cyclic_period_s(stage_s, cpu, sends, m, trip_cpu)
    msg = sm.send_bytes_per_token * (num_tokens / m)
    ranges = stage_layer_ranges(model.num_layers, pp)
    stages = []
    for i, ((a, b), t) in enumerate(zip(ranges, stage_s, strict=True)):
        last = i == pp - 1
        stages.append(StageTime(
            a, b, t, None if last else p2p_s(msg, sm.send_bw[i]),
            None if last else ("network" if crosses_node(gpu, tp, i) else "nvlink")))
    trip = trip_cpu + sends
    for t in stage_s:  # cyclic_period_s's order, so trip and period compare exactly
        trip += t
    busiest = m * max(stage_s)
    bound = ("cpu" if m * cpu > max(trip, busiest) else
             "slowest stage" if busiest > trip else "trip")
    return PipelineBreakdown(
        model=model.name, gpu=gpu.name, tp=tp, pp=pp, prefill_tokens=prefill_tokens or 0,
        context_tokens=context_tokens, decode_batch=n,
        prefill_context_tokens=prefill_context_tokens if prefill_tokens is not None else 0,
        num_micro_batches=m, stages=tuple(stages), cpu_s=cpu, trip_cpu_s=trip_cpu,
        trip_s=trip, step_time_s=period, bound=bound, async_scheduling=async_scheduling,
        quantization=model.quantization.name if model.quantization else None,
        kv_cache_dtype="fp8" if model.kv_dtype_bytes == 1 else "auto")


def pipeline_breakdown_to_dict(b: PipelineBreakdown) -> dict[str, Any]:
    """JSON-ready dict (seconds as floats)."""
    return {
        "model": b.model, "gpu": b.gpu, "tp": b.tp, "pp": b.pp,
        "prefill_tokens": b.prefill_tokens, "context_tokens": b.context_tokens,
        "decode_batch": b.decode_batch, "prefill_context_tokens": b.prefill_context_tokens,
        **({"quantization": b.quantization} if b.quantization else {}),
        **({"kv_cache_dtype": b.kv_cache_dtype} if b.kv_cache_dtype != "auto" else {}),
        "num_micro_batches": b.num_micro_batches,
        "stages": [{"layers": [s.first_layer, s.end_layer], "stage_s": s.kernel_s,
                    "send_s": s.send_s, "link": s.link} for s in b.stages],
        "cpu_s": b.cpu_s, "trip_s": b.trip_s, "step_time_s": b.step_time_s, "bound": b.bound,
    }


def pipeline_breakdown_table(b: PipelineBreakdown):  # -> rich.table.Table
    """A rich table: a row per stage (layers, stage ms, send ms and link), then the CPU cost,
    the trip and the step time with what bounds it."""
    from rich.table import Table

    parts = []
    if b.prefill_tokens:
        parts.append(f"prefill {b.prefill_tokens} tokens over {b.prefill_context_tokens} cached")
    if b.decode_batch:
        parts.append(f"decode batch {b.decode_batch} at context {b.context_tokens}")
    dtypes = ", ".join(x for x in (b.quantization,
                                   "kv fp8" if b.kv_cache_dtype == "fp8" else None) if x)
    model = f"{b.model} ({dtypes})" if dtypes else b.model
    table = Table(title=f"{model} on {b.gpu} tp{b.tp} x pp{b.pp}: {' + '.join(parts)}, "
                  f"{b.num_micro_batches} micro-batch(es) = {b.step_time_s * 1e3:.3f} ms a step")
    for col, justify in (("stage", "left"), ("layers", "left"), ("stage ms", "right"),
                         ("send ms", "right"), ("link", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for i, s in enumerate(b.stages):
        table.add_row(str(i), f"{s.first_layer}-{s.end_layer - 1}", f"{s.kernel_s * 1e3:.3f}",
                      "" if s.send_s is None else f"{s.send_s * 1e3:.4f}", s.link or "")
    cpu = f"{b.cpu_s * 1e3:.3f}" + (f" ({b.trip_cpu_s * 1e3:.3f} on the trip, async)"
                                    if b.async_scheduling else "")
    table.add_row("CPU", "", cpu, "", "per micro-batch")
    table.add_row("trip", "", f"{b.trip_s * 1e3:.3f}", "", "one micro-batch, end to end")
    table.add_row("step", "", f"{b.step_time_s * 1e3:.3f}", "",
                  f"period, bound by the {b.bound}"
                  + (f" (x{b.num_micro_batches})" if b.bound != "trip" else ""))
    return table
