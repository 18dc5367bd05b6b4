"""The part of a replica every KV service may touch (``Replica`` implements it): its id, clock
and KV cache; make its state exact (``interrupt``) and wake it; take a request in. Each
service's own port (``MovesPort``, ``KeptPort``, ``PlacementPort``) adds only what it calls,
so no service holds the whole replica."""

from __future__ import annotations

from typing import Protocol

from fleetsim.core.simulator import Simulator
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.request import Request


class ReplicaPort(Protocol):
    @property
    def replica_id(self) -> int: ...
    @property
    def sim(self) -> Simulator: ...
    @property
    def kv(self) -> KVCache: ...
    def interrupt(self) -> None: ...
    def wake(self) -> None: ...
    def adopt(self, req: Request) -> None: ...
