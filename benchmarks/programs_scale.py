"""Programs at scale: 10,000 map-reduce programs of 8 calls each (a planner, 6 workers with
tool calls, a reducer) on 16 H100 replicas of Llama-3.1-8B, Poisson program arrivals.

Target (issue 10): under 60 s wall on a 2-core machine. Prints the engine in use, wall time
(whole run: program generation, T_w, simulation, summary), calls per wall-second, program
metrics and peak RSS.

    python benchmarks/programs_scale.py [--programs N] [--replicas R] [--rate X]
"""

from __future__ import annotations

import argparse
import resource
import time

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.run import run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--rate", type=float, default=16.0, help="programs per second")
    parser.add_argument("--router", default="least_loaded")
    parser.add_argument("--policy", default="token_budget")
    args = parser.parse_args()
    config = config_from_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "num_replicas": args.replicas},
        "cluster": {"router": {"name": args.router}},
        "policy": {"batching": {"name": args.policy}},
        "programs": {"generator": "map_reduce", "num_programs": args.programs,
                     "rate_per_s": args.rate, "args": {"fan_out": 6}},
        "seed": 0,
    })
    print(f"engine: {native.engine()}")
    start = time.perf_counter()
    result = run(config)
    wall = time.perf_counter() - start
    s, p = result.summary, result.summary["programs"]
    print(f"{p['num_programs']} programs, {p['num_calls']} calls on {args.replicas} replicas: "
          f"{wall:.1f} s wall, {p['num_calls'] / wall:,.0f} calls/s, makespan "
          f"{s['makespan_s']:.0f} simulated s")
    print(f"JCT p50 {p['jct_s']['p50']:.2f} s, T_w p50 {p['standalone_s']['p50']:.2f} s, "
          f"Req95 {p['slo_scale']['req95']}, unfinished {p['num_unfinished']}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
