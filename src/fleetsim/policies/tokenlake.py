"""TokenLake (Wu et al., arXiv 2508.17219): one prefix-cache pool over every replica, kept in
fixed-size segments, with a scheduler that balances load and ignores where caches live.

The pool is the replicas' own prefix caches (``serving/prefix_cache.py``), seen together: a
segment is one prefix hash block (Mooncake's ``hash_ids``, 512 tokens), held by whichever
replica computed or fetched it, in that replica's KV memory (so each replica's share of the
pool is bounded by its KV blocks, shared with its running requests, exactly as a per-replica
cache is). What the pool adds, and what this module models:

- **cluster-wide hits**: an arriving request's leading segments count as cached if *any*
  replica holds them. Those its own replica lacks are fetched from their holders over the
  replicas' KV links (the cluster's ``TransferService``: NIC bandwidth, fair-shared, with
  latency) before it is queued; bytes = segments x 512 x KV bytes per token. A segment its
  replica has no room for is not fetched (the request computes it);
- **deduplication**: after a fetch the source copy of a cold segment is put first in its
  replica's eviction order (it goes before any other unused entry), so one copy survives;
- **heavy hitters**: a segment used at least ``heavy_hitter_min_uses`` times within
  ``heavy_hitter_window_s`` keeps up to ``max_replicas`` copies (spread over the replicas that
  use it) instead of one, so no single replica's link serves all its fetches;
- **load-balanced scheduling**: each request goes to the replica with the fewest outstanding
  tokens (its pending fetches included), whatever it caches.

Simplifications (docs/reproductions.md lists them with their direction): TokenLake can ship a
request's query to the segments' holders instead of their KV (its dispatch optimiser picks the
smaller volume); we always move the KV, the larger volume for long hits. New segments stay on
the replica that computed them (TokenLake may ``put`` them elsewhere). A source copy is read
when its transfer starts (not pinned while in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetsim.policies.routing import ClusterView, register_router
from fleetsim.serving.request import RELOADING, Request

if TYPE_CHECKING:
    from fleetsim.serving.replica import Replica


@register_router("tokenlake")
@dataclass(slots=True)
class TokenLake:
    """The pool's control plane: the router that balances load, and the fetch hook every
    replica calls on arrival (installed by ``attach``)."""

    heavy_hitter_min_uses: int = 4
    """Uses within the window from which a segment is a heavy hitter (assumption: the paper's
    threshold is not public)."""
    heavy_hitter_window_s: float = 60.0
    """Length of the window heavy-hitter uses are counted over, seconds (assumption)."""
    max_replicas: int = 2
    """Copies a heavy-hitter segment may keep across replicas; cold segments keep one."""
    counts: dict[str, float] = field(default_factory=dict)
    """Counters for the run's summary (fetches, segments, bytes, dedups, replicas kept)."""
    _replicas: list[Replica] = field(default_factory=list, repr=False)
    _transfers: Any = field(default=None, repr=False)
    _kv_bytes_per_token: float = field(default=0.0, repr=False)
    _uses: dict[int, tuple[float, int]] = field(default_factory=dict, repr=False)
    # hash id -> (window start s, uses in it)
    _pending_tokens: dict[int, int] = field(default_factory=dict, repr=False)
    # replica id -> prompt tokens of requests whose fetch is in flight to it
    _outgoing: dict[int, int] = field(default_factory=dict, repr=False)
    # replica id -> fetches in flight from it
    _fetch_start_s: dict[int, float] = field(default_factory=dict, repr=False)
    # request id -> when its fetch started

    def __post_init__(self) -> None:
        if self.heavy_hitter_min_uses < 1:
            raise ValueError(f"heavy_hitter_min_uses must be >= 1, got "
                             f"{self.heavy_hitter_min_uses}")
        if not self.heavy_hitter_window_s > 0:
            raise ValueError(f"heavy_hitter_window_s must be > 0, got "
                             f"{self.heavy_hitter_window_s}")
        if self.max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1 (1: no replication), got "
                             f"{self.max_replicas}")
        self.counts = {"num_fetches": 0, "num_fetched_segments": 0, "fetched_bytes": 0.0,
                       "num_unfetched_segments": 0, "num_dedup": 0,
                       "num_heavy_hitter_copies": 0, "fetch_wait_s": 0.0}

    # ---- wiring ----------------------------------------------------------------------
    def attach(self, cluster: Any) -> None:
        """Take the cluster's prompt-computing replicas and its transfer service, and hook
        their arrivals."""
        # The replicas that compute prompts (mixed or prefill) hold the pool; decode replicas
        # receive whole KV by handoff and cache nothing.
        self._replicas = [r for r in cluster.replicas if r.role != "decode"]
        self._transfers = cluster.transfers
        self._kv_bytes_per_token = self._replicas[0].moves.kv_bytes_per_token
        for replica in self._replicas:
            replica.prefix_fetch = self.fetch

    def report(self) -> dict[str, float]:
        """The counters, and the mean time a fetching request waited for its segments."""
        n = self.counts["num_fetches"]
        return {**self.counts, "mean_fetch_wait_s": self.counts["fetch_wait_s"] / n if n else 0.0}

    # ---- scheduling: load only -------------------------------------------------------
    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        """The replica with the fewest outstanding tokens, pending fetches included."""
        pending = self._pending_tokens
        best, best_load = 0, None
        for i, r in enumerate(view.replicas):
            load = r.load_tokens + pending.get(r.replica_id, 0)
            if best_load is None or load < best_load:
                best, best_load = i, load
        return best

    # ---- the pool --------------------------------------------------------------------
    def holders(self, hash_id: int) -> list[Replica]:
        """Replicas whose cache holds segment ``hash_id`` now."""
        return [r for r in self._replicas if hash_id in r.kv.prefix.entries]

    def pool_hit(self, req: Request) -> int:
        """Leading segments of ``req`` held anywhere in the pool (at least one prompt token is
        always computed, as a per-replica cache does)."""
        kv = self._replicas[0].kv
        if not kv.prefix_caching or not req.hash_ids:
            return 0
        hbt = kv.hash_block_tokens
        assert hbt is not None
        limit = min(len(req.hash_ids), req.num_prompt_tokens // hbt)
        m = 0
        while m < limit and self._held_anywhere(req.hash_ids[m]):
            m += 1
        if m and m * hbt >= req.num_prompt_tokens:
            m -= 1
        return m

    def _held_anywhere(self, hash_id: int) -> bool:
        return any(hash_id in r.kv.prefix.entries for r in self._replicas)

    def is_heavy_hitter(self, hash_id: int, now_s: float) -> bool:
        start, uses = self._uses.get(hash_id, (now_s, 0))
        return now_s - start <= self.heavy_hitter_window_s and uses >= self.heavy_hitter_min_uses

    def _note_use(self, hash_id: int, now_s: float) -> None:
        start, uses = self._uses.get(hash_id, (now_s, 0))
        if now_s - start > self.heavy_hitter_window_s:
            start, uses = now_s, 0
        self._uses[hash_id] = (start, uses + 1)

    def fetch(self, replica: Replica, req: Request) -> bool:
        """``req`` arrives at ``replica``: fetch the pool segments of its prefix that the
        replica lacks, from their holders; it is queued when the last lands (returns True),
        or at once when nothing must move (False)."""
        m = self.pool_hit(req)
        if not m:
            return False
        now_s = replica.sim.now_s
        ids = req.hash_ids[:m]
        for h in ids:
            self._note_use(h, now_s)
        rid = replica.replica_id
        by_source: dict[int, list[int]] = {}  # source replica id -> hash ids it sends
        for h in ids:
            held_by = self.holders(h)
            if any(r.replica_id == rid for r in held_by):
                keep = rid
            else:
                keep = min(held_by, key=lambda r: (self._outgoing.get(r.replica_id, 0),
                                                   r.replica_id)).replica_id
                by_source.setdefault(keep, []).append(h)
            if len(held_by) > 1:
                self._dedup(h, held_by, keep, now_s)
        if not by_source:
            return False
        hbt = replica.kv.hash_block_tokens or 0
        req.state = RELOADING
        replica.adopt(req)
        self._pending_tokens[rid] = self._pending_tokens.get(rid, 0) + req.num_prompt_tokens
        left = [len(by_source)]
        for src_id, hs in by_source.items():
            num_bytes = len(hs) * hbt * self._kv_bytes_per_token
            self._outgoing[src_id] = self._outgoing.get(src_id, 0) + 1
            self.counts["fetched_bytes"] += num_bytes
            self._transfers.start(src_id, rid, num_bytes,
                                  _Landing(self, replica, req, src_id, left),
                                  client="pool_fetch")
        self.counts["num_fetches"] += 1
        self._fetch_start_s[req.id] = now_s
        return True

    def land(self, replica: Replica, req: Request) -> None:
        """Every fetch for ``req`` has arrived: its segments become entries of ``replica``'s
        cache (as many as fit), source copies of cold segments go first in their eviction
        order, and ``req`` is queued."""
        replica.interrupt()
        kv = replica.kv
        prefix, per = kv.prefix, kv.blocks_per_entry
        rid = replica.replica_id
        self._pending_tokens[rid] -= req.num_prompt_tokens
        self.counts["fetch_wait_s"] += replica.sim.now_s - self._fetch_start_s.pop(req.id)
        ids = req.hash_ids[: self._leading_wanted(req)]
        # Hold what is here (it must survive the evictions that make room), then fill the
        # missing segments in prompt order while blocks last.
        present = tuple(h for h in ids if h in prefix.entries)
        if present:
            prefix.pin(present)
        missing = [(j, h) for j, h in enumerate(ids) if h not in prefix.entries]
        room = kv.num_available_blocks // per
        placed = missing[:room]
        self.counts["num_unfetched_segments"] += len(missing) - len(placed)
        self.counts["num_fetched_segments"] += len(placed)
        if placed:
            kv.take_blocks(len(placed) * per)
            for j, h in placed:
                prefix.add(h, j)
        held = tuple(h for h in ids if h in prefix.entries)
        prefix.unref(held, len(held))  # evictable again, tail first, most recently used
        replica.queue_arrived(req)

    def _leading_wanted(self, req: Request) -> int:
        hbt = self._replicas[0].kv.hash_block_tokens or 1
        m = min(len(req.hash_ids), req.num_prompt_tokens // hbt)
        return m - 1 if m and m * hbt >= req.num_prompt_tokens else m

    def _dedup(self, hash_id: int, held_by: list[Replica], keep: int, now_s: float) -> None:
        """A segment found on several replicas keeps one copy, the one ``keep`` holds or
        receives (a heavy hitter keeps ``max_replicas``, those with the least fetch traffic
        next): the others, if unused, are evicted before any other unused entry of their
        replica."""
        others = sorted((r for r in held_by if r.replica_id != keep),
                        key=lambda r: (self._outgoing.get(r.replica_id, 0), r.replica_id))
        extra = self.max_replicas - 1 if self.is_heavy_hitter(hash_id, now_s) else 0
        if extra and others:
            self.counts["num_heavy_hitter_copies"] += min(extra, len(others))
        for r in others[extra:]:
            evictable = r.kv.prefix.evictable
            if hash_id in evictable:
                evictable.move_to_end(hash_id, last=False)
                self.counts["num_dedup"] += 1


class _Landing:
    """Callback of one fetch transfer; the last one of a request lands it."""

    __slots__ = ("left", "pool", "replica", "req", "src_id")

    def __init__(self, pool: TokenLake, replica: Replica, req: Request, src_id: int,
                 left: list[int]) -> None:
        self.pool, self.replica, self.req, self.src_id, self.left = (pool, replica, req,
                                                                     src_id, left)

    def __call__(self) -> None:
        self.pool._outgoing[self.src_id] -= 1
        self.left[0] -= 1
        if self.left[0] == 0:
            self.pool.land(self.replica, self.req)
