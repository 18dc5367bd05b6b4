"""CPU per generated token: an SoC on the one engine (``cluster.soc``) against the main engine's
plain GPU replica, on the same requests.

Issue 20 asks a ported system to cost within 1.5x of the main engine per generated token (the
retired SoC loop, ``soc/engine.py``, cost 25-60x). The requests are Agent.xpu's reactive
traffic (Poisson, lengths from the Azure 2023 conversation trace, prompts capped at 2,048),
served by an iGPU engine that batches up to ``--slots`` requests, by prefill on the NPU with
decode on the iGPU (both on the shared DDR), and by Agent.xpu's scheduler (``agent_xpu``) on
that P/D pair. Two more main-engine runs set the SoC beside the same topology: a P/D pair of
H100s (the same steps and handoffs, no shared DDR) and that pair with prompts cut into
agent_xpu's 256-token chunks (the prefill side's steps under agent_xpu); the last line gives
those ratios, and ``agent_xpu, whole prompts`` (agent_xpu with 2,048-token chunks, a prompt a
step: not the paper's policy, but the most that fast-forward over a prompt's chunks could save)
against the pair with whole prompts. ``agent_xpu, N proactive flows`` adds ``--flows``
background flows to the reactive traffic (each issues its next request when its last one ends:
Agent.xpu's mixed traffic, two classes on the iGPU), per token it generates. CPU time is the
process's (``time.process_time``), the least of ``--repeat`` rounds of every system (a round
runs each once; the main engine's run takes about 17 ms, so one run of it is mostly noise:
measured once, its cost was overstated about 2x and every ratio understated as much); run it
with ``FLEETSIM_PURE=1`` to measure pure Python.

The last lines say whether the SoC keeps up with the traffic (preemptions, prompt tokens
recomputed, when the last request ends): past saturation (60 a minute: the iGPU's slots are
full and the last request ends after the arrival window) the CPU per token includes work
the simulated system repeats, where it repeats any, so ``--per-min 30`` is the load where
the ratio is the engine's alone.

``--planner`` adds the planner's own share for ``agent_xpu`` on NPU + iGPU: its plans (one per
step it does not fast-forward) and the CPU inside ``AgentXpuPlanner.plan`` (each call timed,
the timer's own cost included), per generated token.

``--scaling`` asks whether the cost follows the requests or the tokens: the P/D pair, without
and with ``agent_xpu``, on the same requests with every output one token long (prefill only),
as drawn, and 2x and 4x as long (least CPU of ``--repeat`` runs each; at 60 a minute the
longer outputs overload the iGPU, so run it at ``--per-min 30``).

    python benchmarks/soc_cost_per_token.py [--per-min 60] [--minutes 30] [--slots 8] [--flows 4]
                                            [--repeat 5] [--planner] [--scaling]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.policies.agent_xpu import AgentXpuPlanner
from fleetsim.run import run
from fleetsim.soc_run import run_agent_traffic
from fleetsim.workloads.agent_traffic import (
    AgentTraffic,
    LengthSampler,
    reactive_arrivals,
    streams,
)
from fleetsim.workloads.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_per_token import method_share  # noqa: E402

MODEL = "Llama-3.2-3B"


def _config(pools: list[dict], slots: int, soc: bool, batching: str | None,
            chunk_tokens: int = 2048, batching_args: dict | None = None) -> dict:
    policy = {"name": batching, **({"args": batching_args} if batching_args else {})}
    return {"model": MODEL, "seed": 0,
            "cluster": {"pools": pools, **({"soc": {}} if soc else {}),
                        "link": {"latency_s": 0.0}},
            "engine": {"max_running": slots, "max_batched_tokens": chunk_tokens + slots},
            "policy": {"batching": policy} if batching else {}}


def _workload(traffic: AgentTraffic) -> Workload:
    """The traffic's reactive requests, drawn as the engine's agent source draws them."""
    arrivals_rng, reactive_rng, _ = streams(traffic.seed)
    lengths = LengthSampler(reactive_rng, traffic.max_prompt_tokens, traffic.reactive_lengths)
    times = reactive_arrivals(traffic, arrivals_rng)
    drawn = np.array([lengths.draw() for _ in times], dtype=np.int64).reshape(-1, 2)
    return Workload(arrival_s=np.array(times), num_prompt_tokens=drawn[:, 0],
                    num_output_tokens=drawn[:, 1], name="agent-xpu reactive")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-min", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--flows", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds; each system's least CPU is reported")
    parser.add_argument("--planner", action="store_true",
                        help="also time agent_xpu's planner (plans, us a plan)")
    parser.add_argument("--scaling", action="store_true",
                        help="only: the P/D pair's CPU with outputs 1 token, 1x, 2x, 4x")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    traffic = AgentTraffic(reactive_per_min=args.per_min, num_proactive_flows=0,
                           duration_s=args.minutes * 60.0)
    wl = _workload(traffic)
    tokens = int(wl.num_output_tokens.sum())
    pd = [{"name": "p", "gpu": "npu", "role": "prefill"},
          {"name": "d", "gpu": "igpu", "role": "decode"}]
    if args.scaling:
        _scaling(wl, pd, args.slots, args.repeat)
        return
    print(f"engine {native.engine()}; {len(wl)} requests, {tokens} generated tokens; "
          f"CPU microseconds per generated token, least of {args.repeat} rounds")
    pd_h100 = [{"name": "p", "gpu": "H100", "role": "prefill"},
               {"name": "d", "gpu": "H100", "role": "decode"}]
    main_label = "main engine, one H100"
    chunk = AgentXpuPlanner().chunk_tokens
    whole = "cluster.soc, agent_xpu, whole prompts"
    systems = (  # (label, pools, on the SoC, batching, prompt tokens a step, its arguments)
        ("cluster.soc, iGPU only", [{"name": "igpu", "gpu": "igpu"}], True, None, 2048, None),
        ("cluster.soc, NPU prefill + iGPU decode", pd, True, None, 2048, None),
        ("cluster.soc, agent_xpu on NPU + iGPU", pd, True, "agent_xpu", 2048, None),
        # agent_xpu with a prompt in one step, not chunk by chunk: the most that fast-forward
        # over a prompt's chunks could save (the NPU's steps; not the same policy)
        (whole, pd, True, "agent_xpu", 2048, {"chunk_tokens": 2048}),
        (main_label, [{"name": "gpu", "gpu": "H100"}], False, None, 2048, None),
        # The main engine with the SoC's topology (a P/D pair: the same steps and handoffs)
        # and with agent_xpu's prompt chunks (its steps on the prefill side).
        ("main engine, H100 P/D pair", pd_h100, False, None, 2048, None),
        (f"main engine, H100 P/D pair, {chunk}-token chunks", pd_h100, False, None, chunk,
         None),
    )
    mixed = AgentTraffic(reactive_per_min=args.per_min, num_proactive_flows=args.flows,
                         duration_s=args.minutes * 60.0)
    best = {label: math.inf for label, *_ in systems}
    mixed_cpu, mixed_tokens = math.inf, 0
    served: dict[str, dict] = {}  # label -> its request columns (the same every round)
    for _round in range(args.repeat):  # (rounds interleave the systems: load drifts alike)
        for label, pools, soc, batching, chunk_tokens, batching_args in systems:
            config = config_from_dict(_config(pools, args.slots, soc, batching, chunk_tokens,
                                              batching_args))
            t0 = time.process_time()
            result = run(config, workload=wl)
            best[label] = min(best[label], time.process_time() - t0)
            assert result.summary["num_finished"] == len(wl)
            served[label] = result.records.requests
        config = config_from_dict(_config(pd, args.slots, True, "agent_xpu"))
        t0 = time.process_time()
        out = run_agent_traffic(config, mixed)
        mixed_cpu = min(mixed_cpu, time.process_time() - t0)
        mixed_tokens = int(out.records.requests["num_output_tokens"].sum())
    main_per_token = best[main_label] / tokens
    for label, cpu in best.items():
        print(f"  {label:48s} {cpu / tokens * 1e6:8.3f}  ({cpu / tokens / main_per_token:5.2f}x "
              f"main)")
    label = f"  agent_xpu, {args.flows} proactive flows ({mixed_tokens} tokens)"
    print(f"{label:50s} {mixed_cpu / mixed_tokens * 1e6:8.3f}  "
          f"({mixed_cpu / mixed_tokens / main_per_token:5.2f}x main)")
    same = best["main engine, H100 P/D pair"]
    print(f"  the same topology on the main engine: NPU prefill + iGPU decode "
          f"{best['cluster.soc, NPU prefill + iGPU decode'] / same:.2f}x the H100 P/D pair; "
          f"agent_xpu {best['cluster.soc, agent_xpu on NPU + iGPU'] / best[systems[-1][0]]:.2f}x "
          f"the pair with {chunk}-token chunks, {best[whole] / same:.2f}x with whole prompts")
    # Whether the SoC keeps up: past saturation a run's CPU per token includes the work the
    # simulated system repeats (prompts recomputed after preemption), not only the engine's.
    for label in ("cluster.soc, NPU prefill + iGPU decode", "cluster.soc, agent_xpu on NPU + iGPU"):
        r = served[label]
        print(f"  {label}: {int(r['num_preemptions'].sum()):,} preemptions, "
              f"{int(r['num_recomputed_tokens'].sum()):,} prompt tokens recomputed (prompts "
              f"{int(r['num_prompt_tokens'].sum()):,}), last request done at "
              f"{float(np.max(r['finish_s'])):,.0f} s of a {args.minutes * 60:,.0f} s window")
    if args.planner:
        config = config_from_dict(_config(pd, args.slots, True, "agent_xpu"))
        plans, plan_s = method_share(AgentXpuPlanner, "plan", lambda: run(config, workload=wl),
                                     args.repeat)
        print(f"  agent_xpu's planner: {plans:,} plans ({plans / len(wl):.1f} a request), "
              f"{plan_s / plans * 1e6:.2f} us a plan, {plan_s / tokens * 1e6:.3f} us a token "
              f"({plan_s / tokens / main_per_token:.1f}x the main engine's whole run)")



def _scaling(wl: Workload, pd: list[dict], slots: int, repeat: int) -> None:
    """CPU of the P/D pair on ``wl``'s requests with outputs of one token, and 1x, 2x, 4x
    as drawn."""
    print(f"engine {native.engine()}; {len(wl)} requests; CPU ms of the whole run, least of "
          f"{repeat}")
    outputs = (("1 token each", np.ones(len(wl), dtype=np.int64)),
               *((f"{k}x as drawn", wl.num_output_tokens * k) for k in (1, 2, 4)))
    for label, out in outputs:
        w = Workload(arrival_s=wl.arrival_s, num_prompt_tokens=wl.num_prompt_tokens,
                     num_output_tokens=out, name=wl.name)
        cells = []
        for batching in (None, "agent_xpu"):
            config = config_from_dict(_config(pd, slots, True, batching))
            best = math.inf
            for _ in range(repeat):
                t0 = time.process_time()
                result = run(config, workload=w)
                best = min(best, time.process_time() - t0)
            cells.append(f"{best * 1e3:7.1f} ms (last end {result.summary['makespan_s']:,.0f} s)")
        print(f"  outputs {label:13s} {int(out.sum()):9,} tokens   P/D pair {cells[0]}   "
              f"agent_xpu {cells[1]}")


if __name__ == "__main__":
    main()
