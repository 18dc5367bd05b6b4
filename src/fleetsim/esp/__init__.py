"""Elastic sequence parallelism (LoongServe, SOSP'24): its cost model, its prefill-batching DP,
its elastic rules and a gang engine that runs them (docs/reproductions.md, ``loongserve``)."""

from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import AnalyticalModel, DecodeShard, EspCostModel, fit_analytical
from fleetsim.esp.dp import PrefillBatch, PrefillPlan, plan_objective, plan_prefill
from fleetsim.esp.engine import EspEngine, EspStats
from fleetsim.esp.state import DecodeBatch, EspRequest, Gang

__all__ = [
    "AnalyticalModel",
    "DecodeBatch",
    "DecodeShard",
    "EspConfig",
    "EspCostModel",
    "EspEngine",
    "EspRequest",
    "EspStats",
    "Gang",
    "PrefillBatch",
    "PrefillPlan",
    "fit_analytical",
    "plan_objective",
    "plan_prefill",
]
