"""CPU per generated token of the systems ported onto the one engine, against the main
engine's plain replicas on the same requests, as ratios measured in one process.

Issue 20 asks each ported system to cost within 1.5x of the main engine per generated token
(the side loops they replaced cost 3-8x on decode-heavy load). Two families, each on its
reproduction's configs and one set of requests:

- LoongServe (``esp`` group planner on an instance group, ``repro/loongserve.py``) against
  vLLM and LightLLM-SplitFuse replicas, on the reproduction's Mixed lengths and on ShareGPT
  lengths (decode-heavy); on ShareGPT also against vLLM on LoongServe's own instances (one
  replica per instance, its GPUs and TP: the same topology, which Mixed's longest prompts do
  not fit);
- ExpertPlex (P and D attention groups on one shared expert pool, ``repro/expertplex.py``,
  its best split ``attn P8 D8 + pool 16``) against instance-level P/D (2P+2D x8) and
  colocated instances (4x8), 32 H200s each, on the reproduction's ShareGPT rows at 4 and
  8 req/s per GPU.

CPU time is the process's (``time.process_time``), so other jobs on the machine do not count,
the least of ``--repeat`` rounds that run every system once each (a run of the cheapest
baseline takes tens of milliseconds: once is mostly noise); run it with ``FLEETSIM_PURE=1``
to measure pure Python.

``--polls`` adds, for LoongServe, what polling less often would buy: its run with the
planner's ``max_wait_steps`` (the periodic admission between arrivals and finishes, 10 in
the artifact) at 10, 100 and 10^6, against vLLM on the same requests, with the mean TTFT
each gives (results change: this is the price of a poll cadence the code does not have).

``--planner`` adds, for LoongServe, the planner's own share: the plans a request costs and
the CPU inside ``EspPlanner.plan`` (each call timed, the timer's own cost included), against
the main engine's whole run per request: the floor that planning at every arrival and finish
sets under the per-token ratio (docs/groups.md).

    python benchmarks/cost_per_token.py [--requests N] [--only esp|expertplex] [--repeat 3]
                                        [--planner] [--polls]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fleetsim import native

ESP_LOADS = (("mixed", 0.4), ("sharegpt", 4.0))  # (dataset, req/s): Mixed near ESP's knee
ESP_SYSTEMS = ("loongserve", "loongserve-no-esp", "lightllm-sf", "vllm")
PLEX_RATES_PER_GPU = (4.0, 8.0)  # below and past the baselines' knee (~7 req/s per GPU)
PLEX_SYSTEMS = {"expertplex": ("expertplex", "attn P8 D8 + pool 16"),
                "pd_instance": ("pd_instance", "2P+2D x8"),
                "pd_colocated": ("pd_colocated", "4x8 colocated")}


def cpu_s(fn: Callable[..., object], *args: object, **kwargs: object) -> float:
    start = time.process_time()
    fn(*args, **kwargs)
    return time.process_time() - start


def report(label: str, tokens: int, cost_s: dict[str, float], system: str,
           main: tuple[str, ...]) -> None:
    per = {s: c / tokens * 1e6 for s, c in cost_s.items()}  # us per generated token
    ref = min(main, key=lambda s: per[s])
    print(f"{label}, {tokens:,} output tokens: "
          + ", ".join(f"{s} {v:.3f} us" for s, v in per.items())
          + f"; {system} / main engine ({ref}) {per[system] / per[ref]:.2f}x")


def least_cpu_s(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each run's least CPU over ``repeat`` rounds (a round runs each once, in order)."""
    best = dict.fromkeys(runs, float("inf"))
    for _round in range(repeat):
        for name, fn in runs.items():
            best[name] = min(best[name], cpu_s(fn))
    return best


POLL_STEPS = (10, 100, 10**6)  # the artifact's max_wait_steps, 10x, and never in practice


def esp(num_requests: int, repeat: int, planner: bool, polls: bool = False) -> None:
    from fleetsim.config import config_from_dict
    from fleetsim.repro.loongserve import baseline_config
    from fleetsim.run import run
    from fleetsim.workloads.long_context import workload

    for dataset, rate in ESP_LOADS:
        wl = workload(dataset, num_requests, rate, seed=0)
        runs: dict[str, Callable[[], object]] = {}
        for system in ESP_SYSTEMS:
            cfg = config_from_dict(baseline_config(system, "mixed"))
            run(cfg, workload=workload(dataset, 8, rate, seed=1))  # warm the step tables
            runs[system] = functools.partial(run, cfg, workload=wl)
        if dataset == "sharegpt":  # (Mixed's longest prompts fit no single instance)
            cfg = config_from_dict(same_topology(baseline_config("vllm", "mixed"),
                                                 baseline_config("loongserve", "mixed")))
            run(cfg, workload=workload(dataset, 8, rate, seed=1))
            runs[SAME_TOPOLOGY] = functools.partial(run, cfg, workload=wl)
        cost = least_cpu_s(runs, repeat)
        report(f"LoongServe, {dataset} @ {rate:g} req/s", int(wl.num_output_tokens.sum()),
               cost, "loongserve", ("lightllm-sf", "vllm"))
        if SAME_TOPOLOGY in cost:
            print(f"  on the same instances: loongserve / {SAME_TOPOLOGY} "
                  f"{cost['loongserve'] / cost[SAME_TOPOLOGY]:.2f}x")
        if planner:
            from fleetsim.policies.esp import EspPlanner

            plans, plan_s = method_share(EspPlanner, "plan", runs["loongserve"], repeat)
            n = len(wl)
            print(f"  planner: {plans:,} plans ({plans / n:.2f} a request), "
                  f"{plan_s / plans * 1e6:.1f} us a plan, {plan_s / n * 1e6:.1f} us a request; "
                  f"vllm's whole run {cost['vllm'] / n * 1e6:.1f} us a request")
        if polls:
            _polls(dataset, rate, wl, runs["vllm"], repeat)


def _polls(dataset: str, rate: float, wl: Any, vllm: Callable[[], object],
           repeat: int) -> None:
    """LoongServe at each ``POLL_STEPS`` against vLLM (``vllm``), on ``wl``: the ratio of
    their CPU and the mean TTFT."""
    import copy

    from fleetsim.config import config_from_dict
    from fleetsim.repro.loongserve import baseline_config
    from fleetsim.run import run
    from fleetsim.workloads.long_context import workload

    runs: dict[str, Callable[[], object]] = {"vllm": vllm}
    for steps in POLL_STEPS:
        config = copy.deepcopy(baseline_config("loongserve", "mixed"))
        config["group"]["planner"].setdefault("args", {})["max_wait_steps"] = steps
        cfg = config_from_dict(config)
        run(cfg, workload=workload(dataset, 8, rate, seed=1))
        runs[str(steps)] = functools.partial(run, cfg, workload=wl)
    cost = least_cpu_s(runs, repeat)
    cells = []
    for steps in POLL_STEPS:
        req = runs[str(steps)]().records.requests  # (deterministic: the same as timed)
        ttft = float(np.nanmean(req["first_token_s"] - req["arrival_s"]))
        cells.append(f"{steps:,}: {cost[str(steps)] / cost['vllm']:.2f}x vllm, "
                     f"mean TTFT {ttft:.2f} s")
    print("  max_wait_steps " + "; ".join(cells))


SAME_TOPOLOGY = "vllm on the instances"
"""vLLM as plain replicas on LoongServe's instances (one per instance, its GPUs and TP):
the main engine on the same topology, where every prompt fits one instance."""


def same_topology(vllm: dict[str, Any], loongserve: dict[str, Any]) -> dict[str, Any]:
    """``vllm``'s config on ``loongserve``'s hardware (its instances as replicas)."""
    return {**vllm, "hardware": dict(loongserve["hardware"])}


def method_share(cls: type, name: str, fn: Callable[[], object],
                 repeat: int) -> tuple[int, float]:
    """(calls, CPU seconds inside ``cls.name``) in the least of ``repeat`` runs of ``fn``:
    the method is wrapped in a timer for the runs (an interpreted class's: a planner)."""
    method = getattr(cls, name)
    tally = [0, 0.0]

    def timed(*args: object) -> object:
        start = time.process_time()
        try:
            return method(*args)
        finally:
            tally[0] += 1
            tally[1] += time.process_time() - start

    best = (0, float("inf"))
    setattr(cls, name, timed)
    try:
        for _round in range(repeat):
            tally[:] = [0, 0.0]
            fn()
            if tally[1] < best[1]:
                best = (int(tally[0]), float(tally[1]))
    finally:
        setattr(cls, name, method)
    return best


def expertplex(num_requests: int, repeat: int) -> None:
    from fleetsim.expert_pool import Limits, simulate
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.moe.expertplex import CostModel, sm_policy
    from fleetsim.repro.expertplex import ExpertPlexSetup, layouts, workload

    setup = ExpertPlexSetup()
    cost = CostModel(get_model(setup.model), get_gpu("H200"), setup.tile_m,
                     nvlink_domain=setup.nvlink_domain)
    by_label = {(kind, lay.label): lay for kind, lays in layouts(setup, cost).items()
                for lay in lays}
    unit, prompts, outputs = workload(setup, num_requests)
    limits = Limits(token_budget_per_gpu=setup.token_budget_per_gpu,
                    max_decode_per_gpu=setup.max_decode_per_gpu)
    mean_context = float(np.mean(prompts + outputs / 2))
    for rate in PLEX_RATES_PER_GPU:
        arrivals = unit / (rate * setup.gpu_budget)
        runs: dict[str, Callable[[], object]] = {}
        for name, key in PLEX_SYSTEMS.items():
            layout = by_label[key]
            policy = sm_policy(cost, layout, mean_context,
                               max_decode_per_gpu=setup.max_decode_per_gpu,
                               tpot_slo_s=setup.tpot_slo_s, sm_cluster=setup.sm_cluster)
            simulate(layout, cost, limits, policy, arrivals[:8], prompts[:8], outputs[:8])
            runs[name] = functools.partial(simulate, layout, cost, limits, policy, arrivals,
                                           prompts, outputs)
        cost_s = least_cpu_s(runs, repeat)
        report(f"ExpertPlex, ShareGPT @ {rate:g} req/s per GPU ({rate * setup.gpu_budget:g} "
               f"req/s)", int(outputs.sum()), cost_s, "expertplex",
               ("pd_instance", "pd_colocated"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=None,
                        help="requests per run (default: 480 LoongServe, 3,000 ExpertPlex)")
    parser.add_argument("--only", choices=("esp", "expertplex"), default=None)
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds; each system's least CPU is reported")
    parser.add_argument("--planner", action="store_true",
                        help="also time LoongServe's planner (plans a request, us a plan)")
    parser.add_argument("--polls", action="store_true",
                        help="also run LoongServe with fewer polls (max_wait_steps 10, 100, "
                             "10^6; results change)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    print(f"engine {native.engine()}; CPU microseconds per generated token, least of "
          f"{args.repeat} rounds")
    if args.only in (None, "esp"):
        esp(args.requests or 480, args.repeat, args.planner, args.polls)
    if args.only in (None, "expertplex"):
        expertplex(args.requests or 3000, args.repeat)


if __name__ == "__main__":
    main()
