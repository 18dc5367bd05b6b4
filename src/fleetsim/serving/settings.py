"""What building a cluster takes, as two values: the engine settings every replica shares
(``EngineSettings``) and the plug-ins that decide (``PlugIns``).

``build_cluster`` (``cluster.py``) is the one place that turns them into replicas; ``run``,
the one-replica driver, RL generation, the agentic rollout and the live engine all go
through it, so a new engine setting is added here and there, not at every caller.
``fleetsim.run.engine_settings`` maps a ``SimConfig`` onto ``EngineSettings``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fleetsim.serving.contract import MakeBatchPolicy, Router
from fleetsim.serving.kv_keep import KVRetention
from fleetsim.serving.prefix_cache import EvictionKey
from fleetsim.serving.request import Request
from fleetsim.serving.speculative import Emission


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The engine settings of every replica of a cluster, and how a run steps them."""

    block_size: int
    """Tokens per KV block."""
    max_batched_tokens: int
    """Token budget of one step."""
    max_running: int
    """Running requests a replica holds at most."""
    enable_prefix_caching: bool = True
    """Reuse cached prefix blocks across requests."""
    fast_forward: bool = True
    """Advance decode-only stretches in one event (``window.py``); same results."""
    debug: bool = False
    """Check the engine's invariants after every step."""
    track_itl: bool = False
    """Record inter-token gaps (``itl.py``)."""
    kv_bytes_per_token: float = 0.0
    """KV bytes of one token over all layers, unsharded (``ModelSpec.kv_bytes_per_token``):
    what a P/D handoff, a swap or a migration moves per token."""
    link_latency_s: float = 0.0
    """Setup latency of one transfer between replicas."""
    frontend_overhead_s: float = 0.0
    """Client-to-engine time of each request (``Cluster.submit_at``)."""
    kv_retention: KVRetention | None = None
    """How mixed replicas keep a finished call's KV for its follow-up (None: they don't)."""
    until_s: float = math.inf
    """Simulated time a run stops at (replicas cut their windows there)."""
    timeline: tuple[float, float] | None = None
    """(origin, bin width) of the time series, seconds (None: ``simulate`` derives it from
    the workload; replicas built directly then keep no bins)."""
    speculative: Emission | None = None
    """Speculative decoding's emission schedule and KV lookahead (``speculative.py``; None:
    one token per decode step)."""
    windows_stop_at_arrivals: bool = True
    """A lone replica stops fast-forward windows at the next arrival instead of cutting
    them back when it comes: same results, less work."""

    def __post_init__(self) -> None:
        for name in ("block_size", "max_batched_tokens", "max_running"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("kv_bytes_per_token", "link_latency_s", "frontend_overhead_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


def _default_rng() -> np.random.Generator:
    return np.random.default_rng(0)


@dataclass(frozen=True, slots=True, kw_only=True)
class PlugIns:
    """The decisions a cluster delegates (``contract.py``), and the routing stream."""

    make_batch_policy: MakeBatchPolicy
    """Builds one batching policy per replica."""
    order_key: Callable[[Request, float], tuple]
    """The queues' ordering key."""
    router: Router
    """Routes each arrival to an entry (mixed or prefill) replica."""
    decode_router: Router | None = None
    """Routes a prefilled request to a decode replica (P/D clusters)."""
    eviction_key: EvictionKey | None = None
    """The prefix caches' eviction policy (None: LRU)."""
    rng: np.random.Generator = field(default_factory=_default_rng)
    """The routing random stream."""
