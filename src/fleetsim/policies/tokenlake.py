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
from typing import TYPE_CHECKING, Any

from fleetsim.policies.routing import register_router
from fleetsim.serving.contract import ClusterView
from fleetsim.serving.request import RELOADING, Request

if TYPE_CHECKING:
    from fleetsim.serving.prefix_cache import PrefixCache
    from fleetsim.serving.replica import Replica


@register_router("tokenlake")
@dataclass(slots=True)
class TokenLake:
    """The pool's control plane: the router that balances load, and the hook every pooled
    replica calls on arrival (installed by ``attach``)."""

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
    counts: dict[str, float] = field(default_factory=dict)
    """Counters for the run's summary (reads, segments, bytes, copies, transfer wait)."""
    _replicas: list[Replica] = field(default_factory=list, repr=False)
    _transfers: Any = field(default=None, repr=False)
    _kv_bytes_per_token: float = field(default=0.0, repr=False)
    _uses: dict[int, tuple[float, int]] = field(default_factory=dict, repr=False)
    # hash id -> (window start s, uses in it)
    _pending_tokens: dict[int, int] = field(default_factory=dict, repr=False)
    # replica id -> prompt tokens of requests whose transfers are in flight to it
    _start_s: dict[int, float] = field(default_factory=dict, repr=False)
    # request id -> when its transfers started

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
        self.counts = {"num_remote_reads": 0, "num_remote_segments": 0, "transfer_bytes": 0.0,
                       "num_query_shipped": 0, "num_heavy_hitter_copies": 0,
                       "num_copies_without_room": 0, "transfer_wait_s": 0.0}

    # ---- wiring ----------------------------------------------------------------------
    def attach(self, cluster: Any) -> None:
        """Join the prompt-computing replicas' caches into one pool, take the transfer
        service, and hook their arrivals (decode replicas receive whole KV by handoff and
        cache nothing)."""
        self._replicas = [r for r in cluster.replicas if r.role != "decode"]
        self._transfers = cluster.transfers
        self._kv_bytes_per_token = self._replicas[0].moves.kv_bytes_per_token
        caches = [r.kv.prefix for r in self._replicas]
        for replica in self._replicas:
            replica.kv.prefix.join_pool(caches, _Waker(replica, False), _Waker(replica, True))
            replica.prefix_fetch = self.fetch

    def report(self) -> dict[str, float]:
        """The counters, blocks deduplicated, and the mean wait of a remote read."""
        n = self.counts["num_remote_reads"]
        return {**self.counts,
                "num_deduplicated": sum(r.kv.prefix.num_deduplicated for r in self._replicas),
                "mean_transfer_wait_s": self.counts["transfer_wait_s"] / n if n else 0.0}

    # ---- scheduling: load only -------------------------------------------------------
    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        """The replica with the fewest outstanding tokens, pending transfers included."""
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
        return sum(hash_id in r.kv.prefix.entries for r in self._replicas)

    # ---- a request arrives -----------------------------------------------------------
    def fetch(self, replica: Replica, req: Request) -> bool:
        """``req`` arrives at ``replica``: move what it reads from other replicas' segments
        (query or KV, heavy-hitter copies as KV); it is queued when the last transfer lands
        (returns True), or at once when it reads nothing remote (False)."""
        kv = replica.kv
        m = kv.num_matched_entries(req)
        if not m:
            return False
        now_s = replica.sim.now_s
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
            return False
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
        req.state = RELOADING
        replica.adopt(req)
        rid = replica.replica_id
        self._pending_tokens[rid] = self._pending_tokens.get(rid, 0) + req.num_prompt_tokens
        self._start_s[req.id] = now_s
        landing = _Landing(self, replica, req, [h for hs in copies.values() for h in hs],
                           len(moves))
        for src, num_bytes in moves.items():
            self.counts["transfer_bytes"] += num_bytes
            self._transfers.start(src, rid, num_bytes, landing, client="pool_read")
        self.counts["num_remote_reads"] += 1
        return True

    def _replica_of(self, cache: PrefixCache) -> int:
        for r in self._replicas:
            if r.kv.prefix is cache:
                return r.replica_id
        raise AssertionError("a pooled cache without its replica")

    def land(self, replica: Replica, req: Request, copies: list[tuple[int, int]]) -> None:
        """Every transfer for ``req`` is done: heavy-hitter copies that still have room
        become entries here, and ``req`` is queued."""
        rid = replica.replica_id
        self._pending_tokens[rid] -= req.num_prompt_tokens
        self.counts["transfer_wait_s"] += replica.sim.now_s - self._start_s.pop(req.id)
        # An arrival cuts the window in flight (as ``Replica.submit`` does); so do the blocks
        # a copy takes.
        replica.interrupt()
        kv = replica.kv
        cache, per = kv.prefix, kv.blocks_per_entry
        for j, h in copies:
            if h in cache.entries or h in cache.borrowed or cache.holder(h) is None:
                continue  # cached or borrowed here meanwhile, or gone from the pool
            if kv.num_available_blocks < per:
                self.counts["num_copies_without_room"] += 1
                continue
            kv.take_blocks(per)
            cache.add_copy(h, j)
            self.counts["num_heavy_hitter_copies"] += 1
        replica.queue_arrived(req)


class _Landing:
    """Callback of a request's transfers; the last one lands it."""

    __slots__ = ("copies", "left", "pool", "replica", "req")

    def __init__(self, pool: TokenLake, replica: Replica, req: Request,
                 copies: list[tuple[int, int]], left: int) -> None:
        self.pool, self.replica, self.req, self.copies, self.left = (pool, replica, req,
                                                                     copies, left)

    def __call__(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.pool.land(self.replica, self.req, self.copies)


class _Waker:
    """Told when a borrower gives back a replica's entry (its blocks may now be available)
    or when another replica cached or evicted a segment (what its waiting requests match has
    changed, so only then): the replica's window in flight is cut and it plans again, as it
    would after every step without fast-forward."""

    __slots__ = ("only_if_waiting", "replica")

    def __init__(self, replica: Replica, only_if_waiting: bool) -> None:
        self.replica = replica
        self.only_if_waiting = only_if_waiting

    def __call__(self) -> None:
        replica = self.replica
        if self.only_if_waiting and not replica.waiting:
            return
        replica.interrupt()
        replica.wake()
