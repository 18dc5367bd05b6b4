"""Autellix (arXiv:2502.13965): programs as first-class citizens. ATLAS (least attained
service along the critical path, multi-level queues that preempt) with its locality-aware
balancer against vLLM's call-level FCFS, on throughput of programs at the same latency.

Parameters and their sources:
- the scheduler: PLAS and ATLAS as the paper names them: least attained service per program
  (along the critical path for DAGs, ATLAS), discretised into multi-level queues with
  anti-starvation, preempting lower-queue calls ("preempt and prioritize LLM calls based on
  their programs' previously completed calls", the abstract; a call that exhausts its
  queue's quantum is demoted, Figure 10). No official code is public; the queue boundaries,
  the starvation ratio and the pinning threshold are our assumptions
  (``fleetsim.policies.programs``), never tuned here;
- the balancer: Autellix's locality-aware balancer (long programs stay on their engine,
  short calls go to the least-used one; its Figure 14 compares it with round robin and
  least used on several engines);
- workload: the paper's Mixed workload of ShareGPT chats, BFCL tool-use chains and LATS
  trees (its Figure 11d: program sizes in calls are long-tailed, and more so mixed), the
  generators' cited defaults (``docs/programs.md``), Poisson program arrivals (the paper's);
- vLLM: ``token_budget`` (call-level FCFS, vLLM's defaults: 256 running, KV-limited
  admission, preemption by recompute) with a least-loaded router (each call a fresh request);
- model: Llama-3.1-8B (the paper's Figure 14 runs LLaMA-3.1-8B and 70B on several engines);
- assumptions, not from the paper: A100-80GB, 4 engines, the rates below (a sweep from light
  load through vLLM's knee into overload), 300 programs per run, and the latency target.

The paper's metric is throughput of programs at the same latency: the highest program
arrival rate at which a system's mean latency stays within a target, Autellix's over vLLM's.
Its latency is seconds per token; ours is the mean program slowdown (JCT over the
program's standalone time T_w, ``docs/programs.md``): both normalise a program's latency by
its size. The target is a mean slowdown of ``TARGET_SLOWDOWN`` (our assumption); the ratio
at other targets is in the notes.
"""

from __future__ import annotations

from typing import Any

from fleetsim.metrics.slo import crossing_rate
from fleetsim.repro.frame import (
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    add,
    fmt,
    is_bound,
)
from fleetsim.repro.sweep import sweep_rates

NUM_PROGRAMS, QUICK_PROGRAMS = 300, 150
RATES = (1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0)  # programs per second on 4 engines (our sweep)
QUICK_RATES = (2.0, 6.0, 16.0)
NUM_ENGINES = 4
MIXED = {"weights": [1.0, 1.0, 1.0, 0.0]}  # chat chains, tool chains, LATS (the paper's Mixed)
TARGET_SLOWDOWN = 2.0
"""Mean program JCT / T_w within which a rate counts (our assumption: programs take twice
their standalone time on average)."""
OTHER_TARGETS = (1.5, 3.0)
# A regime where the scheduler can matter (full runs only, in the notes): one engine, as the
# paper's Figure 12, on a GPU whose KV memory limits the running set (our choice: an
# L40S-48GB holds the 8B model with KV for about 200k tokens, so at the knee most of it is in
# use; on the A100s above KV stays under 13%), the same programs, rates through vLLM's knee.
# On one engine the balancer has nothing to choose, so the policies are the schedulers.
KV_BOUND_GPU = "l40s"
KV_BOUND_RATES = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
KV_BOUND_POLICIES = ("vllm", "atlas", "atlas-no-preempt")

# policy -> (batching, router). The first is the system, the second the baseline; the rest
# are ablations: each removes one of Autellix's mechanisms from it.
POLICIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "atlas": ({"name": "atlas"}, {"name": "autellix_locality"}),
    "vllm": ({"name": "token_budget"}, {"name": "least_loaded"}),
    "plas": ({"name": "plas"}, {"name": "autellix_locality"}),
    "atlas-least-loaded": ({"name": "atlas"}, {"name": "least_loaded"}),
    "fcfs-locality": ({"name": "token_budget"}, {"name": "autellix_locality"}),
    "atlas-no-preempt": ({"name": "atlas", "args": {"preemptive": False}},
                         {"name": "autellix_locality"}),
}
ABLATIONS = {
    "atlas-least-loaded": "the locality balancer (ATLAS with vLLM's router)",
    "fcfs-locality": "the ATLAS scheduler (vLLM's FCFS with the locality balancer)",
    "atlas-no-preempt": "preemption (ATLAS's queues, no preemption)",
    "plas": "the critical path (PLAS: the whole program's service)",
}


def config(policy: str, rate: float, num_programs: int) -> dict[str, Any]:
    batching, router = POLICIES[policy]
    return {
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "a100", "num_replicas": NUM_ENGINES},
        "cluster": {"router": router},
        "policy": {"batching": batching},
        "programs": {"generator": "mixed", "num_programs": num_programs, "args": MIXED,
                     "arrival": "poisson", "rate_per_s": rate},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},
        "seed": 0,
    }


def _ratio(rates: tuple[float, ...], system: list[float | None], baseline: list[float | None],
           target: float) -> tuple[float | None, bool]:
    """System's max rate over the baseline's at ``target``, and whether it is a bound."""
    a, b = crossing_rate(rates, system, target), crossing_rate(rates, baseline, target)
    if a is None or b is None or b <= 0:
        return None, False
    return a / b, is_bound(rates[-1], a, b)


def _mean_slowdown(run: Any) -> float | None:
    """The programs' mean slowdown; None where programs were left unfinished."""
    programs = run.summary["programs"]
    return programs["slowdown"]["mean"] if programs["num_unfinished"] == 0 else None


def compare(ctx: ReproContext) -> Comparison:
    rates = QUICK_RATES if ctx.quick else RATES
    n = QUICK_PROGRAMS if ctx.quick else NUM_PROGRAMS
    sweep = sweep_rates(ctx, tuple(POLICIES), rates, lambda policy, i: config(policy,
                                                                              rates[i], n))
    results = sweep.curves(_mean_slowdown)
    slow = {p: list(by_rate.values()) for p, by_rate in results.items()}
    extra = {p: [f"{run.summary['num_preemptions']}/"
                 f"{run.summary['kv_cache']['mean_used_fraction']:.2f}" for run in runs]
             for p, runs in sweep.runs.items()}
    headline = sweep.crossings(results, TARGET_SLOWDOWN)
    ratio, bound = _ratio(rates, slow["atlas"], slow["vllm"], TARGET_SLOWDOWN)
    attribution = {name: _ratio(rates, slow[name], slow["vllm"], TARGET_SLOWDOWN)[0]
                   for name in ABLATIONS}
    notes = [f"max program rate at mean slowdown <= {TARGET_SLOWDOWN:g}: " + ", ".join(
        f"{p} {fmt(headline[p])}" for p in POLICIES) + f" programs/s (sweep up to {rates[-1]:g}"
        + ("; a bound" if bound else "") + ")"]
    for target in OTHER_TARGETS:
        other, other_bound = _ratio(rates, slow["atlas"], slow["vllm"], target)
        notes.append(f"atlas over vllm at mean slowdown <= {target:g}: {fmt(other, 'x')}"
                     + (" (a bound)" if other_bound else ""))
    notes.extend(f"{p}: mean slowdown per rate " + "/".join(fmt(v) for v in slow[p])
                 + "; preemptions/mean KV used per rate " + " ".join(extra[p])
                 for p in POLICIES)
    notes.extend(f"{name} removes {what}" for name, what in ABLATIONS.items())
    if not ctx.quick:
        notes.extend(kv_bound_notes(ctx))
    return Comparison(results=results, ratio=ratio, headline=headline, notes=notes,
                      attribution=attribution, ratio_is_bound=bound,
                      reference=("target", TARGET_SLOWDOWN))


def kv_bound_config(policy: str, rate: float) -> dict[str, Any]:
    """The main run's config for one engine of ``KV_BOUND_GPU``."""
    return {**config(policy, rate, NUM_PROGRAMS),
            "hardware": {"gpu": KV_BOUND_GPU, "num_replicas": 1}}


def kv_bound_notes(ctx: ReproContext) -> list[str]:
    """The schedulers where KV binds (``KV_BOUND_GPU``, one engine): slowdown, KV in use and
    preemptions per rate, and the throughput ratio at the target against vLLM."""
    rates = KV_BOUND_RATES
    sweep = sweep_rates(ctx, KV_BOUND_POLICIES, rates,
                        lambda policy, i: kv_bound_config(policy, rates[i]),
                        prefix="kv-bound@")
    slow = {p: list(v.values()) for p, v in sweep.curves(_mean_slowdown).items()}
    where = (f"one {KV_BOUND_GPU.upper()} engine (KV binds; one engine as the paper's "
             f"Figure 12)")
    notes = [f"{where}, {p}: mean slowdown per rate "
             + "/".join(fmt(v) for v in slow[p]) + " at " + "/".join(f"{r:g}" for r in rates)
             + " programs/s; preemptions/mean KV used per rate " + " ".join(
                 f"{run.summary['num_preemptions']}/"
                 f"{run.summary['kv_cache']['mean_used_fraction']:.2f}"
                 for run in sweep.runs[p])
             for p in KV_BOUND_POLICIES]
    for p in KV_BOUND_POLICIES[1:]:
        ratio, bound = _ratio(rates, slow[p], slow["vllm"], TARGET_SLOWDOWN)
        at = {target: _ratio(rates, slow[p], slow["vllm"], target)[0]
              for target in OTHER_TARGETS}
        notes.append(f"{where}: {p} over vllm at mean slowdown <= {TARGET_SLOWDOWN:g}: "
                     f"{fmt(ratio, 'x')}" + (" (a bound)" if bound else "") + "; "
                     + ", ".join(f"<= {t:g}: {fmt(r, 'x')}" for t, r in at.items()))
    return notes


AUTELLIX = add(Reproduction(
    key="autellix",
    paper=Paper(title="Autellix: An Efficient Serving Engine for LLM Agents as General "
                      "Programs", id="arXiv:2502.13965"),
    claim="4-15x higher throughput of programs at the same latency than vLLM (ShareGPT, "
          "BFCL, LATS and their mix; Poisson arrivals).",
    setup=f"Llama-3.1-8B on {NUM_ENGINES} A100-80GB engines (assumption), the Mixed workload "
          f"(chat chains, tool-use chains, LATS trees; docs/programs.md), Poisson at "
          f"{', '.join(f'{r:g}' for r in RATES)} programs/s, {NUM_PROGRAMS} programs per run",
    system="atlas",
    baselines=tuple(p for p in POLICIES if p != "atlas"),
    baseline="vllm",
    metric=Metric(name="mean program slowdown (JCT / T_w)", unit="x", direction="lower"),
    headline_metric=Metric(name=f"max program rate at mean slowdown <= {TARGET_SLOWDOWN:g}",
                           unit="programs/s", direction="higher"),
    ratio_definition=f"atlas's max program arrival rate at mean slowdown <= "
                     f"{TARGET_SLOWDOWN:g} over vllm's (crossings interpolated in the rate "
                     f"sweep)",
    paper_ratio=None,
    paper_ratio_source="not recoverable: the paper's Figures 12 (one engine) and 14 (several) "
                       "plot latency against program rate per workload, but their values, "
                       "the GPU and the latency target are not in what we could read (the "
                       "figure captions and the abstract); 4-15x is its range over settings",
    paper_best=15.0,
    loads=Loads(name="program rate", unit="programs/s", values=RATES,
                quick_values=QUICK_RATES),
    compare=compare,
))
