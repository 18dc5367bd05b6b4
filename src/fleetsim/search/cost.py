"""What a cluster costs: $/hour from the GPU catalog, $/million tokens at a served rate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetsim.config import SimConfig
from fleetsim.hardware import get_gpu


def cluster_usd_per_hour(config: SimConfig, summary: Mapping[str, Any] | None = None) -> float:
    """Rental price of every GPU of the cluster for one hour.

    Takes ``summary["cost"]["usd_per_hour"]`` when the run reported it; otherwise prices each
    pool as GPU list price x tp x pp x dp_attention x replicas (the catalog's
    ``price_per_hour_usd``).
    """
    cost = (summary or {}).get("cost")
    if isinstance(cost, Mapping) and cost.get("usd_per_hour") is not None:
        return float(cost["usd_per_hour"])
    return sum(
        get_gpu(p.gpu, config.hardware.catalog).price_per_hour_usd * p.tp * p.pp
        * p.dp_attention * p.num_replicas for p in config.pools
    )


def usd_per_million_tokens(usd_per_hour: float, rate_per_s: float | None,
                           tokens_per_request: float) -> float | None:
    """Cost of a million tokens when the cluster serves ``rate_per_s`` requests per second
    around the clock, each of ``tokens_per_request`` tokens (prompt + output, or output only).

    This is the steady-state price at that rate, not the price of one short simulated run
    (whose makespan includes warm-up and drain). None when nothing is served.
    """
    if not rate_per_s or tokens_per_request <= 0:
        return None
    return usd_per_hour / (rate_per_s * tokens_per_request * 3600.0) * 1e6


def num_gpus(config: SimConfig) -> int:
    """GPUs in the cluster (tp x pp x dp_attention x replicas over the pools)."""
    return sum(p.tp * p.pp * p.dp_attention * p.num_replicas for p in config.pools)
