"""Prefix-cache eviction policies: a key function over a ``CacheEntry``; smallest goes first.

``lru`` is the engine's own fast path (the cache keeps entries in release order), so it is
registered as ``None``. Others are key functions, evaluated over the evictable entries at
each eviction (SGLang's eviction strategies are the same shape).
"""

from __future__ import annotations

from fleetsim.registry import lookup, make_registry
from fleetsim.serving.prefix_cache import CacheEntry, EvictionKey

EVICTION_POLICIES, register_eviction = make_registry("eviction")
EVICTION_POLICIES["lru"] = None  # least recently released first (release order, O(1))


@register_eviction("lfu")
def lfu(entry: CacheEntry) -> tuple[int, ...]:
    """Least frequently reused first (admissions that hit it), then least recently."""
    return (entry.num_hits,)


@register_eviction("deepest_first")
def deepest_first(entry: CacheEntry) -> tuple[int, ...]:
    """Blocks far into their prompt first: keep the shared heads of conversations."""
    return (-entry.depth,)


def make_eviction(name: str) -> EvictionKey | None:
    """The eviction key registered as ``name`` (None for LRU), or ``pkg.mod:func``."""
    key: EvictionKey | None = lookup(EVICTION_POLICIES, name, "policy.eviction")
    return key
