"""Every pluggable decision. Importing this package registers the built-in policies."""

from fleetsim.policies import agent_xpu as _agent_xpu  # noqa: F401  (registers agent_xpu)
from fleetsim.policies import cache_aware, mooncake, tokenlake  # noqa: F401  (register routers)
from fleetsim.policies import esp as _esp  # noqa: F401  (registers the esp group planner)
from fleetsim.policies import evolve as _evolve  # noqa: F401  (registers the evolve planner)
from fleetsim.policies import serve_best as _serve_best  # noqa: F401  (registers serve_best)
from fleetsim.policies.batching import (
    BATCH_POLICIES,
    PrefillFirstPlanner,
    TokenBudgetPlanner,
    make_batch_policy,
    register_batch,
)
from fleetsim.policies.eviction import EVICTION_POLICIES, make_eviction
from fleetsim.policies.fastserve import FastServePlanner
from fleetsim.policies.group_planners import GROUP_PLANNERS, make_group_planner
from fleetsim.policies.ordering import ORDERING_POLICIES, make_ordering, register_ordering
from fleetsim.policies.programs import (
    AutellixATLAS,
    AutellixLocality,
    AutellixPLAS,
    HexAGenTPlacement,
    HexAGenTPriority,
    WorkflowFCFS,
    WorkflowLLF,
)
from fleetsim.policies.trajectories import (  # noqa: F401  (register the policies)
    ProgressivePriority,
    TrajectoryPlan,
)
from fleetsim.policies.watermark import WatermarkPlanner
from fleetsim.registry import PolicySpec
from fleetsim.serving.capabilities import Capabilities, capabilities_of
from fleetsim.serving.contract import BatchPolicy, OrderKey, StepPlan
from fleetsim.serving.views import KVView, ReplicaView

__all__ = [
    "AutellixATLAS",
    "AutellixLocality",
    "AutellixPLAS",
    "HexAGenTPlacement",
    "HexAGenTPriority",
    "WorkflowFCFS",
    "WorkflowLLF",
    "BATCH_POLICIES",
    "EVICTION_POLICIES",
    "FastServePlanner",
    "ORDERING_POLICIES",
    "BatchPolicy",
    "Capabilities",
    "KVView",
    "PrefillFirstPlanner",
    "OrderKey",
    "PolicySpec",
    "ReplicaView",
    "StepPlan",
    "TokenBudgetPlanner",
    "WatermarkPlanner",
    "capabilities_of",
    "make_batch_policy",
    "make_eviction",
    "make_ordering",
    "GROUP_PLANNERS",
    "make_group_planner",
    "register_batch",
    "register_ordering",
]
