"""Autellix (arXiv:2502.13965): programs as first-class citizens. ATLAS (least attained
service along the critical path, multi-level queues) with its locality-aware balancer
against vLLM's call-level FCFS, on program latency.

Parameters and their sources:
- the scheduler and the balancer: PLAS and ATLAS (least attained service per program, along
  the critical path for DAGs, discretised into multi-level queues) and the locality-aware
  balancer, as the paper's abstract and well-known secondary descriptions give them (no
  official code is public); queue boundaries and the pinning threshold are our
  assumptions (``fleetsim.policies.programs``);
- workloads: ShareGPT-like chat chains, BFCL-like tool-use chains and LATS trees (the paper's
  three), Poisson program arrivals (the paper's), generators' defaults
  (``docs/programs.md``);
- vLLM: ``token_budget`` with ``fcfs`` ordering per call and a least-loaded router (each call
  is a fresh request to vLLM);
- assumptions, not from the paper: Llama-3.1-8B on 4 H100 replicas, the rates below, 200
  programs per run.

The metric is mean program JCT; the headline ratio is vLLM's over ATLAS's at the highest
swept rate, per workload, averaged over the workloads (the paper reports 4-15x across its
settings).
"""

from __future__ import annotations

from typing import Any

from fleetsim.repro.frame import (
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    add,
    better_ratio,
    fmt,
)

NUM_PROGRAMS, QUICK_PROGRAMS = 200, 24
RATES = (2.0, 5.0, 10.0, 20.0)  # programs per second on 4 replicas (our choice: light to a burst)
QUICK_RATES = (10.0,)
WORKLOADS = ("chain", "tool_chain", "lats")
QUICK_WORKLOADS = ("tool_chain",)

# policy -> (batching, router)
POLICIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "atlas": ({"name": "atlas"}, {"name": "autellix_locality"}),
    "plas": ({"name": "plas"}, {"name": "autellix_locality"}),
    "vllm": ({"name": "token_budget"}, {"name": "least_loaded"}),
}


def config(policy: str, workload: str, rate: float, num_programs: int) -> dict[str, Any]:
    batching, router = POLICIES[policy]
    return {
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm", "num_replicas": 4},
        "cluster": {"router": router},
        "policy": {"batching": batching},
        "programs": {"generator": workload, "num_programs": num_programs,
                     "arrival": "poisson", "rate_per_s": rate},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},
        "seed": 0,
    }


def compare(ctx: ReproContext) -> Comparison:
    rates = QUICK_RATES if ctx.quick else RATES
    workloads = QUICK_WORKLOADS if ctx.quick else WORKLOADS
    n = QUICK_PROGRAMS if ctx.quick else NUM_PROGRAMS
    jct: dict[str, dict[tuple[str, str], float | None]] = {p: {} for p in POLICIES}
    for workload in workloads:
        for rate in rates:
            for policy in POLICIES:
                prog = ctx.run(policy, f"{workload}@{rate:g}",
                               config(policy, workload, rate, n)).summary["programs"]
                done = prog["num_unfinished"] == 0
                jct[policy][(workload, f"{rate:g}")] = prog["jct_s"]["mean"] if done else None
    # The table: per rate, the mean over workloads (None if a run left programs unfinished).
    results: dict[str, dict[str, float | None]] = {}
    for policy, values in jct.items():
        results[policy] = {}
        for rate in rates:
            xs = [values[(w, f"{rate:g}")] for w in workloads]
            results[policy][f"{rate:g}"] = (None if any(x is None for x in xs)
                                            else sum(xs) / len(xs))  # type: ignore[arg-type]
    top = f"{rates[-1]:g}"
    ratios, notes = [], []
    for workload in workloads:
        r = better_ratio(jct["atlas"][(workload, top)], jct["vllm"][(workload, top)], "lower")
        notes.append(f"{workload}: mean JCT per rate, s: " + "; ".join(
            f"{p} " + "/".join(fmt(jct[p][(workload, f'{x:g}')]) for x in rates)
            for p in POLICIES) + f"; vllm/atlas at {top}: "
            + fmt(r, "x"))
        if r is not None:
            ratios.append(r)
    ratio = sum(ratios) / len(ratios) if ratios else None
    # plas: ATLAS without the critical path (attained service of the whole program), the
    # same router; in the ratio's form (vllm / plas at the top rate, mean over workloads)
    plas = [better_ratio(jct["plas"][(w, top)], jct["vllm"][(w, top)], "lower")
            for w in workloads]
    plas_valid = [r for r in plas if r is not None]
    attribution = {"plas": sum(plas_valid) / len(plas_valid) if plas_valid else None}
    return Comparison(results=results, ratio=ratio, notes=notes, attribution=attribution)


AUTELLIX = add(Reproduction(
    key="autellix",
    paper=Paper(title="Autellix: An Efficient Serving Engine for LLM Agents as General "
                      "Programs", id="arXiv:2502.13965"),
    claim="4-15x better program latency than vLLM at the same throughput (ShareGPT, BFCL, "
          "LATS; Poisson arrivals).",
    setup=f"Llama-3.1-8B on 4 H100 replicas (assumption), chat chains, tool-use chains and "
          f"LATS trees (docs/programs.md), Poisson at {', '.join(f'{r:g}' for r in RATES)} "
          f"programs/s, {NUM_PROGRAMS} programs per run",
    system="atlas",
    baselines=("vllm", "plas"),
    baseline="vllm",
    metric=Metric(name="mean program JCT", unit="s", direction="lower"),
    ratio_definition="vllm's mean program JCT over atlas's at the highest rate, averaged "
                     "over the workloads",
    paper_ratio=None,
    paper_ratio_source="not recoverable: the paper's load levels, model, GPU and program "
                       "traces are not in what we could read, and its 4-15x is throughput of "
                       "programs at the same latency, not a JCT ratio at one rate",
    paper_best=15.0,
    loads=Loads(name="program rate", unit="programs/s", values=RATES,
                quick_values=QUICK_RATES),
    compare=compare,
))
