"""Heddle's work outside the engine loop (issue 27), with and without what a process now
shares between its simulations: the full entry's trajectory batch (128 prompts x 16 samples)
drawn as often as the entry asks for it (39 times), the standalone call times of that batch
on its TP-1 8B worker as each of 15 rollouts asks for them, and the 8B resource manager's
search as heddle and heddle-dp-split each ask for it.

    .venv/bin/python benchmarks/heddle_side_cost.py

Prints CPU seconds per part, uncached (every cache emptied before each use) against shared,
and the load average (the machine is shared: compare CPU time). docs/reproductions.md
(Heddle's *Cost*) has the figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from fleetsim.config import ClusterConfig, EngineConfig, PoolConfig, SimConfig
from fleetsim.models import get_model
from fleetsim.programs.runtime import call_timer
from fleetsim.rl import agentic_rollout, trajectories
from fleetsim.rl.agentic_rollout import HASH_BLOCK_TOKENS, AgenticRolloutConfig
from fleetsim.rl.trajectories import TrajectoryArgs, sample_batch
from fleetsim.run import build_pools

ARGS = TrajectoryArgs(num_prompts=128, samples_per_prompt=16, length_scale=2.0,
                      max_turn_tokens=40960)  # the entry's (repro.heddle: PROMPTS, TURN_CAP_TOKENS)
NUM_DRAWS, NUM_ROLLOUTS = 39, 15


def cpu_s(fn: Callable[[], object]) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def draws(fresh: bool) -> None:
    for _ in range(NUM_DRAWS):
        if fresh:
            trajectories._BATCHES.clear()
        sample_batch(ARGS, np.random.default_rng(np.random.SeedSequence(0).spawn(4)[0]))


def standalone_times(fresh: bool) -> None:
    model = get_model("qwen3-8b")
    cfg = AgenticRolloutConfig(num_gpus=16, trajectories=ARGS)
    batch = sample_batch(ARGS, np.random.default_rng(0))
    for _ in range(NUM_ROLLOUTS):
        if fresh:
            agentic_rollout._ALONE_S.clear()
        scfg = SimConfig(model=cfg.model, engine=cfg.engine, cluster=ClusterConfig(
            pools=(PoolConfig(name="rollout", gpu=cfg.gpu, num_replicas=16, tp=1),)))
        pools, _ = build_pools(scfg, model)
        timer = call_timer(pools, model, cfg.engine.max_batched_tokens, 0.0,
                           [agentic_rollout._alone_cache(cfg, 1)])
        for program in batch.programs:
            timer.calls_s(program, HASH_BLOCK_TOKENS)


def searches(fresh: bool) -> None:
    model = get_model("qwen3-8b")
    heddle = AgenticRolloutConfig(num_gpus=16, trajectories=ARGS, placement="heddle",
                                  scheduling="progressive_priority", migration=True,
                                  resource_manager=True, split_scoring="replay",
                                  preemption_mode="swap",
                                  engine=EngineConfig(swap_space_gib=256))
    for cfg in (heddle, replace(heddle, split_scoring="dp")):
        if fresh:
            agentic_rollout._SPLITS.clear()
        agentic_rollout._allocate(cfg, model, np.random.SeedSequence(cfg.seed).spawn(4)[3])


def main() -> None:
    for name, part in (("39 draws of the batch", draws),
                       (f"standalone times, {NUM_ROLLOUTS} rollouts", standalone_times),
                       ("8B resource manager, heddle + dp-split", searches)):
        trajectories._BATCHES.clear()
        agentic_rollout._ALONE_S.clear()
        agentic_rollout._SPLITS.clear()
        uncached = cpu_s(lambda: part(True))  # noqa: B023 (called at once)
        trajectories._BATCHES.clear()
        agentic_rollout._ALONE_S.clear()
        agentic_rollout._SPLITS.clear()
        shared = cpu_s(lambda: part(False))  # noqa: B023
        print(f"{name:42s} uncached {uncached:6.2f} s   shared {shared:6.2f} s CPU")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
