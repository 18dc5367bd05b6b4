"""Drive one replica through a workload (the one-pool, one-replica case of a cluster)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.cluster import OnlyReplica, PoolSetup, ProgressFn, simulate
from fleetsim.serving.contract import BatchPolicy
from fleetsim.serving.recorder import Records
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import Request
from fleetsim.serving.settings import EngineSettings, PlugIns
from fleetsim.serving.speculative import Emission
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
    speculative: Emission | None = None,
) -> tuple[Records, Replica]:
    """Simulate one replica serving ``workload``; returns the records and the replica.

    ``windows_stop_at_arrivals=False`` lets fast-forward windows run past arrivals and be cut
    back when one comes (what replicas of a cluster do); results are the same either way.
    """
    pool = PoolSetup(name="default", role="mixed", num_replicas=1, step_model=step_model,
                     num_kv_blocks=num_kv_blocks, link_bw_bytes_per_s=math.inf)
    settings = EngineSettings(
        block_size=block_size, max_batched_tokens=max_batched_tokens, max_running=max_running,
        enable_prefix_caching=enable_prefix_caching, fast_forward=fast_forward, debug=debug,
        track_itl=track_itl, until_s=until_s, timeline=timeline,
        windows_stop_at_arrivals=windows_stop_at_arrivals, speculative=speculative)
    plugins = PlugIns(make_batch_policy=lambda: batch_policy, order_key=order_key,
                      router=OnlyReplica(), decode_router=OnlyReplica(),
                      rng=np.random.default_rng(0))
    records, cluster = simulate(workload, [pool], settings, plugins, progress=progress)
    return records, cluster.replicas[0]
