"""Performance model: measured kernel tables (aiconfigurator-core), roofline fallback, memory."""

from __future__ import annotations

from fleetsim.perf.base import ConstantStepModel, LinearStepModel, StepTimeModel
from fleetsim.perf.breakdown import (
    StepBreakdown,
    breakdown_table,
    breakdown_to_dict,
    build_step_model,
    predict_breakdown,
)
from fleetsim.perf.memory import activation_reserve_bytes, kv_capacity_blocks
from fleetsim.perf.step_model import TableStepModel

__all__ = [
    "ConstantStepModel",
    "LinearStepModel",
    "StepBreakdown",
    "StepTimeModel",
    "TableStepModel",
    "activation_reserve_bytes",
    "breakdown_table",
    "breakdown_to_dict",
    "build_step_model",
    "kv_capacity_blocks",
    "predict_breakdown",
]
