"""Shared factories: small workloads and a one-replica simulation with a stub perf model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from fleetsim.perf.base import ConstantStepModel, LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.serving.driver import simulate_replica
from fleetsim.workloads.workload import Workload

SHARED_TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"


def make_workload(
    arrivals: Sequence[float],
    prompts: Sequence[int],
    outputs: Sequence[int],
    hash_ids: Sequence[Sequence[int]] | None = None,
    hash_block_tokens: int = 64,
    priority: Sequence[int] | None = None,
) -> Workload:
    return Workload(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        num_prompt_tokens=np.asarray(prompts, dtype=np.int64),
        num_output_tokens=np.asarray(outputs, dtype=np.int64),
        hash_ids=tuple(tuple(h) for h in hash_ids) if hash_ids is not None else None,
        hash_block_tokens=hash_block_tokens,
        priority=np.asarray(priority, dtype=np.int64) if priority is not None else None,
    )


def simulate(
    workload: Workload,
    *,
    step_time_s: float | None = 1.0,
    step_model=None,
    kv_blocks: int = 1000,
    block_size: int = 16,
    max_batched_tokens: int = 8192,
    max_running: int = 256,
    ordering: str = "fcfs",
    chunked: bool = True,
    fast_forward: bool = True,
    debug: bool = True,
    until_s: float = float("inf"),
    prefix_caching: bool = True,
    windows_stop_at_arrivals: bool = True,
    batch_policy=None,
    timeline=None,
    track_itl=True,
):
    """One replica with a constant (or given) step model; returns (records, replica)."""
    model = step_model or ConstantStepModel(step_time_s)
    return simulate_replica(
        workload, step_model=model, num_kv_blocks=kv_blocks, block_size=block_size,
        batch_policy=batch_policy or TokenBudgetPlanner(enable_chunked_prefill=chunked),
        order_key=make_ordering(ordering), max_batched_tokens=max_batched_tokens,
        max_running=max_running, enable_prefix_caching=prefix_caching,
        fast_forward=fast_forward, debug=debug, until_s=until_s,
        windows_stop_at_arrivals=windows_stop_at_arrivals, timeline=timeline,
        track_itl=track_itl,
    )


def by_id(records, column: str) -> dict[int, float]:
    r = records.requests
    return dict(zip(r["request_id"].tolist(), r[column].tolist(), strict=True))


@pytest.fixture
def linear_model():
    return LinearStepModel(0.005, 2e-5, 1e-7)
