"""Global routers: pick the replica for each request.

A router's ``route(view, req, now_s)`` returns an index into ``view.replicas``. Replicas
expose ``load_tokens`` (known tokens still to compute: prefill backlog plus one per decoding
request), ``running``/``waiting`` queues and ``kv`` (for prefix matching); all are exact at
``now_s``. Random routers draw from ``view.rng``, the run's routing stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsim.policies.routing_steps import least_loaded, power_of_two
from fleetsim.registry import PolicySpec, build, lookup, make_registry
from fleetsim.serving.contract import ClusterView as ClusterView  # re-exported
from fleetsim.serving.contract import RoutableReplica as RoutableReplica  # re-exported
from fleetsim.serving.contract import Router as Router  # re-exported
from fleetsim.serving.request import Request


def num_in_flight(replica: RoutableReplica) -> int:
    """Requests a replica holds, running plus waiting: what a router's request counter sees
    (sgl-router's and vllm-router's load, slime's least-load)."""
    return len(replica.running) + len(replica.waiting)


ROUTERS, register_router = make_registry("routing")


@register_router("round_robin")
@dataclass(slots=True)
class RoundRobin:
    """Replicas in turn, whatever their load."""

    cursor: int = 0
    """Index of the next replica (state, reset per run by building a new router)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        i = self.cursor % len(view.replicas)
        self.cursor = i + 1
        return i


@register_router("least_loaded")
@dataclass(slots=True)
class LeastLoaded:
    """The replica with the fewest outstanding tokens (first one on ties)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        return least_loaded(view)  # (compiled: ``routing_steps.py``)


@register_router("power_of_two")
@dataclass(slots=True)
class PowerOfTwo:
    """Two distinct replicas drawn at random; the less loaded one (Mitzenmacher's
    power of two choices: exponentially better max load than one random choice)."""

    _uniforms: list[float] = field(default_factory=list, init=False, repr=False)
    """Uniform draws from ``view.rng``, taken 1024 at a time (one numpy call per 512
    routes instead of two per route)."""

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        return power_of_two(view, self._uniforms)  # (compiled: ``routing_steps.py``)


@register_router("prefix_affinity")
@dataclass(slots=True)
class PrefixAffinity:
    """Cache-aware routing with a load bound, as SGLang's router does.

    If loads are imbalanced (max - min above ``balance_abs_tokens`` and max above
    ``balance_rel`` x min), route to the least loaded replica. Otherwise route to the replica
    holding the longest cached prefix of the prompt, if it covers at least
    ``min_match_share`` of it, else to the least loaded. Ties go to the less loaded replica.
    """

    balance_abs_tokens: int = 8192
    """Absolute load gap (tokens) above which balance wins over affinity."""
    balance_rel: float = 1.5
    """Relative load gap above which balance wins over affinity."""
    min_match_share: float = 0.1
    """Smallest cached share of the prompt worth routing for."""
    num_balance_routes: int = field(default=0)
    """How many times the load bound overrode affinity (reported as a metric)."""

    def __post_init__(self) -> None:
        if self.balance_abs_tokens < 0 or self.balance_rel < 1.0:
            raise ValueError("balance_abs_tokens must be >= 0 and balance_rel >= 1")
        if not 0.0 <= self.min_match_share <= 1.0:
            raise ValueError(f"min_match_share must be in [0, 1], got {self.min_match_share}")

    def report(self) -> dict[str, int]:
        """The balance fallbacks, for the run's summary."""
        return {"num_balance_routes": self.num_balance_routes}

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        reps = view.replicas
        loads = [r.load_tokens for r in reps]
        lo, hi = min(loads), max(loads)
        least = loads.index(lo)
        if hi - lo > self.balance_abs_tokens and hi > self.balance_rel * lo:
            self.num_balance_routes += 1
            return least
        if not req.hash_ids:
            return least
        best, best_key = least, None
        for i, r in enumerate(reps):
            key = (r.kv.num_matched_entries(req), -loads[i])
            if best_key is None or key > best_key:
                best, best_key = i, key
        matched_tokens = (best_key[0] if best_key else 0) * (reps[best].kv.hash_block_tokens or 0)
        if matched_tokens < self.min_match_share * req.num_prompt_tokens:
            return least
        return best


def make_router(spec: PolicySpec, where: str = "cluster.router") -> Router:
    """Build the router named by ``spec``."""
    cls = lookup(ROUTERS, spec.name, f"{where}.name")
    router: Router = build(cls, spec.args, where)
    return router
