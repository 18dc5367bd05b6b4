"""Speed claim of issue 11: a 100-step GRPO job (512 prompts x 16 samples, 8K max response)
on 64 GPUs simulates in under 60 s on 2 cores. Qwen2.5-7B on 64 H100 (verl's colocated
layout, one generation replica per GPU), DAPO group lengths from PolyTrace.

    .venv/bin/python benchmarks/rl_grpo_100_steps.py [--steps N] [--lengths-scale X]

Prints wall and CPU seconds (the machine is shared: compare CPU time across runs, and note
the load average, printed too).
"""

from __future__ import annotations

import argparse
import os
import time

from fleetsim.native import engine
from fleetsim.rl import rl_config_from_dict, run_rl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lengths-scale", type=float, default=1.0)
    args = ap.parse_args()
    cfg = rl_config_from_dict({
        "num_steps": args.steps, "actor": "qwen2.5-7b", "num_prompts_per_step": 512,
        "samples_per_prompt": 16, "max_response_tokens": 8192,
        "lengths": {"kind": "polytrace", "run": "dapo-qwen2.5-32b",
                    "scale": args.lengths_scale},
        "pools": [{"name": "colocated", "gpu": "h100", "num_gpus": 64}],
    })
    start, cpu_start = time.perf_counter(), time.process_time()
    result = run_rl(cfg)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    s = result.summary
    print(f"engine: {engine()}")
    print(f"{args.steps} steps x {s['samples_per_step']} samples, mean response "
          f"{s['generation']['mean_response_tokens']:.0f} tokens: simulated "
          f"{s['makespan_s']:.0f} s in {wall:.1f} s wall, {cpu:.1f} s CPU "
          f"({s['samples_per_s']:.1f} samples/s simulated); load average "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
