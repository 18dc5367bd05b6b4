"""Every pluggable decision. Importing this package registers the built-in policies."""

from fleetsim.policies.batch_steps import ReplicaView
from fleetsim.policies.batching import (
    BATCH_POLICIES,
    BatchPolicy,
    PrefillFirstPlanner,
    StepPlan,
    TokenBudgetPlanner,
    make_batch_policy,
    register_batch,
)
from fleetsim.policies.ordering import ORDERING_POLICIES, OrderKey, make_ordering, register_ordering
from fleetsim.policies.registry import PolicySpec

__all__ = [
    "BATCH_POLICIES",
    "ORDERING_POLICIES",
    "BatchPolicy",
    "PrefillFirstPlanner",
    "OrderKey",
    "PolicySpec",
    "ReplicaView",
    "StepPlan",
    "TokenBudgetPlanner",
    "make_batch_policy",
    "make_ordering",
    "register_batch",
    "register_ordering",
]
