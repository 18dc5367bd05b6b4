"""KV across tool waits: program JCT with ``programs.tool_kv`` = drop, keep and offload.

Two settings (docs/programs.md, "KV across tool waits", quotes their output):

- ``l40s``: BFCL-like tool chains (``tool_chain``, the generator's defaults) on one L40S
  replica of Llama-3.1-8B (27 GB of KV: memory is scarce), Poisson program arrivals;
- ``autellix``: the Autellix reproduction's cluster (4 H100 replicas of Llama-3.1-8B, ATLAS
  with its locality-aware balancer) on its three workloads at its highest rate.

Both with vLLM's default host tier (``engine.swap_space_gib`` = 4 GiB per GPU, used by
offload only) and the default time-to-live (``programs.kv_ttl_s`` = 2 s). Prints, per run,
mean / p50 / p99 program JCT, the prefix-hit share of prompt tokens and the records' fate.

    python benchmarks/tool_kv.py [--setting l40s|autellix|both] [--programs N] [--ttl S]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.run import run

MODES = ("drop", "keep", "offload")


def l40s(mode: str, rate: float, n: int, ttl_s: float) -> dict[str, Any]:
    return {"model": "llama-3.1-8b", "hardware": {"gpu": "l40s", "num_replicas": 1},
            "engine": {"swap_space_gib": 4.0},
            "programs": {"generator": "tool_chain", "num_programs": n, "rate_per_s": rate,
                         "tool_kv": mode, "kv_ttl_s": ttl_s},
            "slo": {"ttft_s": 1e6, "tpot_s": 1e6}, "seed": 0}


def autellix(mode: str, workload: str, n: int, ttl_s: float) -> dict[str, Any]:
    # repro/autellix.py's config at its highest rate (20 programs/s on 4 H100s)
    return {"model": "llama-3.1-8b", "hardware": {"gpu": "h100-sxm", "num_replicas": 4},
            "engine": {"swap_space_gib": 4.0},
            "cluster": {"router": {"name": "autellix_locality"}},
            "policy": {"batching": {"name": "atlas"}},
            "programs": {"generator": workload, "num_programs": n, "rate_per_s": 20.0,
                         "tool_kv": mode, "kv_ttl_s": ttl_s},
            "slo": {"ttft_s": 1e6, "tpot_s": 1e6}, "seed": 0}


def line(label: str, mode: str, cfg: dict[str, Any]) -> None:
    start = time.perf_counter()
    result = run(config_from_dict(cfg))
    s = result.summary
    prog = s["programs"]
    jct = prog["jct_s"]
    req = result.records.requests
    hit = float(req["num_prefix_hit_tokens"].sum()) / float(req["num_prompt_tokens"].sum())
    fate = {k: v for k, v in prog["tool_kv"].items()
            if k.startswith("num_") and v}
    print(f"{label:<22} {mode:<8} JCT mean {jct['mean']:8.2f}  p50 {jct['p50']:8.2f}  "
          f"p99 {jct['p99']:8.2f} s  hit {hit:5.1%}  unfinished {prog['num_unfinished']}  "
          f"({time.perf_counter() - start:.1f} s) {fate}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="both", choices=("l40s", "autellix", "both"))
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--ttl", type=float, default=2.0, help="programs.kv_ttl_s")
    args = parser.parse_args()
    print(f"engine: {native.engine()}")
    if args.setting in ("l40s", "both"):
        for rate in (1.0, 2.0, 3.0):
            for mode in MODES:
                line(f"l40s tool_chain @{rate:g}/s", mode, l40s(mode, rate, args.programs,
                                                               args.ttl))
    if args.setting in ("autellix", "both"):
        for workload in ("chain", "tool_chain", "lats"):
            for mode in MODES:
                line(f"autellix {workload} @20/s", mode,
                     autellix(mode, workload, args.programs, args.ttl))


if __name__ == "__main__":
    main()
