"""Scale: 1,000,000 synthetic requests (ShareGPT lengths) on 64 replicas with power_of_two.

Target (issue 27): at most 10 s wall and 1 GB peak memory on a 2-core machine, the cost
per request flat from 10k to 1M requests (issue 3's was 60 s and 4 GB; figures in
docs/cluster.md). Prints the engine in use (the compiled one after ``make native``;
``FLEETSIM_PURE=1`` for pure Python), wall time, simulated requests per wall-second and peak
RSS. ``cluster_scale_digest.py`` runs the same configuration and prints digests of its
records, to check that a speed-up changed no result.

    python benchmarks/cluster_scale.py [--requests N] [--replicas R] [--rate-per-replica X]
"""

from __future__ import annotations

import argparse
import resource
import time

from fleetsim import native
from fleetsim.config import SimConfig, config_from_dict
from fleetsim.run import run


def lengths() -> tuple[dict, dict]:
    """ShareGPT prompt/output lengths (the sample shipped in fleetsim/data)."""
    return ({"kind": "empirical", "path": "embedded:sharegpt_lengths",
             "column": "num_prefill_tokens"},
            {"kind": "empirical", "path": "embedded:sharegpt_lengths",
             "column": "num_decode_tokens"})


def scale_config(num_requests: int, num_replicas: int, rate_per_replica: float) -> SimConfig:
    """The benchmark's run: ``num_requests`` Poisson arrivals on ``num_replicas`` of
    Llama-3.1-8B on H100, routed by power of two choices."""
    prompt, output = lengths()
    return config_from_dict({
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "num_replicas": num_replicas},
        "cluster": {"router": {"name": "power_of_two"}},
        "workload": {"trace": None, "arrival": "poisson",
                     "rate_per_s": rate_per_replica * num_replicas,
                     "num_requests": num_requests, "prompt_tokens": prompt,
                     "output_tokens": output},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--rate-per-replica", type=float, default=2.0,
                        help="arrivals per second per replica (about 70%% busy on an H100)")
    args = parser.parse_args()
    config = scale_config(args.requests, args.replicas, args.rate_per_replica)
    start = time.perf_counter()
    s = run(config).summary
    wall_s = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"requests            {s['num_finished']:,} finished of {s['num_requests']:,} "
          f"on {args.replicas} replicas")
    print(f"simulated span      {s['makespan_s']:,.0f} s, {s['num_steps']:,} engine steps")
    print(f"engine              {native.engine()}")
    print(f"wall time           {wall_s:.1f} s")
    print(f"requests / wall-s   {s['num_finished'] / wall_s:,.0f}")
    print(f"peak memory (RSS)   {peak_gb:.2f} GB")
    print(f"GPU busy            {100 * s['gpu_busy_fraction']:.1f}%")
    print(f"TTFT p50/p99        {s['ttft_s']['p50']:.3f} / {s['ttft_s']['p99']:.3f} s")
    print(f"TPOT p50/p99        {s['tpot_s']['p50']:.4f} / {s['tpot_s']['p99']:.4f} s")


if __name__ == "__main__":
    main()
