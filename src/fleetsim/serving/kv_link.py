"""KV-cache transfers between replicas over shared links, with contention.

Each replica has one egress and one ingress link (its TP GPUs' NICs, or NVLink, together).
Active transfers share them fairly: a transfer moves at
``min(egress_bw / transfers leaving its source, ingress_bw / transfers entering its
destination)``, recomputed whenever a transfer starts or ends (processor sharing, the
usual fluid model of RDMA flows). A transfer first waits ``latency_s`` (setup and round
trip), then its bytes flow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import IntEnum

from fleetsim.core.simulator import Simulator


class _Transfer:
    __slots__ = ("dst", "num_bytes_left", "on_done", "rate", "src")

    def __init__(self, src: int, dst: int, num_bytes: float, on_done: Callable[[], None]):
        self.src = src
        self.dst = dst
        self.num_bytes_left = float(num_bytes)
        self.on_done = on_done
        self.rate = 0.0


class KVLinkNetwork:
    """Fair-shared links between replicas; ``start`` a transfer, get ``on_done`` called."""

    def __init__(
        self,
        sim: Simulator,
        *,
        egress_bw_bytes_per_s: dict[int, float],
        ingress_bw_bytes_per_s: dict[int, float],
        latency_s: float,
        start_kind: IntEnum,
        check_kind: IntEnum,
    ) -> None:
        self.sim = sim
        self.egress_bw = egress_bw_bytes_per_s  # replica_id -> bytes/s
        self.ingress_bw = ingress_bw_bytes_per_s
        self.latency_s = latency_s
        self._start_kind = start_kind
        self._check_kind = check_kind
        self._active: list[_Transfer] = []
        self._updated_s = 0.0
        self._version = 0  # invalidates completion checks scheduled before the last change
        self.num_transfers = 0
        self.num_bytes = 0.0
        sim.on(start_kind, self._on_start)
        sim.on(check_kind, self._on_check)

    def start(self, src: int, dst: int, num_bytes: float, on_done: Callable[[], None]) -> None:
        """Move ``num_bytes`` from replica ``src`` to ``dst``; ``on_done()`` when all arrived."""
        self.num_transfers += 1
        self.num_bytes += num_bytes
        self.sim.schedule(self.sim.now_s + self.latency_s, self._start_kind,
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
        self.sim.schedule(self.sim.now_s + next_s, self._check_kind, self._version)
