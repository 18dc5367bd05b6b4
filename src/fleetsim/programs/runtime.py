"""What ``run()`` needs to simulate programs: the source, and a workload of their calls for
the checks and the time series that read one (each call at its program's arrival)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fleetsim.models import ModelSpec
from fleetsim.programs.config import ProgramWorkloadConfig, build_programs
from fleetsim.programs.dag import Program
from fleetsim.programs.source import ProgramSource
from fleetsim.programs.standalone import CallTimer
from fleetsim.serving.cluster import PoolSetup
from fleetsim.workloads.workload import Workload


def call_timer(pools: Sequence[PoolSetup], model: ModelSpec, max_batched_tokens: int,
               link_latency_s: float,
               alone_caches: Sequence[dict[tuple[int, int, int], float]] = ()) -> CallTimer:
    """Standalone call times on the fastest pools of the cluster (a lower bound: see
    ``programs.standalone``); P/D adds the handoff over the fastest idle link.
    ``alone_caches``: mixed pools only, one per pool (``CallTimer.alone_caches``)."""
    entry = [p for p in pools if p.role != "decode"]
    decode = [p for p in pools if p.role == "decode"]
    if not decode:
        return CallTimer([p.step_model for p in entry], max_batched_tokens,
                         alone_caches=alone_caches)
    bw = max(min(p.link_bw_bytes_per_s, d.link_bw_bytes_per_s) for p in entry for d in decode)
    return CallTimer([p.step_model for p in entry], max_batched_tokens,
                     [d.step_model for d in decode],
                     float(model.kv_bytes_per_token()) / bw, link_latency_s)


def calls_workload(programs: Sequence[Program], block_tokens: int, name: str) -> Workload:
    """One row per call, at its program's arrival, in arrival order."""
    order = sorted(range(len(programs)), key=lambda i: programs[i].arrival_s)
    calls = [(programs[i].arrival_s, c) for i in order for c in programs[i].calls]
    return Workload(
        arrival_s=np.array([t for t, _ in calls], dtype=np.float64),
        num_prompt_tokens=np.array([c.num_prompt_tokens for _, c in calls], dtype=np.int64),
        num_output_tokens=np.array([c.num_output_tokens for _, c in calls], dtype=np.int64),
        hash_ids=((),) * len(calls), hash_block_tokens=block_tokens, name=name)


def program_source(cfg: ProgramWorkloadConfig, rng: np.random.Generator, model: ModelSpec,
                   pools: Sequence[PoolSetup], max_batched_tokens: int, link_latency_s: float
                   ) -> tuple[ProgramSource, Workload]:
    """The source of ``cfg``'s programs and the workload of their calls."""
    programs = build_programs(cfg, rng, model.max_context_tokens)
    timer = call_timer(pools, model, max_batched_tokens, link_latency_s)
    name = f"programs:{cfg.generator}" + (f":{cfg.path}" if cfg.path else "")
    return (ProgramSource(programs, timer, cfg.hash_block_tokens, cfg.tool_kv != "drop"),
            calls_workload(programs, cfg.hash_block_tokens, name))
