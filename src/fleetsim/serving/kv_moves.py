"""KV entering and leaving one replica: handoffs (P/D, migration) and swaps to host memory.

Every move goes through the transfer service and follows the request states of
``request.py``. The source keeps a moving request's blocks until its bytes have left; the
destination reserves blocks (and a running slot) before they start to arrive. The replica's
step planner sees none of this: a request in flight is in no queue it plans.

    handoff:  RUNNING -> HANDED_OFF at the source (blocks kept as a holding)
              -> INCOMING (queued at the destination until blocks can be reserved)
              -> IN_TRANSFER -> RUNNING at the destination; the source frees its holding
    swap:     RUNNING -> SWAPPING_OUT (GPU blocks kept, host blocks taken) -> SWAPPED
              -> SWAPPING_IN (fresh GPU blocks) -> RUNNING; host blocks freed
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from fleetsim.errors import PlanError
from fleetsim.serving.kv_cache import HostPool
from fleetsim.serving.ports import ReplicaPort
from fleetsim.serving.request import (
    HANDED_OFF,
    IN_TRANSFER,
    INCOMING,
    STATE_NAMES,
    SWAPPED,
    SWAPPING_IN,
    SWAPPING_OUT,
    Request,
)
from fleetsim.serving.transfers import TransferService, gpu_dma_endpoint, host_endpoint

Holding = tuple[int, tuple[int, ...], int]  # (private blocks, hash ids, cached entries)


class MovesPort(ReplicaPort, Protocol):
    """What the KV moves may do with their replica, and no more (``Replica`` implements it):
    read its id, clock, KV cache and batch; make its state exact and wake it; take a request
    in or let one go; put one whose KV landed into the batch or take one out of it; and pass
    a request that left on to the cluster."""

    @property
    def running(self) -> Sequence[Request]: ...
    @property
    def max_running_total(self) -> int: ...
    @property
    def moves(self) -> KVMoves: ...
    def forget(self, req: Request) -> None: ...
    def add_load_tokens(self, num_tokens: int) -> None: ...
    def join_running(self, req: Request) -> None: ...
    def leave_running(self, req: Request, verb: str) -> None: ...
    def pass_on(self, req: Request, dst: int | None) -> None: ...


class KVMoves:
    """The moves of one replica's KV: its incoming queue, its reservations, the holdings of
    requests that left, and its swapped requests."""

    def __init__(self, replica: MovesPort, transfers: TransferService | None,
                 host: HostPool | None, kv_bytes_per_token: float,
                 host_latency_s: float = 0.0) -> None:
        self.replica = replica
        self.host_latency_s = host_latency_s  # setup latency of each swap copy
        self.transfers = transfers
        self.host = host
        self.kv_bytes_per_token = kv_bytes_per_token
        self.incoming: deque[tuple[MovesPort, Request]] = deque()  # (source, request), FIFO
        self.swapped: list[Request] = []  # in host memory, in swap-out order
        # request_id -> blocks a handed-off request left here until its bytes are gone (the
        # request itself moves on: its counters describe its blocks at the destination).
        self.holdings: dict[int, Holding] = {}
        self.reserved: dict[int, Request] = {}  # KV on its way in: blocks reserved here
        self.swapping: dict[int, Request] = {}  # swaps in flight (they hold GPU blocks)
        self.num_reserved = 0

    def holds_blocks_for_others(self) -> bool:
        """Do moves in flight hold blocks (so an empty plan may wait for them)?"""
        return bool(self.holdings or self.reserved or self.swapping)

    def check_holdings(self) -> list[Holding]:
        """Blocks held outside the running batch, for the KV conservation check."""
        held = [(r.num_private_blocks, r.hash_ids, r.num_cached_entries)
                for r in [*self.reserved.values(), *self.swapping.values()]]
        return held + list(self.holdings.values())

    # ---- leaving: handoff ------------------------------------------------------------
    def hand_off(self, req: Request, dst: int | None) -> None:
        """``req`` (out of the running batch) leaves for replica ``dst`` (None: the cluster
        picks one); its blocks stay here until ``release_handoff``."""
        replica = self.replica
        replica.forget(req)
        req.state = HANDED_OFF
        req.handoff_s = replica.sim.now_s
        replica.add_load_tokens(-(req.num_tokens - req.num_computed_tokens))
        self.holdings[req.id] = (req.num_private_blocks, req.hash_ids, req.num_cached_entries)
        req.num_private_blocks = 0
        req.num_cached_entries = 0
        replica.pass_on(req, dst)

    def release_handoff(self, req: Request) -> None:
        """``req``'s KV has left: free its blocks here (it may unblock admission)."""
        replica = self.replica
        replica.interrupt()
        private, hash_ids, cached = self.holdings.pop(req.id)
        replica.kv.release_blocks(private, hash_ids, cached)
        replica.wake()

    # ---- arriving: handoff -----------------------------------------------------------
    def queue_incoming(self, src: MovesPort, req: Request) -> None:
        """``req`` (handed off by ``src``, which keeps its KV) is to move here: queue it
        until blocks and a running slot can be reserved, then start its transfer."""
        req.state = INCOMING
        self.incoming.append((src, req))
        self.start_incoming()

    def start_incoming(self) -> None:
        """Start the transfers of queued incoming requests, in order, while each fits."""
        incoming = self.incoming
        replica = self.replica
        while incoming and self._can_reserve(incoming[0][1].num_computed_tokens):
            src, req = incoming.popleft()
            self._reserve(req)
            num_bytes = self.kv_bytes_per_token * req.num_computed_tokens

            def done(src: MovesPort = src, req: Request = req) -> None:
                src.moves.release_handoff(req)
                req.kv_transfer_s = replica.sim.now_s - req.handoff_s
                del self.reserved[req.id]
                self.num_reserved -= 1
                replica.join_running(req)

            assert self.transfers is not None
            self.transfers.start(src.replica_id, replica.replica_id, num_bytes, done,
                                 client="kv_handoff")

    def _can_reserve(self, num_tokens: int) -> bool:
        """Could a request with ``num_tokens`` of KV (plus its next token) move in now?"""
        replica = self.replica
        replica.interrupt()
        kv = replica.kv
        return (len(replica.running) + self.num_reserved < replica.max_running_total
                and kv.num_blocks_for(num_tokens + 1) <= kv.num_available_blocks)

    def _reserve(self, req: Request) -> None:
        """Take the blocks ``req``'s transferred KV will fill (and its next token)."""
        replica = self.replica
        req.state = IN_TRANSFER
        replica.adopt(req)
        self.reserved[req.id] = req
        self.num_reserved += 1
        replica.kv.allocate(req, replica.kv.num_blocks_for(req.num_computed_tokens + 1))

    # ---- swap to host memory ---------------------------------------------------------
    def swap_out(self, req: Request) -> None:
        """Preempt by swap: copy ``req``'s KV to host memory (its GPU blocks stay held until
        the copy is done), then free them; it waits in ``swapped`` for a ``swap_in``."""
        replica, host, transfers = self.replica, self.host, self.transfers
        if host is None or transfers is None:
            raise PlanError(f"plan swaps out request {req.id}, but replica "
                            f"{replica.replica_id} has no host KV tier")
        num_blocks = replica.kv.num_blocks_for(req.num_computed_tokens)
        if not host.can_allocate(num_blocks):
            raise PlanError(f"plan swaps out request {req.id} ({num_blocks} blocks), host tier "
                            f"has {host.num_free_blocks} free")
        replica.leave_running(req, "swaps out")
        host.allocate(num_blocks)
        req.state = SWAPPING_OUT
        req.num_swaps += 1
        self.swapping[req.id] = req
        replica.add_load_tokens(-(req.num_tokens - req.num_computed_tokens))

        def done() -> None:
            replica.interrupt()
            del self.swapping[req.id]
            replica.kv.release(req)
            req.state = SWAPPED
            self.swapped.append(req)
            replica.wake()

        rid = replica.replica_id
        transfers.start(gpu_dma_endpoint(rid), host_endpoint(rid),
                        self.kv_bytes_per_token * req.num_computed_tokens, done,
                        client="swap_out", latency_s=self.host_latency_s)

    def swap_in(self, req: Request) -> None:
        """Bring a swapped request's KV back into fresh GPU blocks; it rejoins the running
        batch when the copy is done."""
        replica, host, transfers = self.replica, self.host, self.transfers
        if req.state != SWAPPED:
            raise PlanError(f"plan swaps in request {req.id}, which is "
                            f"{STATE_NAMES[req.state]}")
        assert host is not None and transfers is not None
        kv = replica.kv
        num_blocks = kv.num_blocks_for(req.num_computed_tokens)
        if num_blocks > kv.num_available_blocks:
            raise PlanError(f"plan swaps in request {req.id} ({num_blocks} blocks), "
                            f"{kv.num_available_blocks} available")
        self.swapped.remove(req)
        kv.allocate(req, num_blocks)  # its prefix comes back as private blocks
        req.state = SWAPPING_IN
        self.swapping[req.id] = req

        def done() -> None:
            replica.interrupt()
            del self.swapping[req.id]
            host.free(num_blocks)
            replica.join_running(req)

        rid = replica.replica_id
        transfers.start(host_endpoint(rid), gpu_dma_endpoint(rid),
                        self.kv_bytes_per_token * req.num_computed_tokens, done,
                        client="swap_in", latency_s=self.host_latency_s)

    def num_host_blocks(self) -> int:
        """Host blocks the swaps hold (swapped requests and copies in flight)."""
        kv = self.replica.kv
        return sum(kv.num_blocks_for(r.num_computed_tokens)
                   for r in [*self.swapped, *self.swapping.values()])

    def swaps_in_flight(self) -> bool:
        return bool(self.swapping)

    def check_states(self) -> None:
        """Debug: every request here is in the state its place says."""
        assert all(r.state == SWAPPED for r in self.swapped)
        assert all(r.state in (SWAPPING_OUT, SWAPPING_IN) for r in self.swapping.values())
        assert all(r.state == IN_TRANSFER for r in self.reserved.values())
        assert all(r.state == INCOMING for _, r in self.incoming)
