"""The gateway's backends as fleetsim's routers see them, with their health.

A ``BackendView`` has the members the routers of ``policies/routing.py`` read of a replica
(``replica_id``, ``load_tokens``, ``num_matched_entries``, ``hash_block_tokens``,
``num_kv_blocks``, ``running``, ``waiting``, ``kv``), tracked from the live streams: a request
counts its prompt tokens until its first token arrives, then one token while it streams
(the engine's definition of load). Prefix matches come from the chained block hashes of the
prompts routed to the backend (kept in an LRU of bounded size, as SGLang's router keeps an
approximate radix tree per worker).

Health is passive (Envoy's outlier detection): a connection error, a 5xx or 429, or a stream
that breaks ejects the backend for 0.5 s, doubling with each consecutive failure up to 30 s;
a success resets it. It is also active (Envoy's health checking): the gateway asks each
backend's ``/health`` every few seconds, and a backend that answers 5xx or not at all is out
until it answers again (a 404, a server without ``/health``, counts as up). Routers see the
backends in and not ejected (all of them when none is left).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetsim.serving.request import Request

EJECT_BASE_S = 0.5
EJECT_MAX_S = 30.0
DEFAULT_PREFIX_ENTRIES = 65536
"""Prefix-hash entries remembered per backend (about a million tokens at 16 per block)."""
UNKNOWN_KV_BLOCKS = 2**40
"""A real backend's KV size is unknown to the gateway: no request is too big for it."""


class BackendView:
    """One backend: where it is, its load, its remembered prefixes and its health."""

    def __init__(self, replica_id: int, url: str, *, hash_block_tokens: int,
                 max_prefix_entries: int = DEFAULT_PREFIX_ENTRIES) -> None:
        self.replica_id = replica_id
        self.url = url.rstrip("/")
        self.hash_block_tokens = hash_block_tokens
        self.num_kv_blocks = UNKNOWN_KV_BLOCKS
        self.load_tokens = 0
        self.running: list[Request] = []
        """Requests streaming tokens from this backend."""
        self.waiting: list[Request] = []
        """Requests sent here whose first token has not come yet."""
        self.num_failures = 0
        """Consecutive failures."""
        self.health_ok = True
        """The last active health check's verdict (True before the first)."""
        self.ejected_until_s = 0.0
        self.num_requests = 0
        self._prefixes: OrderedDict[int, None] = OrderedDict()
        self._max_prefix_entries = max_prefix_entries

    @property
    def kv(self) -> BackendView:
        """The prefix-cache questions (``routing.py`` asks them of ``replica.kv``)."""
        return self

    def num_matched_entries(self, req: Request) -> int:
        """Leading hash blocks of ``req``'s prompt that were routed here before (and are
        still remembered)."""
        n, known = 0, self._prefixes
        for h in req.hash_ids:
            if h not in known:
                break
            n += 1
        return n

    def remember(self, hash_ids: Sequence[int]) -> None:
        known = self._prefixes
        for h in hash_ids:
            known[h] = None
            known.move_to_end(h)
        while len(known) > self._max_prefix_entries:
            known.popitem(last=False)

    # ---- a request's life here (load as the engine counts it) ---------------------
    def dispatched(self, req: Request) -> None:
        self.num_requests += 1
        self.waiting.append(req)
        self.load_tokens += req.num_prompt_tokens

    def first_token(self, req: Request) -> None:
        self.waiting.remove(req)
        self.running.append(req)
        self.load_tokens += 1 - req.num_prompt_tokens

    def done(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
            self.load_tokens -= 1
        elif req in self.waiting:
            self.waiting.remove(req)
            self.load_tokens -= req.num_prompt_tokens

    # ---- health -------------------------------------------------------------------
    def healthy(self, now_s: float) -> bool:
        return self.health_ok and self.ejected_until_s <= now_s

    def failed(self, now_s: float) -> None:
        self.num_failures += 1
        self.ejected_until_s = now_s + min(EJECT_MAX_S,
                                           EJECT_BASE_S * 2 ** (self.num_failures - 1))

    def succeeded(self) -> None:
        self.num_failures = 0
        self.ejected_until_s = 0.0


@dataclass(slots=True)
class GatewayView:
    """What a router reads (``ClusterView``): the backends it may choose from, an RNG."""

    replicas: Sequence[BackendView]
    rng: np.random.Generator
