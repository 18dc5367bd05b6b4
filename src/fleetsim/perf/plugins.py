"""Step-time models by name: the built-in ``table`` model or a user class ``"pkg.mod:Name"``.

A user class is built as ``Name(model=ModelSpec, gpu=GPUSpec, tp=int, **args)`` and must follow
``fleetsim.perf.base.StepTimeModel`` (``step_time_s`` and ``decode_step_times_s``), the way a
vLLM deployment swaps its ``scheduler_cls``. Its ``sources`` attribute, if any, is reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf.base import StepTimeModel
from fleetsim.perf.breakdown import build_step_model, check_quantization
from fleetsim.perf.pipeline import build_pipeline_step_model
from fleetsim.perf.step_model import (
    ASYNC_STEP_GAP_S,
    STEP_OVERHEAD_PER_SEQ_S,
    STEP_OVERHEAD_S,
)
from fleetsim.registry import lookup, make_registry

STEP_MODELS, register_step_model = make_registry("step model")
register_step_model("table")(build_step_model)

_REQUIRED = ("step_time_s", "decode_step_times_s")


def make_step_model(
    name: str,
    args: Mapping[str, Any],
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    *,
    backend: str = "auto",
    step_overhead_s: float | None = None,
    step_overhead_per_seq_s: float | None = None,
    kernel_time_scale: float | None = None,
    async_scheduling: bool | None = None,
    async_step_gap_s: float | None = None,
    where: str = "engine.step_model",
    pp: int = 1,
) -> StepTimeModel:
    """The step model ``name`` for one replica (``tp`` x ``pp`` GPUs); the overheads and the
    kernel scale go to the built-in model only."""
    factory = lookup(STEP_MODELS, name, f"{where}.name")
    check_quantization(model, gpu)
    if pp > 1 and factory is not build_step_model:
        raise FleetsimInputError("pp", pp, f"pipeline stages are priced by the table step "
                                 f"model; {name!r} prices a whole replica, so use pp = 1 "
                                 "with it")
    if factory is build_step_model:
        if args:
            raise FleetsimInputError(f"{where}.args", dict(args), "the table model takes none; "
                                     "set engine.step_overhead_s / step_overhead_per_seq_s")
        overheads = {k: v for k, v in (("step_overhead_s", step_overhead_s),
                                       ("step_overhead_per_seq_s", step_overhead_per_seq_s),
                                       ("kernel_time_scale", kernel_time_scale),
                                       ("async_scheduling", async_scheduling),
                                       ("async_step_gap_s", async_step_gap_s))
                     if v is not None}
        if pp > 1:
            return build_pipeline_step_model(model, gpu, tp, pp, backend, **{
                "step_overhead_s": STEP_OVERHEAD_S, "step_overhead_per_seq_s":
                STEP_OVERHEAD_PER_SEQ_S, "kernel_time_scale": 1.0, "async_scheduling": False,
                "async_step_gap_s": ASYNC_STEP_GAP_S, **overheads})
        return build_step_model(model, gpu, tp, backend, **overheads)
    try:
        step_model = factory(model=model, gpu=gpu, tp=tp, **dict(args))
    except FleetsimInputError:
        raise
    except Exception as err:  # noqa: BLE001 - a plug-in's constructor failing is bad input
        raise FleetsimInputError(where, name, f"building it raised {type(err).__name__}: "
                                 f"{err}; fix the class or engine.step_model.args") from None
    missing = [m for m in _REQUIRED if not callable(getattr(step_model, m, None))]
    if missing:
        raise FleetsimInputError(where, name, f"it has no {', '.join(missing)}; a step model "
                                 "follows fleetsim.perf.base.StepTimeModel")
    return step_model
