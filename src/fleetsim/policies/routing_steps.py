"""The per-arrival work of the simple routers, compiled with the engine (``native.py``):
the router classes stay interpreted so users can subclass them, and call these."""

from __future__ import annotations

from fleetsim.serving.contract import ClusterView, RoutableReplica
from fleetsim.serving.views import ReplicaView

UNIFORMS_PER_DRAW = 1024
"""Uniforms taken from the routing stream at a time (one numpy call per 512 routes)."""


def power_of_two(view: ClusterView, uniforms: list[float]) -> int:
    """Power of two choices: two distinct replicas drawn at random (from ``uniforms``,
    refilled from ``view.rng``), the less loaded one (the first drawn on a tie)."""
    replicas = view.replicas
    # (the engine's view holds a list: compiled, a list is indexed natively, a Sequence not)
    reps = replicas if isinstance(replicas, list) else list(replicas)
    n = len(reps)
    if n == 1:
        return 0
    if len(uniforms) < 2:
        uniforms.extend(view.rng.random(UNIFORMS_PER_DRAW).tolist())
    a = int(uniforms.pop() * n)
    b = int(uniforms.pop() * (n - 1))
    if b >= a:  # distinct from a, uniform over the others
        b += 1
    return a if _load_tokens(reps[a]) <= _load_tokens(reps[b]) else b


def least_loaded(view: ClusterView) -> int:
    """The replica with the fewest outstanding tokens, the first one on ties (``LeastLoaded``:
    it routes every request twice under P/D, 323k routes in an ExpertPlex entry)."""
    replicas = view.replicas
    reps = replicas if isinstance(replicas, list) else list(replicas)
    n = len(reps)
    if n == 1:
        return 0
    best = 0
    best_load = _load_tokens(reps[0])
    for i in range(1, n):
        load = _load_tokens(reps[i])
        if load < best_load:
            best, best_load = i, load
    return best


def _load_tokens(replica: RoutableReplica) -> int:
    """``replica.load_tokens``: a direct call on the engine's view (narrowed to the compiled
    class), an attribute lookup on any other."""
    if isinstance(replica, ReplicaView):
        return replica.load_tokens
    return replica.load_tokens
