"""Expert-parallel load balancing for MoE layers: DeepSeek's EPLB in numpy, an UltraEP-style
quota planner, a ReLibra-style two-timescale planner, load generators and importers, and the
expert-parallel step model. Importing the package registers the built-in balancers."""

from __future__ import annotations

from fleetsim.moe import quota as _quota  # noqa: F401  (registers "quota")
from fleetsim.moe import two_timescale as _two_timescale  # noqa: F401  (registers it)
from fleetsim.moe.balancers import BALANCERS, ExpertBalancer, make_balancer, register_balancer
from fleetsim.moe.compare import CompareRow, CompareSetup, run_compare
from fleetsim.moe.compute import (
    EpHardware,
    MoeLayerSpec,
    RooflineExpertCompute,
    TableExpertCompute,
    load_moe_table,
)
from fleetsim.moe.eplb import rebalance_experts
from fleetsim.moe.importers import load_sglang_dump, load_vllm_window
from fleetsim.moe.load_presets import LOAD_PRESETS, LoadPreset, calibrate_log_sd, preset_spec
from fleetsim.moe.loads import LoadSpec, make_loads
from fleetsim.moe.placement import BalanceView, Placement, imbalance, moved_experts
from fleetsim.moe.quota import QuotaPlanner, plan_quotas
from fleetsim.moe.step_model import (
    ExpertParallelConfig,
    ExpertParallelStepModel,
    LayerTimes,
    ideal_times,
    layer_times,
    moe_layer_time_s,
)
from fleetsim.moe.two_timescale import TwoTimescalePlanner

__all__ = [
    "BALANCERS",
    "LOAD_PRESETS",
    "BalanceView",
    "CompareRow",
    "CompareSetup",
    "EpHardware",
    "ExpertBalancer",
    "ExpertParallelConfig",
    "ExpertParallelStepModel",
    "LayerTimes",
    "LoadPreset",
    "LoadSpec",
    "MoeLayerSpec",
    "Placement",
    "QuotaPlanner",
    "RooflineExpertCompute",
    "TableExpertCompute",
    "TwoTimescalePlanner",
    "calibrate_log_sd",
    "ideal_times",
    "imbalance",
    "layer_times",
    "load_moe_table",
    "load_sglang_dump",
    "load_vllm_window",
    "make_balancer",
    "make_loads",
    "moe_layer_time_s",
    "moved_experts",
    "plan_quotas",
    "preset_spec",
    "rebalance_experts",
    "register_balancer",
    "run_compare",
]
