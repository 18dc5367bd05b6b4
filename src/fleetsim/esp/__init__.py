"""Elastic sequence parallelism (LoongServe, SOSP'24): its cost model and the step model of a
member of k instances, its prefill-batching DP, its admission and elastic rules. The scheduler
that uses them is a group planner of the one engine (``policies/esp.py`` on
``serving/groups.py``; docs/reproductions.md, ``loongserve``)."""

from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import (
    AnalyticalModel,
    DecodeShard,
    EspCostModel,
    EspStepModel,
    fit_analytical,
)
from fleetsim.esp.dp import PrefillBatch, PrefillPlan, plan_objective, plan_prefill

__all__ = [
    "AnalyticalModel",
    "DecodeShard",
    "EspConfig",
    "EspCostModel",
    "EspStepModel",
    "PrefillBatch",
    "PrefillPlan",
    "fit_analytical",
    "plan_objective",
    "plan_prefill",
]
