"""Expert balancer plug-ins: a registry by short name, plus the history-based baselines.

A balancer is any object with ``plan(view: BalanceView) -> Placement``. It must be pure in
the view (no clock, no global RNG); state it carries across microbatches is read from
``view.previous`` and ``view.history``. Built-ins: ``none``, ``eplb`` (EPLB on the exact
load: an oracle), ``eplb_stale`` (EPLB on the previous microbatch or a window, as deployed),
``quota`` (UltraEP-style, in ``quota.py``) and ``two_timescale`` (ReLibra-style).

What a planner knows matters as much as its algorithm, so built-ins also say what they plan
from (``sees``) and whether their copies can be fetched ahead of the step (``prefetchable``:
a plan from history is known before the step; one from the exact load only after gating).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.eplb import rebalance_experts
from fleetsim.moe.placement import BalanceView, Placement, even_split, static_phy2log
from fleetsim.registry import build, lookup, make_registry


class ExpertBalancer(Protocol):
    """Plans one microbatch's placement for all MoE layers."""

    def plan(self, view: BalanceView) -> Placement: ...


# The same registry machinery as every other plug-in kind (fleetsim/registry.py): a plain
# dict filled by a decorator, names or "pkg.mod:Cls", unknown args failing by name.
BALANCERS, register_balancer = make_registry("expert balancer")


def make_balancer(name: str, args: Mapping[str, object] | None = None) -> ExpertBalancer:
    """Build a balancer by registry name or ``"pkg.mod:Cls"``; unknown args fail by name
    (``FleetsimInputError`` whose ``where`` is ``balancer`` or ``balancer 'name'.args``)."""
    cls = lookup(BALANCERS, name, "balancer")
    balancer: ExpertBalancer = build(cls, dict(args or {}), f"balancer {name!r}")
    return balancer


@register_balancer("none")
class NoBalancing:
    """Static placement: expert ``e`` on GPU ``e // (num_experts / num_gpus)``, no replicas."""

    sees = "nothing (static placement)"
    prefetchable = "no copies"

    def plan(self, view: BalanceView) -> Placement:
        if view.previous is not None:
            return view.previous
        phy2log = static_phy2log(
            view.num_layers, view.num_experts, view.num_gpus, view.slots_per_gpu
        )
        return even_split(phy2log, view.num_experts, view.slots_per_gpu)


def _eplb_placement(view: BalanceView, load: np.ndarray, num_groups: int) -> Placement:
    num_nodes = view.num_nodes if num_groups % view.num_nodes == 0 else 1
    phy2log, _, _ = rebalance_experts(
        load, view.num_gpus * view.slots_per_gpu, num_groups, num_nodes, view.num_gpus
    )
    return even_split(phy2log, view.num_experts, view.slots_per_gpu)


@register_balancer("eplb")
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EplbFresh:
    """EPLB re-run every microbatch on that microbatch's exact load (an oracle bound).

    num_groups: expert groups for EPLB's hierarchical policy (used when the number of nodes
        divides it); the default 1 selects the global policy. With as many groups as nodes
        (DeepSeek-V3's 8 groups on 8 nodes) each node is pinned to one group, so the
        hierarchical policy cannot move load across nodes at all.
    """

    num_groups: int = 1

    sees = "exact current load (oracle)"
    prefetchable = "no"

    def plan(self, view: BalanceView) -> Placement:
        return _eplb_placement(view, view.expert_load, self.num_groups)


@register_balancer("eplb_stale")
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EplbStale:
    """EPLB planned from history: the mean load of the last ``window`` microbatches.

    Before any history exists it keeps the static placement. ``every`` > 1 replans only
    every that many microbatches (vLLM's ``step_interval``), keeping the placement between.
    ``num_groups`` as in ``eplb`` (as many groups as nodes: no cross-node balancing).
    """

    window: int = 1
    every: int = 1
    num_groups: int = 1

    prefetchable = "yes"

    @property
    def sees(self) -> str:
        seen = "previous step" if self.window == 1 else f"mean of last {self.window} steps"
        return seen if self.every == 1 else f"{seen}, replanned every {self.every}"

    @property
    def history_window(self) -> int:
        """Microbatches of history it reads."""
        return self.window

    def __post_init__(self) -> None:
        if self.window < 1:
            raise FleetsimInputError("eplb_stale.window", self.window, "must be >= 1")
        if self.every < 1:
            raise FleetsimInputError("eplb_stale.every", self.every, "must be >= 1")

    def plan(self, view: BalanceView) -> Placement:
        if not view.history:
            return NoBalancing().plan(view)
        if view.previous is not None and view.microbatch_index % self.every:
            return view.previous
        load = np.mean(view.history[-self.window :], axis=0)
        return _eplb_placement(view, load, self.num_groups)
