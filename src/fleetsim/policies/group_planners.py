"""Group planners (``serving/contract.py``, ``GroupPlanner``): how an instance group's
instances are split into members and which member takes each arrival.

``fixed`` is the reference: members of ``degree`` consecutive instances, never changed, each
arrival to the member with the least load (a group of one member is then exactly a replica).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.registry import PolicySpec, build, lookup, make_registry
from fleetsim.serving.contract import GroupPlan, GroupPlanner, GroupView

GROUP_PLANNERS, register_group_planner = make_registry("group planner")


@register_group_planner("fixed")
@dataclass(slots=True)
class FixedGroup:
    """Members of ``degree`` instances each (the last takes what is left), fixed for the run;
    an arrival goes to the member with the fewest known tokens to compute (lowest first)."""

    degree: int = 1
    """Instances per member (its degree of parallelism)."""

    def __post_init__(self) -> None:
        if self.degree < 1:
            raise ValueError(f"degree must be >= 1, got {self.degree}")

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        n = view.num_instances
        alloc = tuple(tuple(range(m, min(m + self.degree, n))) if m % self.degree == 0
                      else () for m in range(n))
        members = view.members
        active = [m for m in range(n) if alloc[m]]
        assign = []
        load = {m: members[m].load_tokens for m in active}
        for req in view.waiting:
            m = min(active, key=lambda x: (load[x], x))
            assign.append((req.id, m))
            load[m] += req.num_tokens
        return GroupPlan(alloc, tuple(assign))


def make_group_planner(spec: PolicySpec) -> GroupPlanner:
    """Build the group planner named by ``spec`` with its args."""
    cls = lookup(GROUP_PLANNERS, spec.name, "group.planner.name")
    planner: GroupPlanner = build(cls, spec.args, "group.planner")
    return planner
