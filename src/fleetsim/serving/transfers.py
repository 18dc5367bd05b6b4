"""The transfer service: bytes moved between endpoints over shared links, with contention.

Every mover of bytes is a client: the P/D handoff and migration (KV from one replica to
another), swapping to and from a replica's host memory, and later weight synchronisation.
An endpoint is an int key with one egress and one ingress bandwidth: a replica's KV link
(its TP GPUs' NICs, or NVLink, together) is its ``replica_id``; its host memory, reached over
PCIe, is ``host_endpoint(replica_id)`` (swaps run between it and ``gpu_dma_endpoint``).
Active transfers share the links fairly: a transfer moves at ``min(egress_bw / transfers
leaving its source, ingress_bw / transfers entering its destination)``, recomputed whenever a
transfer starts or ends (processor sharing, the usual fluid model of RDMA and DMA flows). A
transfer first waits its latency (setup and round trip), then its bytes flow; ``on_done`` is
called once, when the last byte has arrived.

Event kinds (same-time order, see ``core.simulator``): ``TRANSFER_START`` (20) after
arrivals, ``TRANSFER_CHECK`` (30) before step ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from fleetsim.core.simulator import Simulator

TRANSFER_START: Final = 20  # a transfer's latency has passed: its bytes start flowing
TRANSFER_CHECK: Final = 30  # a transfer may have finished


def host_endpoint(replica_id: int) -> int:
    """The endpoint of ``replica_id``'s host memory (swap space): its bandwidths are the
    replica's PCIe link (egress: host to GPU, ingress: GPU to host)."""
    return -1 - 2 * replica_id


def gpu_dma_endpoint(replica_id: int) -> int:
    """The GPU side of ``replica_id``'s swaps (unlimited: the PCIe link is the bottleneck)."""
    return -2 - 2 * replica_id


class _Transfer:
    __slots__ = ("dst", "num_bytes_left", "on_done", "rate", "src")

    def __init__(self, src: int, dst: int, num_bytes: float, on_done: Callable[[], None]):
        self.src = src
        self.dst = dst
        self.num_bytes_left = float(num_bytes)
        self.on_done = on_done
        self.rate = 0.0


class TransferService:
    """Fair-shared links between endpoints; ``start`` a transfer, get ``on_done`` called."""

    def __init__(self, sim: Simulator, *, latency_s: float = 0.0) -> None:
        self.sim = sim
        self.egress_bw: dict[int, float] = {}  # endpoint -> bytes/s
        self.ingress_bw: dict[int, float] = {}
        self.latency_s = latency_s  # default setup latency of a transfer
        self._active: list[_Transfer] = []
        self._updated_s = 0.0
        self._version = 0  # invalidates completion checks scheduled before the last change
        self.num_transfers = 0
        self.num_bytes = 0.0
        self.num_bytes_by_client: dict[str, float] = {}  # "pd_handoff", "swap_out", ...
        sim.on(TRANSFER_START, self._on_start, "transfer_start")
        sim.on(TRANSFER_CHECK, self._on_check, "transfer_check")

    def add_endpoint(self, endpoint: int, egress_bw_bytes_per_s: float,
                     ingress_bw_bytes_per_s: float) -> None:
        """Declare an endpoint's link bandwidths (bytes/s, one direction each)."""
        if endpoint in self.egress_bw:
            raise ValueError(f"transfer endpoint {endpoint} declared twice")
        self.egress_bw[endpoint] = egress_bw_bytes_per_s
        self.ingress_bw[endpoint] = ingress_bw_bytes_per_s

    def start(self, src: int, dst: int, num_bytes: float, on_done: Callable[[], None], *,
              client: str = "", latency_s: float | None = None) -> None:
        """Move ``num_bytes`` from endpoint ``src`` to ``dst``; ``on_done()`` once they have
        all arrived. ``client`` names who moves them (bytes are counted per client)."""
        if src not in self.egress_bw or dst not in self.ingress_bw:
            raise ValueError(f"transfer between undeclared endpoints {src} -> {dst}")
        self.num_transfers += 1
        self.num_bytes += num_bytes
        by = self.num_bytes_by_client
        by[client] = by.get(client, 0.0) + num_bytes
        delay = self.latency_s if latency_s is None else latency_s
        self.sim.schedule(self.sim.now_s + delay, TRANSFER_START,
                          _Transfer(src, dst, num_bytes, on_done))

    def _on_start(self, transfer: _Transfer) -> None:
        self._advance()
        self._active.append(transfer)
        self._reschedule()

    def _on_check(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        done = [t for t in self._active if t.num_bytes_left <= t.rate * 1e-9]  # within 1 ns
        if done:
            self._active = [t for t in self._active if t not in done]
        self._reschedule()
        for t in done:
            t.on_done()

    def _advance(self) -> None:
        now = self.sim.now_s
        dt = now - self._updated_s
        if dt > 0:
            for t in self._active:
                t.num_bytes_left -= t.rate * dt
        self._updated_s = now

    def _reschedule(self) -> None:
        self._version += 1
        if not self._active:
            return
        num_out: dict[int, int] = {}
        num_in: dict[int, int] = {}
        for t in self._active:
            num_out[t.src] = num_out.get(t.src, 0) + 1
            num_in[t.dst] = num_in.get(t.dst, 0) + 1
        next_s = math.inf
        for t in self._active:
            t.rate = min(self.egress_bw[t.src] / num_out[t.src],
                         self.ingress_bw[t.dst] / num_in[t.dst])
            next_s = min(next_s, max(t.num_bytes_left, 0.0) / t.rate)
        self.sim.schedule(self.sim.now_s + next_s, TRANSFER_CHECK, self._version)
