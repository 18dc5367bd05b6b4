"""``[elastic]``: GPUs that join and leave by a schedule, and a deployment planner that re-sizes
the pools while the cluster serves (docs/elastic.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetsim.registry import PolicySpec

LEAVE_RULES = ("drain", "requeue")
LOAD_SOURCES = ("host", "peer")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuChange:
    """One point of the join/leave schedule: from ``at_s`` on, ``pool`` has ``num_gpus``."""

    at_s: float
    """Simulated time of the change, seconds (>= 0)."""
    pool: str
    """Pool name (``cluster.pools[].name``; "default" for the ``hardware`` shorthand)."""
    num_gpus: int
    """GPUs the pool has from then on; a replica takes ``tp`` of them."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.at_s) and self.at_s >= 0):
            raise ValueError(f"at_s must be a time >= 0 s, got {self.at_s}")
        if self.num_gpus < 0:
            raise ValueError(f"num_gpus must be >= 0, got {self.num_gpus}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticConfig:
    """An elastic cluster: the GPUs each pool has over time, how a replica joins and leaves,
    and the planner that sizes the pools at monitoring points."""

    schedule: tuple[GpuChange, ...] = ()
    """GPU join/leave schedule (an autoscaling trace), e.g. [{at_s = 600, pool = "default",
    num_gpus = 4}]. Before its first point a pool has the GPUs of its ``num_replicas``.
    Without a planner every replica the GPUs hold serves in the pool's role."""
    leave_rule: str = "drain"
    """How a leaving replica's work ends: drain (it finishes what it holds, takes nothing
    new) | requeue (its requests go back to the router at once, KV dropped and recomputed)."""
    load_from: str = "host"
    """Where a joining replica loads its weights: host (PCIe, per GPU) | peer (a serving
    replica of its pool, over the KV link)."""
    startup_s: float = 0.0
    """Engine start after the weights are loaded (CUDA graphs, warm-up), seconds; measure
    it on your engine (vLLM and SGLang log it at start-up)."""
    monitor_interval_s: float = 30.0
    """Seconds between monitoring points, where the trigger is asked and the planner plans
    (Dynamo's planner adjustment interval)."""
    planner: PolicySpec | None = None
    """Deployment planner: static | sla | concurrency | evolve (a policy evolved by replaying
    each window) | pkg.mod:Class (None: the schedule alone decides)."""
    trigger: PolicySpec = field(default_factory=lambda: PolicySpec(name="always"))
    """When to plan: always | periodic ({every = k} monitoring points) | threshold."""
    plan_overhead_s: float = 0.0
    """The planner's compute time per plan, modelled (a simulator reads no clock): its
    plan takes effect this long after the monitoring point; reported as overhead."""

    def __post_init__(self) -> None:
        if self.leave_rule not in LEAVE_RULES:
            raise ValueError(f"leave_rule must be one of {', '.join(LEAVE_RULES)}, got "
                             f"{self.leave_rule!r}")
        if self.load_from not in LOAD_SOURCES:
            raise ValueError(f"load_from must be one of {', '.join(LOAD_SOURCES)}, got "
                             f"{self.load_from!r}")
        if not (math.isfinite(self.monitor_interval_s) and self.monitor_interval_s > 0):
            raise ValueError(f"monitor_interval_s must be > 0 seconds (e.g. 30), got "
                             f"{self.monitor_interval_s}")
        for name in ("startup_s", "plan_overhead_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0 seconds, got {value}")
        if self.plan_overhead_s >= self.monitor_interval_s:
            raise ValueError(f"plan_overhead_s ({self.plan_overhead_s}) must be shorter than "
                             f"monitor_interval_s ({self.monitor_interval_s}); plans would "
                             f"overlap")


def check_elastic(elastic: ElasticConfig, pools: Sequence[Any], programs: bool) -> None:
    """Cross-checks against the cluster's pools: the schedule names pools that exist, and at
    every point keeps a replica's GPUs for each stage (a mixed pool, or a prefill and a
    decode pool)."""
    if programs:
        raise ValueError("elastic: agent programs are not supported on an elastic cluster yet; "
                         "remove [elastic] or [programs]")
    by_name = {p.name: p for p in pools}
    gpus = {p.name: p.num_replicas * p.tp for p in pools}
    order = sorted(range(len(elastic.schedule)), key=lambda i: elastic.schedule[i].at_s)
    for i in order:
        change = elastic.schedule[i]
        where = f"elastic.schedule[{i}]"
        pool = by_name.get(change.pool)
        if pool is None:
            raise ValueError(f"{where}.pool: got {change.pool!r}; pools are "
                             f"{', '.join(sorted(by_name))}")
        gpus[change.pool] = change.num_gpus
        replicas = {name: gpus[name] // by_name[name].tp for name in gpus}
        roles = {by_name[name].role for name, n in replicas.items() if n > 0}
        if not ("mixed" in roles or {"prefill", "decode"} <= roles):
            raise ValueError(
                f"{where}.num_gpus: got {change.num_gpus}; at {change.at_s} s it leaves "
                f"{'no GPU' if not any(gpus.values()) else 'no replica of some stage'} to "
                f"serve on; keep at least one replica's GPUs (tp = {pool.tp}) in "
                f"{'a mixed pool' if pool.role == 'mixed' else 'a prefill and a decode pool'}")
