"""CPU per generated token: LoongServe (the ``esp`` group planner on an instance group of the
one engine) against the main engine's plain replicas on the same requests.

Issue 20 asks the ported system to cost within 1.5x of the main engine per generated token
(the side ESP loop it replaced cost 3-8x on decode-heavy load). Runs the reproduction's
configs (``repro/loongserve.py``) on its Mixed lengths and on ShareGPT lengths (decode-heavy),
and prints CPU seconds per 1,000 generated tokens for each system, and the ratio. CPU time is
the process's (``time.process_time``), so other jobs on the machine do not count; run it
with ``FLEETSIM_PURE=1`` to measure pure Python.

    python benchmarks/esp_cost_per_token.py [--requests N]
"""

from __future__ import annotations

import argparse
import time

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.repro.loongserve import baseline_config
from fleetsim.repro.loongserve_workload import workload
from fleetsim.run import run

LOADS = (("mixed", 0.4), ("sharegpt", 4.0))  # (dataset, req/s): Mixed near ESP's knee
SYSTEMS = ("loongserve", "loongserve-no-esp", "lightllm-sf", "vllm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=480)
    args = parser.parse_args()
    print(f"engine {native.engine()}; CPU s per 1,000 generated tokens "
          f"({args.requests} requests per run)")
    for dataset, rate in LOADS:
        wl = workload(dataset, args.requests, rate, seed=0)
        tokens = int(wl.num_output_tokens.sum())
        cost = {}
        for system in SYSTEMS:
            cfg = config_from_dict(baseline_config(system, "mixed"))
            run(cfg, workload=workload(dataset, 8, rate, seed=1))  # warm the step tables
            start = time.process_time()
            run(cfg, workload=wl)
            cost[system] = (time.process_time() - start) / tokens * 1e3
        main_engine = min(cost["lightllm-sf"], cost["vllm"])
        print(f"{dataset} @ {rate:g} req/s, {tokens:,} output tokens: " + ", ".join(
            f"{s} {c * 1e3:.2f} ms" for s, c in cost.items())
            + f"; loongserve / main engine {cost['loongserve'] / main_engine:.2f}x")


if __name__ == "__main__":
    main()
