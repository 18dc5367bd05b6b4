"""Deployment planners on a swinging load: re-planning against static deployments.

Llama-3.1-8B on H100-SXM replicas (tp 1), Poisson arrivals of 2048-token prompts and 256-token
outputs whose rate swings twice between 2 and 20 req/s (``workload.rate_profile``, two "days"
in 1200 s). Compared:

- fixed deployments of N replicas (no ``[elastic]``), N = 1..6; the cheapest one that meets
  the SLO (99% of requests within TTFT 1 s and TPOT 50 ms, ``[slo]``'s defaults) is the best
  static deployment in hindsight;
- ``[elastic]`` with up to 8 GPUs: the ``static`` planner (the SLA sizing from the first
  window, then held), ``sla`` (Dynamo's SLA planner) at every 30 s monitoring point, with its
  constant and with a linear load forecast, ``sla`` under the ``threshold`` trigger,
  ``concurrency`` (Knative's KPA), and ``evolve`` (a policy of those families evolved by
  replaying each window; its modelled search time is printed as overhead).

Joins load weights from host over PCIe (the catalog's figure) plus ``--startup`` seconds.
Prints per run: SLO attainment, mean / p99 TTFT, GPU-seconds held, plans and changes; with
``--figure PATH``, the replicas each planner ran over time against the arrival rate.

    python benchmarks/elastic_swing.py [--pd] [--startup S] [--figure PATH]

``--pd``: a prefill and a decode pool (up to 4 H100-SXM each) and 4096-token prompts; fixed
deployments are (prefill, decode) replica pairs.
"""

from __future__ import annotations

import argparse
from typing import Any

from fleetsim.config import config_from_dict
from fleetsim.run import RunResult, run

PROFILE = [[0, 0.25], [300, 2.5], [600, 0.25], [900, 2.5], [1200, 0.25]]
BASE: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm", "tp": 1, "num_replicas": 1},
    "workload": {"trace": None, "rate_per_s": 8.0, "duration_s": 1200,
                 "prompt_tokens": {"kind": "fixed", "value": 2048},
                 "output_tokens": {"kind": "fixed", "value": 256},
                 "rate_profile": PROFILE},
}
PLANNED = {
    "static": {"planner": {"name": "static"}},
    "sla": {"planner": {"name": "sla"}},
    "sla linear": {"planner": {"name": "sla", "args": {"predictor": "linear"}}},
    "sla+threshold": {"planner": {"name": "sla"}, "trigger": {"name": "threshold"}},
    "concurrency": {"planner": {"name": "concurrency"}},
    "evolve": {"planner": {"name": "evolve"}},
}


# P/D (Dynamo's SLA planner's home): a prefill and a decode pool of H100-SXM, up to 4 GPUs
# each, 4096-token prompts.
PD_BASE: dict[str, Any] = {
    **BASE,
    "workload": {**BASE["workload"], "prompt_tokens": {"kind": "fixed", "value": 4096}},
}
PD_FIXED = ((1, 1), (2, 1), (1, 2), (2, 2), (3, 2), (3, 3))


def pd_pools(num_prefill: int, num_decode: int) -> dict[str, Any]:
    return {"pools": [
        {"name": "pre", "gpu": "h100-sxm", "role": "prefill", "num_replicas": num_prefill},
        {"name": "dec", "gpu": "h100-sxm", "role": "decode", "num_replicas": num_decode}]}


def fixed(n: int | tuple[int, int]) -> RunResult:
    if isinstance(n, tuple):
        return run(config_from_dict({**PD_BASE, "cluster": pd_pools(*n)}))
    return run(config_from_dict({**BASE, "hardware": {**BASE["hardware"], "num_replicas": n}}))


def planned(name: str, startup_s: float, pd: bool = False) -> RunResult:
    schedule = ([{"at_s": 0, "pool": "pre", "num_gpus": 4},
                 {"at_s": 0, "pool": "dec", "num_gpus": 4}] if pd
                else [{"at_s": 0, "pool": "default", "num_gpus": 8}])
    elastic = {"schedule": schedule, "monitor_interval_s": 30, "startup_s": startup_s,
               **PLANNED[name]}
    if pd:
        return run(config_from_dict({**PD_BASE, "cluster": pd_pools(1, 1), "elastic": elastic}))
    return run(config_from_dict({**BASE, "elastic": elastic}))


def row(label: str, r: RunResult, gpu_seconds: float) -> dict[str, Any]:
    s = r.summary
    e = s.get("elastic", {})
    return {"run": label, "slo": s["slo"]["attainment"], "ttft_mean_s": s["ttft_s"]["mean"],
            "ttft_p99_s": s["ttft_s"]["p99"], "gpu_s": gpu_seconds,
            "plans": e.get("num_plans", 0), "changes": e.get("num_changes", 0),
            "overhead_s": e.get("evolution", {}).get("search_overhead_s", 0.0)}


def replicas_over_time(r: RunResult) -> tuple[list[float], list[int]]:
    n = len(r.summary["pools"]) if "pools" in r.summary else 1
    times, counts = [0.0], [n]
    for t in r.summary["elastic"]["timeline"]:
        if t["action"] == "ready":
            n += 1
        elif t["action"] in ("remove",):
            n -= 1
        else:
            continue
        times.append(t["time_s"])
        counts.append(n)
    return times, counts


def fixed_policies(startup_s: float, pd: bool) -> None:
    """Each policy of the evolving planner's default space, held for the whole run."""
    from fleetsim.policies.evolve import EvolvePlanner

    planner = EvolvePlanner()
    scored = []
    for policy in planner.space():
        PLANNED[policy.label] = {
            "planner": {"name": policy.planner[0], "args": dict(policy.planner[1])},
            "trigger": {"name": policy.trigger[0], "args": dict(policy.trigger[1])}}
        r = planned(policy.label, startup_s, pd)
        x = row(policy.label, r, r.summary["elastic"]["gpu_seconds"])
        scored.append(((min(x["slo"], planner.target_attainment), -x["gpu_s"]), x))
        print(f"{x['run']:58} SLO {x['slo']:.3f} GPU-s {x['gpu_s']:6.0f}", flush=True)
    best = max(scored, key=lambda t: t[0])[1]
    print(f"best fixed policy in hindsight: {best['run']} SLO {best['slo']:.3f} "
          f"GPU-s {best['gpu_s']:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--startup", type=float, default=0.0, help="elastic.startup_s")
    ap.add_argument("--figure", default=None, help="write the replicas-over-time figure here")
    ap.add_argument("--pd", action="store_true", help="the P/D setting instead of mixed")
    ap.add_argument("--space", action="store_true",
                    help="instead: run every policy of evolve's space as a fixed policy; print "
                    "the best in hindsight by evolve's score")
    args = ap.parse_args()
    if args.space:
        fixed_policies(args.startup, args.pd)
        return
    rows, runs = [], {}
    for n in (PD_FIXED if args.pd else range(1, 7)):
        r = fixed(n)
        gpus = sum(n) if isinstance(n, tuple) else n
        rows.append(row(f"fixed {n}", r, gpus * r.summary["makespan_s"]))
    for name in PLANNED:
        r = planned(name, args.startup, args.pd)
        runs[name] = r
        rows.append(row(name, r, r.summary["elastic"]["gpu_seconds"]))
    print(f"{'run':16} {'SLO':>6} {'TTFT mean':>10} {'TTFT p99':>10} {'GPU-s':>8} "
          f"{'plans':>5} {'changes':>7} {'search s':>8}")
    for x in rows:
        print(f"{x['run']:16} {x['slo']:6.3f} {x['ttft_mean_s']:10.3f} {x['ttft_p99_s']:10.3f} "
              f"{x['gpu_s']:8.0f} {x['plans']:5d} {x['changes']:7d} {x['overhead_s']:8.1f}")
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.2))
        for name, r in runs.items():
            t, c = replicas_over_time(r)
            ax.step(t, c, where="post", label=name)
        if "evolve" in runs:  # when the evolving planner swapped its policy in
            for t in runs["evolve"].summary["elastic"]["evolution"]["serving"][1:]:
                ax.axvline(t["from_s"], color="0.6", lw=0.6, ls="--")
        rate = ax.twinx()
        rate.plot([p[0] for p in PROFILE], [8.0 * p[1] for p in PROFILE], "k:", label="rate")
        rate.set_ylabel("arrivals (req/s)")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("serving replicas")
        ax.legend(loc="upper left", fontsize=7)
        fig.tight_layout()
        fig.savefig(args.figure, dpi=110)


if __name__ == "__main__":
    main()
