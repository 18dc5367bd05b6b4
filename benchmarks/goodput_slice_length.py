"""Goodput of Llama-3.1-8B on one H100 for the Azure LLM 2023 conversation trace, at the
default SLO (90% of requests with TTFT <= 1 s and TPOT <= 50 ms), against the length of
the workload slice each probe simulates, with the wall time of each search.

Short slices overstate goodput (queues have no time to build up); this shows by how much,
so that ``workload.max_requests`` can be chosen for quick searches.

    python benchmarks/goodput_slice_length.py [--gpu h100] [--full-trace] [--tol 0.05]
"""

from __future__ import annotations

import argparse
import time

from fleetsim.config import load_config
from fleetsim.search import goodput_search, goodput_to_dict

FULL_TRACE = "embedded:azure_conv_2023_hour"  # the whole hour, shipped in fleetsim/data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h100")
    ap.add_argument("--tol", type=float, default=0.05)
    ap.add_argument("--full-trace", action="store_true",
                    help=f"also search on the whole hour ({FULL_TRACE}, 19,366 requests)")
    args = ap.parse_args()
    cuts: list[tuple[str, list[str]]] = [
        (f"first {n} requests", [f"workload.max_requests={n}"]) for n in (250, 500, 1000, 2000)]
    cuts.append(("embedded 15 min (4,424)", []))
    if args.full_trace:
        cuts.append(("full hour (19,366)", [f"workload.trace='{FULL_TRACE}'"]))
    print(f"{'slice':<26} {'goodput req/s':>14} {'runs':>5} {'wall s':>7} {'$/M tok':>8}")
    for label, sets in cuts:
        config = load_config(None, [f"hardware.gpu={args.gpu}", *sets])
        t0 = time.perf_counter()
        r = goodput_to_dict(goodput_search(config, rel_tol=args.tol))
        wall_s = time.perf_counter() - t0
        print(f"{label:<26} {r['goodput_requests_per_s']:>14.2f} {r['num_runs']:>5} "
              f"{wall_s:>7.1f} {r['usd_per_million_tokens']:>8.4f}"
              + ("" if r["monotone"] else "  (not monotone)"))


if __name__ == "__main__":
    main()
