"""Mooncake's cache-centric serving (Qin et al., arXiv 2407.00079): a KV store in host memory
shared by every prefill instance, and a conductor that routes each request by where its
prefix is cached and by load.

TokenLake (arXiv 2508.17219) calls this its second baseline, "cache-centric PD
disaggregation". What is modelled, from the Mooncake paper's sections 3-6:

- **the store** (Mooncake Store, section 3): every prefix block a prefill instance computes
  is written to a KV store in the cluster's CPU DRAM, so it outlives its eviction from the
  GPU; the store evicts least recently used blocks once its capacity (``store_bytes``) is
  full. A block counts as stored once the request that computes it has computed past it
  (``Request.num_computed_tokens``; the write-back's own delay is not modelled, in the
  store's favour);
- **the fetch**: a request at a prefill instance whose local GPU cache holds fewer leading
  blocks than the store loads the missing ones from host memory into that instance's cache
  before it queues (state ``RELOADING``), over the instance's host link (the transfer
  service's ``host_endpoint``: the GPU's PCIe), then prefills only the rest;
- **the conductor** (section 6, Algorithm 1: each instance's estimated TTFT is its queue plus
  the prefill of what its prefix cache does not cover, plus the transfer of what it loads
  from elsewhere; the smallest wins): in tokens, outstanding tokens plus the prompt tokens
  neither cache covers plus ``store_token_cost`` x the tokens it loads from the store (the
  time of loading one token's KV over the host link over the time of prefilling one token,
  given by the caller from the model and the GPU).

Simplifications: the store's DRAM is one pool read at each instance's PCIe bandwidth
(Mooncake stripes it over the nodes and reads remote parts over RDMA, not slower per GPU on
one node); layer-wise overlap of the load with the prefill is not modelled (against
Mooncake); the early-rejection policy is not run (every request is served).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.policies.routing import register_router
from fleetsim.serving.contract import ClusterView
from fleetsim.serving.request import RELOADING, Request
from fleetsim.serving.transfers import gpu_dma_endpoint, host_endpoint


@register_router("mooncake")
@dataclass(slots=True)
class Mooncake:
    """The conductor (a router) and the store it routes by (``attach``)."""

    store_bytes: float = 0.0
    """Capacity of the host-memory KV store over the whole cluster, bytes (0: no store, the
    conductor then routes by the GPU caches alone)."""
    store_token_cost: float = 0.0
    """Cost of loading one token's KV from the store, in prefill tokens (the conductor's
    transfer term)."""
    counts: dict[str, float] = field(default_factory=dict)
    """Counters for the run's summary (store reads, segments, bytes, wait)."""
    _store: OrderedDict[int, None] = field(default_factory=OrderedDict, repr=False)
    # hash id -> None, least recently used first
    _pending: dict[int, tuple[Request, int]] = field(default_factory=dict, repr=False)
    # hash id -> (the request computing it, its position): stored once computed
    _capacity: int = field(default=0, repr=False)  # segments the store holds
    _hbt: int = field(default=0, repr=False)
    _kv_bytes_per_token: float = field(default=0.0, repr=False)
    _transfers: Any = field(default=None, repr=False)
    _start_s: dict[int, float] = field(default_factory=dict, repr=False)
    # request id -> when its load started

    def __post_init__(self) -> None:
        if not self.store_bytes >= 0:
            raise ValueError(f"store_bytes must be >= 0 (0: no store), got {self.store_bytes}")
        if not self.store_token_cost >= 0:
            raise ValueError(f"store_token_cost must be >= 0, got {self.store_token_cost}")
        self.counts = {"num_store_reads": 0, "num_store_segments": 0, "store_read_bytes": 0.0,
                       "store_wait_s": 0.0, "num_store_evictions": 0}

    # ---- wiring ----------------------------------------------------------------------
    def attach(self, cluster: Any) -> None:
        """Give every prefill (or mixed) replica the store's fetch; size the store."""
        placement = cluster.kv_placement
        self._transfers = cluster.transfers
        self._kv_bytes_per_token = placement.kv_bytes_per_token
        for view in cluster.views:
            if view.role == "decode":
                continue
            replica = placement.replicas[view.replica_id]
            self._hbt = replica.kv.hash_block_tokens or 0
            if self.store_bytes > 0:
                if replica.host is None:  # bad input, met when the cluster is wired
                    raise FleetsimInputError(
                        "cluster.router.args.store_bytes", self.store_bytes,
                        "the mooncake store is read over each prefill replica's host link: "
                        "set engine.swap_space_gib > 0, or store_bytes = 0 for no store")
                replica.prefix_fetch = self._fetch
        if self._hbt:
            self._capacity = int(self.store_bytes // (self._hbt * self._kv_bytes_per_token))

    def report(self) -> dict[str, float]:
        n = self.counts["num_store_reads"]
        return {**self.counts, "num_store_segments_held": len(self._store),
                "mean_store_wait_s": self.counts["store_wait_s"] / n if n else 0.0}

    # ---- the store ---------------------------------------------------------------------
    def _stored(self, h: int) -> bool:
        """Whether block ``h`` is in the store now (a computed pending block enters it)."""
        store = self._store
        if h in store:
            store.move_to_end(h)
            return True
        pending = self._pending.get(h)
        if pending is None:
            return False
        req, j = pending
        if req.num_computed_tokens < (j + 1) * self._hbt:
            return False
        del self._pending[h]
        store[h] = None
        return True

    def num_stored(self, req: Request) -> int:
        """Leading blocks of ``req``'s cacheable prompt the store holds (at least one prompt
        token is left to compute, as the GPU cache leaves one)."""
        if not self._capacity or not self._hbt:
            return 0
        limit = min(len(req.hash_ids), (req.num_prompt_tokens - 1) // self._hbt)
        m = 0
        while m < limit and self._stored(req.hash_ids[m]):
            m += 1
        store = self._store
        if len(store) <= self._capacity:
            return m
        while len(store) > self._capacity:  # least recently used first: never this match's
            store.popitem(last=False)       # blocks unless it is longer than the store
            self.counts["num_store_evictions"] += 1
        n = 0
        while n < m and req.hash_ids[n] in store:
            n += 1
        return n

    def _will_compute(self, req: Request) -> None:
        if not self._capacity:
            return
        store, pending = self._store, self._pending
        for j, h in enumerate(req.hash_ids):
            if h not in store and h not in pending:
                pending[h] = (req, j)

    # ---- the conductor -----------------------------------------------------------------
    def route(self, view: ClusterView, req: Request, now_s: float) -> int:
        """The instance with the smallest estimated work before ``req``'s first token."""
        stored = self.num_stored(req)
        hbt, cost = self._hbt, self.store_token_cost
        best, best_cost = 0, None
        for i, r in enumerate(view.replicas):
            local = r.kv.num_matched_entries(req)
            loaded = max(0, stored - local)
            uncovered = req.num_prompt_tokens - (local + loaded) * hbt
            c = r.load_tokens + uncovered + cost * loaded * hbt
            if best_cost is None or c < best_cost:
                best, best_cost = i, c
        self._will_compute(req)
        return best

    # ---- a request arrives at a prefill instance ---------------------------------------
    def _fetch(self, replica: Any, req: Request) -> bool:
        """Load from the store what ``req``'s local cache lacks, then queue it (True), or
        nothing to load (False: it queues now)."""
        kv = replica.kv
        stored = self.num_stored(req)
        local = kv.prefix.num_leading(req.hash_ids, stored) if stored else 0
        if stored <= local:
            return False
        num_bytes = (stored - local) * self._hbt * self._kv_bytes_per_token
        rid = replica.replica_id
        req.state = RELOADING
        replica.adopt(req)
        self._start_s[req.id] = replica.sim.now_s
        self.counts["num_store_reads"] += 1
        self.counts["num_store_segments"] += stored - local
        self.counts["store_read_bytes"] += num_bytes
        hash_ids = req.hash_ids[:stored]

        def land() -> None:
            replica.interrupt()
            kv.install(hash_ids)
            self.counts["store_wait_s"] += replica.sim.now_s - self._start_s.pop(req.id)
            replica.queue_arrived(req)

        self._transfers.start(host_endpoint(rid), gpu_dma_endpoint(rid), num_bytes, land,
                              client="store_read")
        return True
