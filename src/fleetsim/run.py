"""``run(config)``: build the replica a ``SimConfig`` describes, simulate it, summarize.

Writing files is the CLI's job; this returns everything in memory, config included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.config import SimConfig
from fleetsim.configutil import to_plain
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.metrics.recorder import Records
from fleetsim.metrics.summary import summarize
from fleetsim.models import ModelSpec, get_model
from fleetsim.perf import build_step_model, kv_capacity_blocks
from fleetsim.policies import make_batch_policy, make_ordering
from fleetsim.serving.driver import ProgressFn, simulate_replica
from fleetsim.workloads import Workload, build_workload


@dataclass(frozen=True, slots=True, eq=False)
class RunResult:
    """What a run produced: the resolved config, the summary and the per-request records."""

    config: dict[str, Any]
    summary: dict[str, Any]
    records: Records
    workload: Workload


def seed_streams(seed: int, names: tuple[str, ...]) -> dict[str, np.random.Generator]:
    """One independent generator per named stream, derived from one seed in a fixed order."""
    children = np.random.SeedSequence(seed).spawn(len(names))
    return {name: np.random.default_rng(child) for name, child in zip(names, children, strict=True)}


def check_fits(workload: Workload, model: ModelSpec, num_kv_blocks: int, block_size: int) -> None:
    """Every request must fit the model's context and, alone, the replica's KV cache."""
    total = workload.num_prompt_tokens + workload.num_output_tokens
    too_long = np.flatnonzero(total > model.max_context_tokens)
    if too_long.size:
        i = int(too_long[0])
        raise FleetsimInputError(
            f"workload request {i} (row {i + 1} after slicing)",
            f"{int(workload.num_prompt_tokens[i])} prompt + "
            f"{int(workload.num_output_tokens[i])} output tokens",
            f"the model {model.name} takes at most {model.max_context_tokens} tokens; "
            f"filter the trace or pick a longer-context model",
        )
    blocks = -(-total // block_size)
    too_big = np.flatnonzero(blocks > num_kv_blocks)
    if too_big.size:
        i = int(too_big[0])
        raise FleetsimInputError(
            f"workload request {i}", f"{int(total[i])} tokens ({int(blocks[i])} KV blocks)",
            f"the replica holds only {num_kv_blocks} blocks; raise hardware.tp, use a GPU "
            f"with more memory, or set engine.num_kv_blocks",
        )


def run(config: SimConfig, progress: ProgressFn | None = None) -> RunResult:
    """Simulate ``config``; ``progress`` (optional) is called with the simulated time."""
    streams = seed_streams(config.seed, ("workload",))
    workload = build_workload(config.workload, streams["workload"])
    model = get_model(config.model)
    gpu = get_gpu(config.hardware.gpu, config.hardware.catalog)
    hw, eng = config.hardware, config.engine
    step_model = build_step_model(model, gpu, hw.tp, backend=config.perf_backend)
    num_kv_blocks = eng.num_kv_blocks or kv_capacity_blocks(
        model, gpu, hw.tp, eng.block_size, eng.gpu_memory_utilization)
    check_fits(workload, model, num_kv_blocks, eng.block_size)
    if workload.hash_ids is not None and workload.hash_block_tokens % eng.block_size:
        raise FleetsimInputError(
            "engine.block_size", eng.block_size,
            f"must divide the trace's hash block of {workload.hash_block_tokens} tokens")
    until_s = config.until_s if config.until_s is not None else math.inf
    records, _ = simulate_replica(
        workload,
        step_model=step_model,
        num_kv_blocks=num_kv_blocks,
        block_size=eng.block_size,
        batch_policy=make_batch_policy(config.policy.batching),
        order_key=make_ordering(config.policy.ordering),
        max_batched_tokens=eng.max_batched_tokens,
        max_running=eng.max_running,
        enable_prefix_caching=eng.enable_prefix_caching,
        fast_forward=eng.fast_forward,
        debug=eng.debug,
        until_s=until_s,
        progress=progress,
    )
    num_arrived = int(np.searchsorted(workload.arrival_s, until_s, side="right"))
    summary = summarize(
        records,
        num_arrived=num_arrived,
        first_arrival_s=float(workload.arrival_s[0]),
        slo=config.slo,
        num_kv_blocks_by_replica={0: num_kv_blocks},
    )
    summary = {
        "model": model.name, "gpu": gpu.name, "tp": hw.tp, "workload": workload.name,
        "perf_sources": dict(getattr(step_model, "sources", {})),
        **summary,
    }
    return RunResult(to_plain(config), summary, records, workload)
