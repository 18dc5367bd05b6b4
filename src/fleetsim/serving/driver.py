"""Drive one replica through a workload (the one-pool, one-replica case of a cluster)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.cluster import OnlyReplica, PoolSetup, ProgressFn, simulate_cluster
from fleetsim.serving.contract import BatchPolicy
from fleetsim.serving.recorder import Records
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import Request
from fleetsim.workloads.workload import Workload

__all__ = ["ProgressFn", "simulate_replica"]


def simulate_replica(
    workload: Workload,
    *,
    step_model: StepTimeModel,
    num_kv_blocks: int,
    block_size: int,
    batch_policy: BatchPolicy,
    order_key: Callable[[Request, float], tuple],
    max_batched_tokens: int,
    max_running: int,
    enable_prefix_caching: bool = True,
    fast_forward: bool = True,
    debug: bool = False,
    until_s: float = math.inf,
    progress: ProgressFn | None = None,
    windows_stop_at_arrivals: bool = True,
    timeline: tuple[float, float] | None = None,
    track_itl: bool = False,
) -> tuple[Records, Replica]:
    """Simulate one replica serving ``workload``; returns the records and the replica.

    ``windows_stop_at_arrivals=False`` lets fast-forward windows run past arrivals and be cut
    back when one comes (what replicas of a cluster do); results are the same either way.
    """
    pool = PoolSetup(name="default", role="mixed", num_replicas=1, step_model=step_model,
                     num_kv_blocks=num_kv_blocks, link_bw_bytes_per_s=math.inf)
    records, cluster = simulate_cluster(
        workload, [pool], router=OnlyReplica(), decode_router=OnlyReplica(),
        make_batch_policy=lambda: batch_policy, order_key=order_key,
        rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
        block_size=block_size, max_batched_tokens=max_batched_tokens, max_running=max_running,
        enable_prefix_caching=enable_prefix_caching, fast_forward=fast_forward, debug=debug,
        until_s=until_s, progress=progress, windows_stop_at_arrivals=windows_stop_at_arrivals,
        timeline=timeline, track_itl=track_itl)
    return records, cluster.replicas[0]
