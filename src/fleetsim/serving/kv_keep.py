"""KV kept across a follow-up wait (an agent's tool call): pinned on the GPU for a
time-to-live, or offloaded to the host tier and reloaded when the follow-up arrives.

Continuum (arXiv 2511.02230) pins a finished call's KV in GPU memory for a time-to-live
while its tool runs, so that the program's next call skips its prefill and its queue; LMCache
and vLLM's CPU offloading keep it in host memory instead, and the next call pays a reload
over PCIe. Without either (``drop``, what vLLM and SGLang do), a finished request's full
prompt blocks stay only as evictable prefix-cache entries and its output blocks are freed.

The engine's side of it, on one replica. A request that expects a follow-up carries
``context_hash_ids``, the hash ids of its whole sequence's full blocks; its follow-up carries
``kv_from``, the id of that request. When the request finishes:

- ``keep``: its full blocks, outputs included, become prefix-cache entries (``promote_context``)
  held by a *kept* record instead of the request: pinned, so neither evicted nor available to
  others, until the follow-up is admitted here (its own reference then holds them while it
  runs) or the time-to-live ends; then they are ordinary evictable entries.
- ``offload``: the same entries are held while their bytes are copied to the host tier (GPU
  to host over the replica's PCIe link, through the transfer service); then they become
  evictable on the GPU, and the host copy lives for the time-to-live. When the follow-up
  arrives here, the entries the GPU has lost are reloaded into fresh blocks before it is
  queued (state ``RELOADING``); the reloaded entries are held for it as kept ones. A host tier
  without room leaves the entries evictable at once, uncopied; a GPU without room for the
  reload drops the host copy (the follow-up recomputes what the GPU lost); both are counted.

Invariants (asserted under ``debug`` and property-tested): blocks are conserved on the GPU
(held records are holders in ``KVCache.check``) and in the host tier; a kept record ends at
its time-to-live or at its use; nothing is held once the run has drained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from fleetsim.serving.kv_cache import HostPool, KVCache
from fleetsim.serving.ports import ReplicaPort
from fleetsim.serving.request import RELOADING, Request
from fleetsim.serving.transfers import TransferService, gpu_dma_endpoint, host_endpoint

KV_EXPIRE: Final = 35  # a kept record's time-to-live ends (after transfers, before step ends)
RETENTION_MODES: Final = ("keep", "offload")


class KeptPort(ReplicaPort, Protocol):
    """What kept KV may do with its replica, and no more (``Replica`` implements it): read
    its id, clock and KV cache; make its state exact and wake it; hold a follow-up while its
    parent's KV reloads, then queue it."""

    def queue_arrived(self, req: Request) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class KVRetention:
    """How a replica keeps the KV of a finished request that expects a follow-up."""

    mode: str
    """keep (pinned on the GPU) | offload (copied to the host tier, reloaded on use)."""
    ttl_s: float
    """Seconds a kept record (keep: the pinned blocks; offload: the host copy) lives unused."""

    def __post_init__(self) -> None:
        if self.mode not in RETENTION_MODES:
            raise ValueError(f"KV retention mode must be one of {RETENTION_MODES}, got "
                             f"{self.mode!r}")
        if not 0.0 <= self.ttl_s < float("inf"):
            raise ValueError(f"KV retention ttl_s must be finite and >= 0, got {self.ttl_s}")


class _Held:
    """Entries held for a follow-up on the GPU (a kept record)."""

    __slots__ = ("expires_s", "ids", "num_host_blocks", "used")

    def __init__(self, ids: tuple[int, ...], expires_s: float, num_host_blocks: int = 0
                 ) -> None:
        self.ids = ids  # the held entries' hash ids, all of them
        self.expires_s = expires_s  # inf while copying to the host (no time-to-live yet)
        self.num_host_blocks = num_host_blocks  # > 0 while its copy to the host runs
        self.used = False  # the follow-up was admitted while the copy ran


class KeptKV:
    """The KV one replica keeps for follow-ups (``retention``), and its counters."""

    # Every record on the GPU ends used or expired (num_kept == num_used + num_expired once
    # drained); every host copy is reloaded, found still on the GPU (unneeded), skipped for
    # want of GPU room, or expires (num_offloaded == the sum of those four).

    def __init__(self, replica: KeptPort, retention: KVRetention, host: HostPool | None,
                 transfers: TransferService | None, kv_bytes_per_token: float,
                 host_latency_s: float) -> None:
        if retention.mode == "offload" and (host is None or transfers is None):
            raise ValueError("KV retention offload needs a host tier (engine.swap_space_gib)")
        self.replica = replica
        self.retention = retention
        self.host = host
        self.transfers = transfers
        self.kv_bytes_per_token = kv_bytes_per_token
        self.host_latency_s = host_latency_s
        self.held: dict[int, _Held] = {}  # request id -> its kept entries on the GPU
        # request id -> (its entries' ids, host blocks, expiry) of a host copy
        self.hosted: dict[int, tuple[tuple[int, ...], int, float]] = {}
        # follow-up request id -> (it, its parent's id, entries' ids, head entries pinned,
        # private blocks being filled, host blocks) while its parent's KV reloads
        self.loading: dict[int, tuple[Request, int, tuple[int, ...], int, int, int]] = {}
        self.counts = {"num_kept": 0, "num_used": 0, "num_expired": 0, "num_offloaded": 0,
                       "num_offload_skipped": 0, "num_reloads": 0, "num_reloaded_tokens": 0,
                       "num_reload_skipped": 0, "num_reload_unneeded": 0,
                       "num_host_expired": 0}

    @property
    def kv(self) -> KVCache:
        return self.replica.kv

    # ---- a request that expects a follow-up finishes ---------------------------------
    def on_finish(self, req: Request, t: float) -> None:
        """``req`` finished at ``t`` (out of the batch, its blocks still held): keep its KV
        for the follow-up, or release it if nothing of it fills a hash block."""
        kv = self.kv
        n = kv.promote_context(req, req.context_hash_ids)
        ids = req.context_hash_ids[:n]
        kv.release_blocks(req.num_private_blocks, (), 0)  # the partial last block
        req.num_private_blocks = 0
        req.num_cached_entries = 0  # its references are the record's from now on
        if not n:
            return
        if self.retention.mode == "keep":
            self._hold(req.id, ids, t + self.retention.ttl_s)
            return
        num_blocks = n * kv.blocks_per_entry
        host = self.host
        assert host is not None
        if not host.can_allocate(num_blocks):
            self.counts["num_offload_skipped"] += 1
            kv.release_blocks(0, ids, n)
            return
        host.allocate(num_blocks)
        self.held[req.id] = _Held(ids, float("inf"), num_blocks)
        self._copy(gpu_dma_endpoint(self.replica.replica_id),
                   host_endpoint(self.replica.replica_id), n,
                   lambda: self._offloaded(req.id, num_blocks), "kv_offload")

    def _hold(self, rid: int, ids: tuple[int, ...], expires_s: float) -> None:
        self.held[rid] = _Held(ids, expires_s)
        self.counts["num_kept"] += 1
        sim = self.replica.sim
        sim.schedule(max(expires_s, sim.now_s), KV_EXPIRE, (self, rid, False))

    def _copy(self, src: int, dst: int, num_entries: int, done: object, client: str) -> None:
        assert self.transfers is not None
        num_bytes = self.kv_bytes_per_token * num_entries * (self.kv.hash_block_tokens or 0)
        self.transfers.start(src, dst, num_bytes, done,  # type: ignore[arg-type]
                             client=client, latency_s=self.host_latency_s)

    def _offloaded(self, rid: int, num_blocks: int) -> None:
        """The host copy of ``rid``'s entries is done: the GPU's become evictable."""
        replica = self.replica
        replica.interrupt()
        rec = self.held.pop(rid)
        self.kv.release_blocks(0, rec.ids, len(rec.ids))
        host = self.host
        assert host is not None
        if rec.used:  # the follow-up took the GPU copy meanwhile: the host one is not needed
            host.free(num_blocks)
        else:
            expires_s = replica.sim.now_s + self.retention.ttl_s
            self.hosted[rid] = (rec.ids, num_blocks, expires_s)
            replica.sim.schedule(expires_s, KV_EXPIRE, (self, rid, True))
            self.counts["num_offloaded"] += 1
        replica.wake()

    # ---- the follow-up ---------------------------------------------------------------
    def on_admit(self, req: Request) -> None:
        """``req`` was admitted (its own references now hold its prefix): the record it
        extends lets go."""
        rec = self.held.get(req.kv_from)  # type: ignore[arg-type]
        if rec is None:
            return
        if rec.num_host_blocks:  # still copying to the host
            rec.used = True
            return
        del self.held[req.kv_from]  # type: ignore[arg-type]
        self.kv.release_blocks(0, rec.ids, len(rec.ids))
        self.counts["num_used"] += 1

    def reload(self, req: Request) -> bool:
        """``req`` arrives here: if its parent's KV is in the host tier, start reloading what
        the GPU has lost of it and take ``req`` until that is done (returns True); the
        replica queues it then (``Replica.queue_arrived``)."""
        hosted = self.hosted.pop(req.kv_from, None)  # type: ignore[arg-type]
        if hosted is None:
            return False
        ids, num_host_blocks, _ = hosted
        host, kv = self.host, self.kv
        assert host is not None
        m = kv.prefix.num_leading(ids, len(ids))
        num_blocks = (len(ids) - m) * kv.blocks_per_entry
        if num_blocks == 0:  # the GPU still has it all: hold it for the follow-up
            host.free(num_host_blocks)
            self.counts["num_reload_unneeded"] += 1
            kv.prefix.pin(ids)
            self._hold(req.kv_from, ids, self.replica.sim.now_s + self.retention.ttl_s)  # type: ignore[arg-type]
            return False
        # Pinning the head takes its blocks out of the available pool too.
        head = kv.prefix.num_unreferenced(ids[:m]) * kv.blocks_per_entry
        if num_blocks + head > kv.num_available_blocks:
            host.free(num_host_blocks)
            self.counts["num_reload_skipped"] += 1
            return False
        kv.prefix.pin(ids[:m])  # the head the GPU still has must outlive the reload
        kv.take_blocks(num_blocks)
        req.state = RELOADING
        self.replica.adopt(req)
        self.loading[req.id] = (req, req.kv_from, ids, m, num_blocks,  # type: ignore[assignment]
                                num_host_blocks)
        self.counts["num_reloads"] += 1
        self.counts["num_reloaded_tokens"] += (len(ids) - m) * (kv.hash_block_tokens or 0)
        rid = self.replica.replica_id
        self._copy(host_endpoint(rid), gpu_dma_endpoint(rid), len(ids) - m,
                   lambda: self._reloaded(req.id, num_host_blocks), "kv_reload")
        return True

    def _reloaded(self, rid: int, num_host_blocks: int) -> None:
        """The reload for follow-up ``rid`` is done: its blocks become entries, held for it
        as kept ones, and it is queued."""
        replica = self.replica
        replica.interrupt()
        req, parent, ids, m, _, _ = self.loading.pop(rid)
        kv = self.kv
        prefix, per = kv.prefix, kv.blocks_per_entry
        for j in range(m, len(ids)):
            if not prefix.add(ids[j], j):
                kv.num_free_blocks += per  # cached again meanwhile: share it
        host = self.host
        assert host is not None
        host.free(num_host_blocks)
        self._hold(parent, ids, replica.sim.now_s + self.retention.ttl_s)
        replica.queue_arrived(req)

    # ---- time-to-live ----------------------------------------------------------------
    def expire(self, rid: int, on_host: bool) -> None:
        """A record's time-to-live may have ended now (a used one is gone already)."""
        now_s = self.replica.sim.now_s
        if on_host:
            hosted = self.hosted.get(rid)
            if hosted is None or hosted[2] != now_s:
                return
            del self.hosted[rid]
            assert self.host is not None
            self.host.free(hosted[1])
            self.counts["num_host_expired"] += 1
            return
        rec = self.held.get(rid)
        if rec is None or rec.expires_s != now_s:  # used, or held again since
            return
        replica = self.replica
        replica.interrupt()
        del self.held[rid]
        self.kv.release_blocks(0, rec.ids, len(rec.ids))
        self.counts["num_expired"] += 1
        replica.wake()

    # ---- questions -------------------------------------------------------------------
    def holds_blocks(self) -> bool:
        """Do records hold GPU blocks (so a plan that cannot admit may wait for them)?"""
        return bool(self.held or self.loading)

    def holdings(self) -> list[tuple[int, tuple[int, ...], int]]:
        """GPU holdings for the conservation check: (private blocks, ids, entries)."""
        out = [(0, rec.ids, len(rec.ids)) for rec in self.held.values()]
        out += [(num_blocks, ids, m) for _, _, ids, m, num_blocks, _ in self.loading.values()]
        return out

    def num_host_blocks(self) -> int:
        """Host blocks held by host copies, those being made and those being reloaded (the
        rest of the host tier is the swaps')."""
        return (sum(n for _, n, _ in self.hosted.values())
                + sum(rec.num_host_blocks for rec in self.held.values())
                + sum(load[5] for load in self.loading.values()))

    def check_states(self) -> None:
        assert all(req.state == RELOADING for req, *_ in self.loading.values())


def on_expire(payload: tuple[KeptKV, int, bool]) -> None:
    """Handler of ``KV_EXPIRE``."""
    kept, rid, on_host = payload
    kept.expire(rid, on_host)
