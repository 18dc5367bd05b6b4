"""Cache-aware routing as the SGLang router (``sgl-router``) and vllm-router do it: an
approximate prefix tree per replica of the prompts routed there, with a load bound.

The router never sees the replicas' caches: it remembers which prefixes it sent where (one
tree per replica, here the prefix-chained hash blocks of each prompt, in recency order) and
forgets them only by its own eviction (every ``eviction_interval_s``, least recently routed
first, down to ``max_tree_tokens`` per replica). Per request:

- if the load is imbalanced, (max - min) > ``balance_abs_threshold`` and max >
  ``balance_rel_threshold`` x min, with load = requests queued or running on the replica,
  route to the least loaded replica;
- else match the prompt against every tree: if the longest match covers more than
  ``cache_threshold`` of the prompt, route to its replica (ties: less loaded, then lower
  index); otherwise to the replica whose tree is smallest (the one with most cache room).

Either way the prompt is inserted into the chosen replica's tree. Defaults are
``sgl-router``'s (``cache_threshold`` 0.3, ``balance_abs_threshold`` 64,
``balance_rel_threshold`` 1.5, ``eviction_interval_secs`` 120, ``max_tree_size`` 2^26
characters: ``parse_policy_config`` in the router's source and its launch log); the tree's
size limit is counted here in tokens at 4 characters per token (an assumption).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetsim.policies.routing import num_in_flight, register_router
from fleetsim.serving.contract import ClusterView, RoutableReplica
from fleetsim.serving.request import Request


@register_router("cache_aware")
@dataclass(slots=True)
class CacheAware:
    """SGLang/vllm-router ``cache_aware`` (see the module docstring)."""

    cache_threshold: float = 0.3
    """Smallest matched share of the prompt worth routing for (exclusive)."""
    balance_abs_threshold: int = 64
    """Load gap, in requests, above which (with the ratio below) balance wins."""
    balance_rel_threshold: float = 1.5
    """Load ratio above which (with the gap above) balance wins."""
    eviction_interval_s: float = 120.0
    """How often the trees are trimmed, simulated seconds."""
    max_tree_tokens: int = 2**24
    """Size a tree is trimmed to, tokens (2^26 characters at 4 characters per token)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Routes by reason, for the run's summary."""
    _trees: dict[int, OrderedDict[int, None]] = field(default_factory=dict, repr=False)
    # replica id -> hash ids routed there, least recently routed first
    _last_eviction_s: float = field(default=0.0, repr=False)
    _hash_block_tokens: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold "
                             ">= 1")
        if not self.eviction_interval_s > 0 or self.max_tree_tokens < 0:
            raise ValueError("eviction_interval_s must be > 0 and max_tree_tokens >= 0")
        self.counts = {"num_balance_routes": 0, "num_cache_routes": 0,
                       "num_smallest_tree_routes": 0}

    def report(self) -> dict[str, int]:
        return dict(self.counts)

    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        reps = view.replicas
        trees = [self._trees.setdefault(r.replica_id, OrderedDict()) for r in reps]
        if self._hash_block_tokens is None:  # read once: reading ``kv`` settles a window
            self._hash_block_tokens = reps[0].kv.hash_block_tokens or 0
        hbt = self._hash_block_tokens
        if now_s - self._last_eviction_s >= self.eviction_interval_s:
            self._evict(hbt)
            self._last_eviction_s = now_s
        loads = [num_in_flight(r) for r in reps]
        lo, hi = min(loads), max(loads)
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            self.counts["num_balance_routes"] += 1
            return self._insert(reps, loads.index(lo), req)
        ids = req.hash_ids
        best, best_key = 0, None
        for i in range(len(reps)):
            tree, m = trees[i], 0
            while m < len(ids) and ids[m] in tree:
                m += 1
            key = (m, -loads[i])
            if best_key is None or key > best_key:
                best, best_key = i, key
        matched = min((best_key[0] if best_key else 0) * hbt, req.num_prompt_tokens)
        if req.num_prompt_tokens and matched > self.cache_threshold * req.num_prompt_tokens:
            self.counts["num_cache_routes"] += 1
            return self._insert(reps, best, req)
        self.counts["num_smallest_tree_routes"] += 1
        sizes = [len(trees[i]) for i in range(len(reps))]
        return self._insert(reps, sizes.index(min(sizes)), req)

    def _insert(self, reps: Sequence[RoutableReplica], i: int, req: Request) -> int:
        tree = self._trees[reps[i].replica_id]
        for h in reversed(req.hash_ids):  # the head most recent: trees lose tails first
            tree[h] = None
            tree.move_to_end(h)
        return i

    def _evict(self, hbt: int) -> None:
        limit = self.max_tree_tokens // hbt if hbt else 0
        for tree in self._trees.values():
            while len(tree) > limit:
                tree.popitem(last=False)
