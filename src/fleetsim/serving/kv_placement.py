"""KV placement between replicas: the one service that puts prefix KV into a replica from
outside it, over the transfer service, so that no policy or driver reaches into a replica.

Two verbs, each a transfer with one callback (``transfers.py``):

- ``copy_prefix``: copy a run of prefix entries cached at one replica into another's cache,
  installed as unreferenced entries when the bytes land (``KVCache.install``; Heddle moves a
  trajectory's context this way during its tool wait, arXiv 2603.28101);
- a **prefix pool** (``join_pool``): replicas whose caches form one pool ask a pool policy,
  for each arriving request, what to bring in first (``PoolFetch``: bytes from each holder,
  and segments to cache here on landing); the request waits (``RELOADING``) until the last
  transfer lands, then queues (TokenLake's pool reads, arXiv 2508.17219). The policy decides;
  this service moves, installs and queues.

Either way the receiving replica's window in flight is cut first (``interrupt``), so its
state is exact when the KV lands, and it is woken to plan with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.ports import ReplicaPort
from fleetsim.serving.request import RELOADING, Request
from fleetsim.serving.transfers import TransferService


class PlacementPort(ReplicaPort, Protocol):
    """What placement may do with a replica (``Replica`` implements it)."""

    @property
    def waiting(self) -> Sequence[Request]: ...
    prefix_fetch: Callable[[PlacementPort, Request], bool] | None
    def queue_arrived(self, req: Request) -> None: ...


@dataclass(frozen=True, slots=True)
class PoolFetch:
    """What an arriving request brings in before it queues (a pool policy's decision)."""

    bytes_by_source: tuple[tuple[int, float], ...]
    """(holder replica id, bytes it sends), one transfer each, started in this order."""
    copies: tuple[tuple[int, int], ...] = ()
    """(position in the request's prefix, hash id) of segments to cache here on landing."""


class PoolPolicy(Protocol):
    """Decides what a pooled replica's arriving request reads from the others."""

    def plan_fetch(self, kv: KVCache, replica_id: int, req: Request,
                   now_s: float) -> PoolFetch | None:
        """What ``req``, arriving at ``replica_id`` (its cache ``kv``), brings in first; None
        to queue it at once."""

    def landed(self, replica_id: int, req: Request, num_copied: int, num_without_room: int,
               now_s: float) -> None:
        """Everything ``req`` fetched has landed at ``now_s``: ``num_copied`` segments were
        cached here, ``num_without_room`` found no free block."""


class KVPlacement:
    """Copies and installs prefix KV between the replicas of one cluster."""

    def __init__(self, replicas: Sequence[PlacementPort], transfers: TransferService,
                 kv_bytes_per_token: float) -> None:
        self.replicas = replicas  # by replica id
        self.transfers = transfers
        self.kv_bytes_per_token = kv_bytes_per_token
        self._pool: PoolPolicy | None = None

    # ---- copy a prefix run -----------------------------------------------------------
    def num_cached(self, replica_id: int, hash_ids: tuple[int, ...]) -> int:
        """How many leading entries of ``hash_ids`` replica ``replica_id`` caches now."""
        return self.replicas[replica_id].kv.prefix.num_leading(hash_ids, len(hash_ids))

    def copy_prefix(self, src: int, dst: int, hash_ids: tuple[int, ...],
                    on_done: Callable[[int, float], None], *,
                    client: str = "kv_migrate") -> None:
        """Copy the entries ``hash_ids`` (a prefix run cached at ``src``) to ``dst``; when
        they land, cache there as many leading ones as its available blocks hold and call
        ``on_done(num_cached, num_bytes)`` (``hash_block_tokens`` tokens of KV per entry
        moved)."""
        tokens_per_entry = self.replicas[dst].kv.hash_block_tokens
        if tokens_per_entry is None:
            raise ValueError(f"copy_prefix to replica {dst}: its cache has no hash blocks "
                             f"(the workload has no hash_ids)")
        num_bytes = self.kv_bytes_per_token * len(hash_ids) * tokens_per_entry

        def land() -> None:
            replica = self.replicas[dst]
            replica.interrupt()
            installed = replica.kv.install(hash_ids)
            replica.wake()
            on_done(installed, num_bytes)

        self.transfers.start(src, dst, num_bytes, land, client=client)

    # ---- a prefix pool ---------------------------------------------------------------
    def join_pool(self, replica_ids: Sequence[int], policy: PoolPolicy) -> None:
        """Join these replicas' prefix caches into one pool (``PrefixCache.join_pool``):
        ``policy`` decides what each arriving request reads from the others first."""
        members = [self.replicas[i] for i in replica_ids]
        caches = [r.kv.prefix for r in members]
        self._pool = policy
        for replica in members:
            replica.kv.prefix.join_pool(caches, _Waker(replica, False), _Waker(replica, True))
            replica.prefix_fetch = self._fetch

    def _fetch(self, replica: PlacementPort, req: Request) -> bool:
        """``req`` arrives at pooled ``replica``: start what the policy says it fetches and
        take it until that lands (True), or let it queue now (False)."""
        policy = self._pool
        assert policy is not None
        plan = policy.plan_fetch(replica.kv, replica.replica_id, req, replica.sim.now_s)
        if plan is None:
            return False
        req.state = RELOADING
        replica.adopt(req)
        landing = _Landing(self, replica, req, plan.copies, len(plan.bytes_by_source))
        rid = replica.replica_id
        for src, num_bytes in plan.bytes_by_source:
            self.transfers.start(src, rid, num_bytes, landing, client="pool_read")
        return True

    def _land(self, replica: PlacementPort, req: Request,
              copies: tuple[tuple[int, int], ...]) -> None:
        """Every transfer for ``req`` is done: segments to copy that still have room become
        entries here, and ``req`` is queued."""
        # An arrival cuts the window in flight (as ``Replica.submit`` does); so do the blocks
        # a copy takes.
        replica.interrupt()
        kv = replica.kv
        cache, per = kv.prefix, kv.blocks_per_entry
        num_copied = num_without_room = 0
        for j, h in copies:
            if h in cache.entries or h in cache.borrowed or cache.holder(h) is None:
                continue  # cached or borrowed here meanwhile, or gone from the pool
            if kv.num_available_blocks < per:
                num_without_room += 1
                continue
            kv.take_blocks(per)
            cache.add_copy(h, j)
            num_copied += 1
        assert self._pool is not None
        self._pool.landed(replica.replica_id, req, num_copied, num_without_room,
                          replica.sim.now_s)
        replica.queue_arrived(req)


class _Landing:
    """Callback of a request's pool transfers; the last one lands it."""

    __slots__ = ("copies", "left", "placement", "replica", "req")

    def __init__(self, placement: KVPlacement, replica: PlacementPort, req: Request,
                 copies: tuple[tuple[int, int], ...], left: int) -> None:
        self.placement, self.replica, self.req = placement, replica, req
        self.copies, self.left = copies, left

    def __call__(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.placement._land(self.replica, self.req, self.copies)


class _Waker:
    """Told when a borrower gives back a replica's entry (its blocks may now be available)
    or when another replica cached or evicted a segment (what its waiting requests match has
    changed, so only then): the replica's window in flight is cut and it plans again, as it
    would after every step without fast-forward."""

    __slots__ = ("only_if_waiting", "replica")

    def __init__(self, replica: PlacementPort, only_if_waiting: bool) -> None:
        self.replica = replica
        self.only_if_waiting = only_if_waiting

    def __call__(self) -> None:
        replica = self.replica
        if self.only_if_waiting and not replica.waiting:
            return
        replica.interrupt()
        replica.wake()
