"""The RL side's own cost (issue 27): the pure-Python work around the serving engine that
StreamRL's and RLHFuse's reproductions pay, without the engine.

- the training-side passes of one StreamRL step at 20K (512 prompts x 16 samples of
  PolyTrace's DeepCoder-14B lengths scaled to the cap, Qwen2.5-7B on 16 H800): streamed in
  chunks of 4 groups, each chunk's old-log-prob, reference and training pass, as the
  streaming trainer runs them; then the whole step at once, as a stage-balancing probe does;
- RLHFuse's fused actor/critic pipeline search (2,000 annealing moves) at 4, 8 and 16 stages.

    .venv/bin/python benchmarks/rl_side_cost.py

Prints CPU seconds per part and the load average (the machine is shared: compare CPU time).
docs/rl.md ("The RL side's own cost") has the figures before and after.
"""

from __future__ import annotations

import os
import time

import numpy as np

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf.training import ForwardModel, Layout, PassModel
from fleetsim.repro.streamrl import streamrl
from fleetsim.rl.config import rl_config_from_dict
from fleetsim.rl.fused_pipeline import PipelineWork, anneal
from fleetsim.rl.lengths import sample_step


def training_passes() -> None:
    cfg = rl_config_from_dict(streamrl(20000.0, 16, 32, 512, 1, staleness=1))
    batch = sample_step(cfg, np.random.default_rng(0))
    seqs = (batch.prompt_tokens + batch.response_tokens).tolist()
    fwd = ForwardModel(get_model("qwen2.5-7b"), get_gpu("h800"), 1)
    lay = Layout(dp=16, micro_batch_tokens=16384, recompute="full")
    infer, train = PassModel(fwd, lay, train=False), PassModel(fwd, lay, train=True)
    chunk = 4 * cfg.samples_per_prompt
    for label, size in (("streamed chunks of 4 groups", chunk), ("the whole step", len(seqs))):
        start = time.process_time()
        for i in range(0, len(seqs), size):
            part = seqs[i:i + size]
            infer.run(part)  # old log-probs
            infer.run(part)  # reference
            train.run(part, optimizer_step=False, reduce_grads=False)
        print(f"training-side passes, {label}: {time.process_time() - start:.2f} s CPU")


def fused_search() -> None:
    rng = np.random.default_rng(1)
    for stages, micro_batches in ((4, 16), (8, 8), (16, 4)):
        f = rng.uniform(0.5, 2.0, micro_batches)
        works = [PipelineWork("actor", tuple(f), tuple(2.5 * f)),
                 PipelineWork("critic", tuple(0.6 * f), tuple(1.8 * f))]
        start = time.process_time()
        res = anneal(stages, works, iterations=2000, seed=3)
        print(f"fused search, pp {stages} x {micro_batches} micro-batches: "
              f"{time.process_time() - start:.2f} s CPU (makespan {res.makespan_s:.3f})")


def main() -> None:
    training_passes()
    fused_search()
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
