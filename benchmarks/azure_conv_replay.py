"""Replay the full Azure LLM 2023 conversation trace (19,366 requests) on one H100 serving
Llama-3.1-8B and print wall time, simulated requests per wall-second and peak memory.

Target (issue 2): under 5 s wall on a 2-core machine. Also runs the same replay with decode
fast-forward off, to show what fast-forward buys (the ratio is measured in this one run).

    python benchmarks/azure_conv_replay.py [--trace PATH] [--no-compare]
"""

from __future__ import annotations

import argparse
import resource
import time

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.run import run

DEFAULT_TRACE = "embedded:azure_conv_2023_hour"  # the whole hour, shipped in fleetsim/data


def replay(trace: str, fast_forward: bool) -> tuple[float, dict]:
    config = config_from_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "tp": 1},
        "workload": {"trace": trace},
        "engine": {"fast_forward": fast_forward},
    })
    start = time.perf_counter()
    result = run(config)
    return time.perf_counter() - start, result.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE,
                        help="a trace file or embedded:<name> (default: the whole Azure hour)")
    parser.add_argument("--no-compare", action="store_true", help="skip the step-by-step run")
    args = parser.parse_args()
    wall_s, s = replay(args.trace, fast_forward=True)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = s["num_finished"]
    print(f"requests            {n:,} finished of {s['num_requests']:,}")
    print(f"simulated span      {s['makespan_s']:,.0f} s, {s['num_steps']:,} engine steps")
    print(f"engine              {native.engine()}")
    print(f"wall time           {wall_s:.2f} s (includes loading trace and perf tables)")
    print(f"requests / wall-s   {n / wall_s:,.0f}")
    print(f"peak memory (RSS)   {peak_mb:,.0f} MB")
    print(f"TTFT p50/p99        {s['ttft_s']['p50']:.4f} / {s['ttft_s']['p99']:.4f} s")
    print(f"TPOT p50/p99        {s['tpot_s']['p50']:.4f} / {s['tpot_s']['p99']:.4f} s")
    if not args.no_compare:
        slow_s, s2 = replay(args.trace, fast_forward=False)
        same = s2["ttft_s"] == s["ttft_s"] and s2["e2e_s"] == s["e2e_s"]
        print(f"step-by-step wall   {slow_s:.2f} s  (fast-forward speed-up {slow_s / wall_s:.1f}x, "
              f"identical latency metrics: {same})")


if __name__ == "__main__":
    main()
