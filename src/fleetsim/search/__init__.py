"""SLO searches and capacity planning: goodput, ReqX SLO scale, cost-vs-goodput Pareto fronts."""

from __future__ import annotations

from fleetsim.search.cost import cluster_usd_per_hour, usd_per_million_tokens
from fleetsim.search.goodput import GoodputResult, goodput_search, goodput_to_dict
from fleetsim.search.threshold import Probe, ThresholdResult, search_threshold

__all__ = [
    "GoodputResult",
    "Probe",
    "ThresholdResult",
    "cluster_usd_per_hour",
    "goodput_search",
    "goodput_to_dict",
    "search_threshold",
    "usd_per_million_tokens",
]
