"""Expert-parallel load balancing for MoE layers: EPLB, quota and two-timescale planners,
load generators and importers, and the expert-parallel step model."""

from __future__ import annotations

from fleetsim.moe.eplb import rebalance_experts

__all__ = ["rebalance_experts"]
