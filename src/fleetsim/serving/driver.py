"""Drive one replica through a workload: stream arrivals into the event loop, collect records.

Arrivals are streamed: only the next one is in the heap at any time, so memory stays flat
however long the trace is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fleetsim.core.simulator import Simulator
from fleetsim.metrics.recorder import Recorder, Records
from fleetsim.perf.base import StepTimeModel
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.replica import EventKind, Replica
from fleetsim.serving.request import Request
from fleetsim.workloads.workload import Workload

ProgressFn = Callable[[float], None]  # called with simulated seconds now


def request_from_row(workload: Workload, i: int) -> Request:
    """Row ``i`` of a workload as a fresh ``Request`` (id = row index)."""
    return Request(
        id=i,
        arrival_s=float(workload.arrival_s[i]),
        num_prompt_tokens=int(workload.num_prompt_tokens[i]),
        max_output_tokens=int(workload.num_output_tokens[i]),
        hash_ids=workload.hash_ids[i] if workload.hash_ids is not None else (),
        priority=int(workload.priority[i]) if workload.priority is not None else 0,
    )


def simulate_replica(
    workload: Workload,
    *,
    step_model: StepTimeModel,
    num_kv_blocks: int,
    block_size: int,
    batch_policy: Any,
    order_key: Callable[[Request, float], tuple],
    max_batched_tokens: int,
    max_running: int,
    enable_prefix_caching: bool = True,
    fast_forward: bool = True,
    debug: bool = False,
    until_s: float = math.inf,
    progress: ProgressFn | None = None,
    progress_every: int = 500,
    windows_stop_at_arrivals: bool = True,
) -> tuple[Records, Replica]:
    """Simulate one replica serving ``workload``; returns the records and the final replica.

    ``windows_stop_at_arrivals=False`` lets fast-forward windows run past arrivals and be cut
    back when one comes (the multi-replica path); results are the same either way.
    """
    sim = Simulator()
    recorder = Recorder()
    hash_block_tokens = workload.hash_block_tokens if workload.hash_ids is not None else None
    kv = KVCache(num_kv_blocks, block_size, hash_block_tokens, enable_prefix_caching)
    replica = Replica(
        sim, step_model=step_model, kv=kv, batch_policy=batch_policy, order_key=order_key,
        recorder=recorder, max_batched_tokens=max_batched_tokens, max_running=max_running,
        fast_forward=fast_forward, debug=debug, next_input_hint_s=sim.peek_s if windows_stop_at_arrivals else None,
    )
    replica.until_s = until_s
    num_requests = len(workload)

    def on_arrival(i: int) -> None:
        replica.submit(request_from_row(workload, i))
        if progress is not None and i % progress_every == 0:
            progress(sim.now_s)
        if i + 1 < num_requests:
            sim.schedule(float(workload.arrival_s[i + 1]), EventKind.ARRIVAL, i + 1)

    def on_step_end(payload: tuple[Replica, Any]) -> None:
        payload[0].finish_step(payload[1])

    sim.on(EventKind.ARRIVAL, on_arrival)
    sim.on(EventKind.STEP_END, on_step_end)
    sim.on(EventKind.WAKE_UP, Replica.wake_up)
    if num_requests:
        sim.schedule(float(workload.arrival_s[0]), EventKind.ARRIVAL, 0)
    sim.run(until_s)
    if progress is not None:
        progress(sim.now_s)
    return recorder.records(), replica
