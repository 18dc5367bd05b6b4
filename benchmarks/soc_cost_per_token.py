"""CPU per generated token: an SoC on the one engine (``cluster.soc``) against the SoC engine
(``soc/engine.py``) and against the main engine's plain GPU replica, on the same requests.

Issue 20 asks a ported system to cost within 1.5x of the main engine per generated token (the
SoC engine cost 25-60x). The requests are Agent.xpu's reactive traffic (Poisson, lengths from
the Azure 2023 conversation trace, prompts capped at 2,048), served by an iGPU engine that
batches up to ``--slots`` requests, and by prefill on the NPU with decode on the iGPU (both
on the shared DDR). CPU time is the process's (``time.process_time``); run it with
``FLEETSIM_PURE=1`` to measure pure Python.

    python benchmarks/soc_cost_per_token.py [--per-min 60] [--minutes 30] [--slots 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost
from fleetsim.perf.soc_calibration import lunar_lake
from fleetsim.run import run
from fleetsim.soc.baselines import IgpuOnly
from fleetsim.soc.engine import SoCEngine
from fleetsim.workloads.agent_traffic import AgentTraffic
from fleetsim.workloads.workload import Workload

MODEL = "Llama-3.2-3B"


def _config(pools: list[dict], slots: int, soc: bool) -> dict:
    return {"model": MODEL, "seed": 0,
            "cluster": {"pools": pools, **({"soc": {}} if soc else {}),
                        "link": {"latency_s": 0.0}},
            "engine": {"max_running": slots, "max_batched_tokens": 2048 + slots}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-min", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    traffic = AgentTraffic(reactive_per_min=args.per_min, num_proactive_flows=0,
                           duration_s=args.minutes * 60.0)
    cost = ModelCost(get_model(MODEL), 4.5)
    t0 = time.process_time()
    old = SoCEngine(lunar_lake(), cost, traffic, IgpuOnly(max_running=args.slots)).run()
    old_cpu = time.process_time() - t0
    reqs = old.requests
    wl = Workload(arrival_s=np.array([r.arrival_s for r in reqs]),
                  num_prompt_tokens=np.array([r.num_prompt_tokens for r in reqs]),
                  num_output_tokens=np.array([r.num_output_tokens for r in reqs]),
                  name="agent-xpu reactive")
    tokens = int(wl.num_output_tokens.sum())
    print(f"engine {native.engine()}; {len(reqs)} requests, {tokens} generated tokens; "
          f"CPU s per 1,000 generated tokens")
    rows = [("soc engine, iGPU only", old_cpu)]
    systems = (
        ("cluster.soc, iGPU only", [{"name": "igpu", "gpu": "igpu"}], True),
        ("cluster.soc, NPU prefill + iGPU decode",
         [{"name": "p", "gpu": "npu", "role": "prefill"},
          {"name": "d", "gpu": "igpu", "role": "decode"}], True),
        ("main engine, one H100", [{"name": "gpu", "gpu": "H100"}], False),
    )
    for label, pools, soc in systems:
        config = config_from_dict(_config(pools, args.slots, soc))
        t0 = time.process_time()
        result = run(config, workload=wl)
        rows.append((label, time.process_time() - t0))
        assert result.summary["num_finished"] == len(reqs)
    main_cpu = rows[-1][1]
    for label, cpu in rows:
        print(f"  {label:42s} {cpu / tokens * 1000:8.4f}  ({cpu / main_cpu:5.2f}x main)")


if __name__ == "__main__":
    main()
