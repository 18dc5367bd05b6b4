"""TokenLake (Wu et al., arXiv 2508.17219): one prefix-cache pool over every replica, kept in
fixed-size segments, with a scheduler that balances load and ignores where caches live.

The pool is the replicas' own prefix caches joined (``PrefixCache.join_pool``): a segment is
one prefix hash block (Mooncake's ``hash_ids``, 512 tokens), cached in the KV memory of the
replica that computed it, so each replica's share of the pool is bounded by its KV blocks,
shared with its running requests, as a per-replica cache is. What the pool changes:

- **cluster-wide hits, no copies**: a request's leading segments count as cached if any
  replica holds them; admitted, it *borrows* the remote ones (they stay pinned where they
  live, in that replica's blocks, until it finishes; it takes no blocks for them where it
  runs), as TokenLake ships the query to the cache instead of the cache to the query;
- **deduplication**: a replica that computes a segment the pool already holds shares that
  copy and frees its own (``PrefixCache.add``), so each segment lives once;
- **heavy hitters**: a segment used at least ``heavy_hitter_min_uses`` times within
  ``heavy_hitter_window_s`` is copied to the replicas that use it, up to ``max_replicas``
  copies (one replica would otherwise serve every request's queries for it);
- **the transfer**: before a request is queued, what it reads from each other replica moves
  over the KV links (the cluster's ``TransferService``: NIC bandwidth, fair-shared, with
  latency): per holder, the smaller of the KV of the segments it holds and the request's new
  tokens' query and attention output (``query_bytes_per_token`` per token; TokenLake's
  dispatch picks the smaller volume); a heavy hitter being copied moves as KV;
- **load-balanced scheduling**: each request goes to the replica with the fewest
  outstanding tokens (its pending transfers included), whatever it caches.

Simplifications (docs/reproductions.md lists them with their direction): the transfer is
paid once, before the request is queued (TokenLake overlaps it with the prefill, layer by
layer, and sends a decode step's query too); attention over borrowed segments is computed on
the request's replica (TokenLake computes it where they live).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetsim.policies.cache_aware import CacheAware
from fleetsim.policies.routing import register_router
from fleetsim.serving.contract import ClusterView
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.kv_placement import KVPlacement, PoolFetch
from fleetsim.serving.prefix_cache import PrefixCache
from fleetsim.serving.request import Request


@register_router("tokenlake")
@dataclass(slots=True)
class TokenLake:
    """The pool's control plane: the router that balances load, and the pool policy the
    cluster's KV placement service asks what each arrival reads remotely (``attach``)."""

    query_bytes_per_token: float | None = None
    """Bytes of one token's query plus attention output, all layers (what shipping the query
    to a segment's replica moves per new token); None: always move the KV."""
    heavy_hitter_min_uses: int = 4
    """Uses within the window from which a segment is a heavy hitter (assumption: the paper's
    threshold is not public)."""
    heavy_hitter_window_s: float = 60.0
    """Length of the window heavy-hitter uses are counted over, seconds (assumption)."""
    max_replicas: int = 2
    """Copies a heavy-hitter segment may have across replicas; others have one."""
    cache_aware_routing: bool = False
    """Route as the ``cache_aware`` router does (SGLang's defaults) instead of by load only:
    an ablation that keeps the pool and removes TokenLake's cache-oblivious scheduling."""
    counts: dict[str, float] = field(default_factory=dict)
    """Counters for the run's summary (reads, segments, bytes, copies, transfer wait)."""
    _caches: dict[int, PrefixCache] = field(default_factory=dict, repr=False)
    # replica id -> its prefix cache, for the pooled replicas
    _kv_bytes_per_token: float = field(default=0.0, repr=False)
    _uses: dict[int, tuple[float, int]] = field(default_factory=dict, repr=False)
    # hash id -> (window start s, uses in it)
    _pending_tokens: dict[int, int] = field(default_factory=dict, repr=False)
    # replica id -> prompt tokens of requests whose transfers are in flight to it
    _start_s: dict[int, float] = field(default_factory=dict, repr=False)
    # request id -> when its transfers started
    _cache_aware: CacheAware | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.query_bytes_per_token is not None and not self.query_bytes_per_token > 0:
            raise ValueError(f"query_bytes_per_token must be > 0 (or None: move the KV), got "
                             f"{self.query_bytes_per_token}")
        if self.heavy_hitter_min_uses < 1:
            raise ValueError(f"heavy_hitter_min_uses must be >= 1, got "
                             f"{self.heavy_hitter_min_uses}")
        if not self.heavy_hitter_window_s > 0:
            raise ValueError(f"heavy_hitter_window_s must be > 0, got "
                             f"{self.heavy_hitter_window_s}")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1 (1: no copies), got "
                             f"{self.max_replicas}")
        if self.cache_aware_routing:
            self._cache_aware = CacheAware()
        self.counts = {"num_remote_reads": 0, "num_remote_segments": 0, "transfer_bytes": 0.0,
                       "num_query_shipped": 0, "num_heavy_hitter_copies": 0,
                       "num_copies_without_room": 0, "transfer_wait_s": 0.0}

    # ---- wiring ----------------------------------------------------------------------
    def attach(self, cluster: Any) -> None:
        """Join the prompt-computing replicas' caches into one pool on the cluster's KV
        placement service, which asks ``plan_fetch`` about each arrival and moves what it
        says (decode replicas receive whole KV by handoff and cache nothing)."""
        placement: KVPlacement = cluster.kv_placement
        ids = [v.replica_id for v in cluster.views if v.role != "decode"]
        self._caches = {rid: placement.replicas[rid].kv.prefix for rid in ids}
        self._kv_bytes_per_token = placement.kv_bytes_per_token
        placement.join_pool(ids, self)

    def report(self) -> dict[str, float]:
        """The counters, blocks deduplicated, and the mean wait of a remote read."""
        n = self.counts["num_remote_reads"]
        return {**self.counts,
                "num_deduplicated": sum(c.num_deduplicated for c in self._caches.values()),
                "mean_transfer_wait_s": self.counts["transfer_wait_s"] / n if n else 0.0}

    # ---- scheduling: load only -------------------------------------------------------
    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        """The replica with the fewest outstanding tokens, pending transfers included (or,
        under ``cache_aware_routing``, the ``cache_aware`` router's choice)."""
        if self._cache_aware is not None:
            return self._cache_aware.route(view, req, now_s)
        pending = self._pending_tokens
        best, best_load = 0, None
        for i, r in enumerate(view.replicas):
            load = r.load_tokens + pending.get(r.replica_id, 0)
            if best_load is None or load < best_load:
                best, best_load = i, load
        return best

    # ---- heavy hitters ---------------------------------------------------------------
    def is_heavy_hitter(self, hash_id: int, now_s: float) -> bool:
        start, uses = self._uses.get(hash_id, (now_s, 0))
        return now_s - start <= self.heavy_hitter_window_s and uses >= self.heavy_hitter_min_uses

    def _note_use(self, hash_id: int, now_s: float) -> None:
        start, uses = self._uses.get(hash_id, (now_s, 0))
        if now_s - start > self.heavy_hitter_window_s:
            start, uses = now_s, 0
        self._uses[hash_id] = (start, uses + 1)

    def num_copies(self, hash_id: int) -> int:
        return sum(hash_id in c.entries for c in self._caches.values())

    # ---- a request arrives (the pool policy of ``KVPlacement``) ------------------------
    def plan_fetch(self, kv: KVCache, replica_id: int, req: Request,
                   now_s: float) -> PoolFetch | None:
        """What ``req``, arriving at ``replica_id``, reads from other replicas' segments
        (query or KV, heavy-hitter copies as KV); None when it reads nothing remote."""
        m = kv.num_matched_entries(req)
        if not m:
            return None
        cache = kv.prefix
        hbt = kv.hash_block_tokens or 0
        reads: dict[int, int] = {}  # holder replica id -> segments read there
        copies: dict[int, list[tuple[int, int]]] = {}  # holder id -> (position, hash id)
        for j, h in enumerate(req.hash_ids[:m]):
            self._note_use(h, now_s)
            holder = cache.holder(h)
            assert holder is not None
            if holder is cache:
                continue
            src = self._replica_of(holder)
            if (h not in cache.borrowed and self.is_heavy_hitter(h, now_s)
                    and self.num_copies(h) < self.max_replicas):
                copies.setdefault(src, []).append((j, h))
            else:
                reads[src] = reads.get(src, 0) + 1
        if not reads and not copies:
            return None
        new_tokens = req.num_prompt_tokens - m * hbt
        moves: dict[int, float] = {}  # source replica id -> bytes
        for src, n in reads.items():
            kv_bytes = n * hbt * self._kv_bytes_per_token
            q = self.query_bytes_per_token
            q_bytes = new_tokens * q if q is not None else kv_bytes
            moves[src] = min(kv_bytes, q_bytes)
            self.counts["num_query_shipped"] += q_bytes < kv_bytes
            self.counts["num_remote_segments"] += n
        for src, hs in copies.items():
            moves[src] = moves.get(src, 0.0) + len(hs) * hbt * self._kv_bytes_per_token
            self.counts["num_remote_segments"] += len(hs)
        self._pending_tokens[replica_id] = (self._pending_tokens.get(replica_id, 0)
                                            + req.num_prompt_tokens)
        self._start_s[req.id] = now_s
        for num_bytes in moves.values():
            self.counts["transfer_bytes"] += num_bytes
        self.counts["num_remote_reads"] += 1
        return PoolFetch(tuple(moves.items()), tuple(h for hs in copies.values() for h in hs))

    def _replica_of(self, cache: PrefixCache) -> int:
        for rid, c in self._caches.items():
            if c is cache:
                return rid
        raise AssertionError("a pooled cache without its replica")

    def landed(self, replica_id: int, req: Request, num_copied: int, num_without_room: int,
               now_s: float) -> None:
        """Everything ``req`` read has landed: its transfers no longer count as load."""
        self._pending_tokens[replica_id] -= req.num_prompt_tokens
        self.counts["transfer_wait_s"] += now_s - self._start_s.pop(req.id)
        self.counts["num_heavy_hitter_copies"] += num_copied
        self.counts["num_copies_without_room"] += num_without_room
