"""Agent.xpu (arXiv:2506.24045): reactive and proactive LLM flows on a laptop SoC's NPU and iGPU,
against an iGPU-only engine and a static NPU-iGPU tensor partition.

Parameters and their sources (the paper's two arXiv abstracts, v1 and v2; only they could be
read, not the body, so the mechanisms are theirs and the numbers ours):
- SoC: Intel Core Ultra 7 258V (Lunar Lake), the paper's "Intel Core Ultra SoC" [our reading
  of the platform]; peaks from Intel's figures (NPU 48 INT8 TOPS, Arc 140V 64 INT8 TOPS,
  LPDDR5X-8533 at 136.5 GB/s), efficiencies from public measurements on that chip
  (``perf/soc_calibration.py``), never from the paper's results;
- model: Llama-3.2-3B (meta-llama config.json), 4.5-bit weights (llama.cpp Q4_0) [our choice:
  a laptop-class agent model; the paper's model is not in the abstracts];
- baselines [paper]: an iGPU-only engine and static NPU-iGPU inference with the best tensor
  partition, both FCFS, one request at a time ("designed for isolated inferences", v1);
- workload [our choice, the paper's is not in the abstracts]: reactive requests Poisson at
  1, 2 and 4 per minute; 4 proactive flows, each issuing its next request when the last ends;
  (prompt, output) lengths from the Azure LLM 2023 conversation trace, prompts capped at 2,048;
  30 minutes of arrivals (3 with --quick);
- Agent.xpu: 256-token prefill chunks, 10% slack for piggybacking and DDR sharing [ours]; the
  replication plan's chunk sweep (8/16/32/64/256) runs at 2 per minute in the full run;
- attribution: the iGPU-only engine with a reactive-first rule (``ABLATIONS``: a priority
  queue, and the same with proactive requests stopped between steps), no NPU, no chunking,
  no backfill: how much of the cut a simple priority rule carries; and Agent.xpu without its
  bandwidth-aware dispatch (``BANDWIDTH_BLIND``: proactive prefill on the NPU runs beside a
  reactive decode on the iGPU whatever it costs that decode);
- the curve over background load: 0-8 proactive flows at 2 per minute (full run, notes).

Metrics as the paper: reactive latency (arrival to last token; mean / P90 / P99) and
proactive throughput (proactive requests finished per minute within the arrival window).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.config import SimConfig, config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost, TensorSplitSteps
from fleetsim.perf.soc_calibration import lunar_lake, model_errors
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
    setup_from,
)
from fleetsim.soc_pools import affinity
from fleetsim.soc_run import run_agent_traffic
from fleetsim.workloads.agent_traffic import AgentTraffic

POLICIES = ("agent-xpu", "igpu-only", "static-partition")
# Ablations on the iGPU-only engine (attribution): a simple reactive-first rule, with no NPU,
# no chunked prefill and no backfill; "next" starts the earliest reactive request when the
# engine is free (no preemption), "first" also stops a proactive request between its steps.
ABLATIONS = {"igpu-reactive-next": "reactive_next", "igpu-reactive-first": "reactive_first"}
# Agent.xpu with bandwidth-aware dispatch switched off (the policy's ``bandwidth_aware``).
BANDWIDTH_BLIND = "agent-xpu-bandwidth-blind"
BACKGROUND_FLOWS = (0, 1, 2, 4, 8)  # the curve over background load, at 2 requests/min
RATES = (1.0, 2.0, 4.0)  # reactive requests per minute
QUICK_RATES = (2.0,)
CHUNK_SWEEP = (8, 16, 32, 64, 256)  # the replication plan's preemption chunks [S]
PAPER_LATENCY_CUT = 0.91  # v2: "reduces reactive latency by at least 91%"
PAPER_THROUGHPUT = (1.2, 4.9)  # v2: "1.2-4.9x proactive throughput"


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentXpuSetup:
    """What ``--set`` may change (``fleetsim repro agent-xpu --set chunk_tokens=64``)."""

    duration_s: float = 1800.0
    """Seconds of arrivals (30 min: about 30 reactive requests at the lowest rate)."""
    num_proactive_flows: int = 4
    chunk_tokens: int = 256
    reactive_slack: float = 0.10
    max_running: int = 1
    """Requests the baselines serve at once (1: isolated inference)."""
    model: str = "Llama-3.2-3B"
    bits_per_weight: float = 4.5
    max_prompt_tokens: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("duration_s", 0 < self.duration_s <= 86_400, "must be in (0, 86400] s"),
            ("num_proactive_flows", 0 <= self.num_proactive_flows <= 64, "must be in 0..64"),
            ("chunk_tokens", 1 <= self.chunk_tokens <= 8192, "must be in 1..8192 tokens"),
            ("reactive_slack", 0 <= self.reactive_slack <= 1, "must be in [0, 1]"),
            ("max_running", 1 <= self.max_running <= 64, "must be in 1..64"),
            ("bits_per_weight", 1 <= self.bits_per_weight <= 16, "must be in [1, 16]"),
            ("max_prompt_tokens", 1 <= self.max_prompt_tokens <= 131_072,
             "must be in 1..131072"),
        )
        for name, ok, fix in checks:
            if not ok:
                raise FleetsimInputError(name, getattr(self, name), fix)


QUICK = {"duration_s": 180.0}


@dataclass(frozen=True, slots=True)
class OnEngine:
    """A system of the comparison on the one engine (``cluster.soc``): one replica per pool
    on its accelerator, steps on the shared DDR, the requests ordered by ``ordering``
    (``priority``: reactive before proactive)."""

    pools: tuple[tuple[str, str, str], ...]  # (name, accelerator, role)
    ordering: str = "fcfs"
    pause: bool = False
    """Serve the best ``max_running`` requests each step and pause the others, KV kept
    (``serve_best``), instead of running ``max_running`` requests to their end."""
    agent_xpu: bool = False
    """Agent.xpu's scheduler (the ``agent_xpu`` batching policy) on every pool."""
    bandwidth_aware: bool = True
    """With ``agent_xpu``: its bandwidth-aware dispatch on (the policy's argument)."""
    max_running: int | None = None
    """Requests served at once (None: the setup's ``max_running``)."""


System = OnEngine

# The iGPU-only baselines as the engine runs them: a whole prompt in one step, then its
# decodes, one request at a time (max_running), FCFS or reactive first without preemption.
IGPU = (("igpu", "igpu", "mixed"),)
SPLIT = (("soc", "npu+igpu", "mixed"),)  # every step split over both (static partition)
RESIDENT = 256  # requests a pausing engine keeps resident (far above the flows plus arrivals)


def agent_xpu_system(setup: AgentXpuSetup, cost: ModelCost) -> OnEngine:
    """Agent.xpu: prefill on the accelerator faster for a chunk, decode on the one faster for
    a decode step (its offline profile; NPU and iGPU on the Core Ultra), as a P/D cluster."""
    prefill, decode = affinity(lunar_lake(), cost, setup.chunk_tokens)
    if prefill == decode:  # one accelerator wins both stages: it runs everything
        return OnEngine(((prefill, prefill, "mixed"),), ordering="priority", agent_xpu=True)
    return OnEngine(((prefill, prefill, "prefill"), (decode, decode, "decode")),
                    ordering="priority", agent_xpu=True)


def schedulers(setup: AgentXpuSetup, cost: ModelCost) -> dict[str, System]:
    return {
        "agent-xpu": agent_xpu_system(setup, cost),
        "igpu-only": OnEngine(IGPU),
        "static-partition": OnEngine(SPLIT),
        "igpu-reactive-next": OnEngine(IGPU, ordering="priority"),
        "igpu-reactive-first": OnEngine(IGPU, ordering="priority", pause=True),
        BANDWIDTH_BLIND: dataclasses.replace(agent_xpu_system(setup, cost),
                                             bandwidth_aware=False),
    }


@dataclass(frozen=True, slots=True)
class Served:
    """One run's requests as arrays (either engine), for ``summarize``."""

    reactive: np.ndarray
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    duration_s: float
    end_s: float
    busy_s: dict[str, float]


def traffic(setup: AgentXpuSetup, rate_per_min: float) -> AgentTraffic:
    return AgentTraffic(reactive_per_min=rate_per_min,
                        num_proactive_flows=setup.num_proactive_flows,
                        duration_s=setup.duration_s,
                        max_prompt_tokens=setup.max_prompt_tokens, seed=setup.seed)


def _batching(setup: AgentXpuSetup, system: OnEngine) -> dict[str, Any]:
    if system.agent_xpu:
        return {"batching": {"name": "agent_xpu", "args": {
            "chunk_tokens": setup.chunk_tokens, "reactive_slack": setup.reactive_slack,
            "bandwidth_aware": system.bandwidth_aware}}}
    if system.pause:
        return {"batching": {"name": "serve_best", "args": {
            "max_serving": setup.max_running, "ordering": system.ordering}}}
    return {}


def engine_config(setup: AgentXpuSetup, system: OnEngine) -> SimConfig:
    resident = system.pause or system.agent_xpu
    max_running = system.max_running or setup.max_running
    # Baselines: every prompt in one step, as the on-device engines run it. Agent.xpu: a
    # chunk per step beside every resident request's decode. Paused requests stay resident
    # (their KV kept) beside the ones served.
    budget = (setup.chunk_tokens + RESIDENT if system.agent_xpu
              else setup.max_prompt_tokens + max_running)
    return config_from_dict({
        "model": setup.model, "seed": setup.seed,
        "cluster": {"pools": [{"name": n, "gpu": a, "role": r} for n, a, r in system.pools],
                    "soc": {"bits_per_weight": setup.bits_per_weight},
                    "link": {"latency_s": 0.0}},
        "engine": {"max_running": RESIDENT if resident else max_running,
                   "max_batched_tokens": budget},
        "policy": {"ordering": system.ordering, **_batching(setup, system)}})


def simulate(setup: AgentXpuSetup, rate_per_min: float, system: System) -> Served:
    out = run_agent_traffic(engine_config(setup, system), traffic(setup, rate_per_min))
    r = out.records.requests
    reactive = np.isin(r["request_id"], np.array(sorted(out.reactive_ids), dtype=np.int64))
    return Served(reactive, r["arrival_s"], r["first_token_s"], r["finish_s"],
                  r["num_prompt_tokens"], r["num_output_tokens"], setup.duration_s,
                  out.end_s, dict(out.busy_s_by_pool))


def summarize(result: Served) -> dict[str, Any]:
    rx = result.reactive
    latency = (result.finish_s - result.arrival_s)[rx]
    ttft = (result.first_token_s - result.arrival_s)[rx]
    latency, ttft = latency[~np.isnan(latency)], ttft[~np.isnan(ttft)]
    done = ~rx & (result.finish_s <= result.duration_s)
    minutes = result.duration_s / 60.0

    def stat(a: np.ndarray, q: float | None) -> float | None:
        if a.size == 0:
            return None
        return float(a.mean() if q is None else np.percentile(a, q))

    return {
        "num_reactive": int(rx.sum()),
        "reactive_latency_mean_s": stat(latency, None),
        "reactive_latency_p90_s": stat(latency, 90),
        "reactive_latency_p99_s": stat(latency, 99),
        "reactive_ttft_mean_s": stat(ttft, None),
        "proactive_per_min": int(done.sum()) / minutes,
        "proactive_tokens_per_s": float((result.num_prompt_tokens[done]
                                         + result.num_output_tokens[done]).sum())
        / result.duration_s,
        "busy_share": {a: s / result.end_s for a, s in result.busy_s.items()},
        "end_s": result.end_s,
    }


def run_summaries(ctx: ReproContext, runs: list[tuple[str, AgentXpuSetup, float, System]]
                  ) -> list[dict[str, Any]]:
    """The summaries of ``runs`` (progress label, setup, reactive requests/min, system),
    independent simulations spread over ``ctx.subruns``; in ``runs``' order."""
    out = ctx.subruns.map(_summary, [(setup, rate, system) for _, setup, rate, system in runs])
    if ctx.progress is not None:
        for label, *_ in runs:
            ctx.progress(label)
    return out


def _summary(item: tuple[AgentXpuSetup, float, System]) -> dict[str, Any]:
    """One run's summary (``run_summaries``), in a helper process or here."""
    setup, rate, system = item
    return summarize(simulate(setup, rate, system))


def compare(ctx: ReproContext) -> Comparison:
    setup = setup_from(ctx, AgentXpuSetup, QUICK, "agent-xpu")
    cost = ModelCost(get_model(setup.model), setup.bits_per_weight)
    rates = QUICK_RATES if ctx.quick else RATES
    results: dict[str, dict[str, float | None]] = {
        p: {} for p in (*POLICIES, *ABLATIONS, BANDWIDTH_BLIND)}
    summaries: dict[tuple[str, str], dict[str, Any]] = {}
    runs = [(policy, rate, scheduler) for rate in rates
            for policy, scheduler in schedulers(setup, cost).items()]
    done = run_summaries(ctx, [(f"{policy} @ {rate:g}/min", setup, rate, scheduler)
                               for policy, rate, scheduler in runs])
    for (policy, rate, _), s in zip(runs, done, strict=True):
        label = f"{rate:g}"
        summaries[(policy, label)] = s
        results[policy][label] = s["reactive_latency_mean_s"]
        ctx.keep(policy, label, s, {"policy": policy, "reactive_per_min": rate,
                                    **dataclasses.asdict(setup)})
    comparison = _comparison(setup, cost, rates, results, summaries)
    if not ctx.quick:
        comparison.notes.extend(background_curve(setup, cost, ctx))
        comparison.notes.extend(chunk_sweep(setup, cost, ctx))
        comparison.notes.extend(sensitivity(setup, cost, ctx))
    return comparison


def _comparison(setup: AgentXpuSetup, cost: ModelCost, rates: tuple[float, ...],
                results: dict[str, dict[str, float | None]],
                summaries: dict[tuple[str, str], dict[str, Any]]) -> Comparison:
    notes: list[str] = []
    latency_ratios, throughput_ratios = [], []
    for rate in rates:
        label = f"{rate:g}"
        ours = summaries[("agent-xpu", label)]
        for base in POLICIES[1:]:
            theirs = summaries[(base, label)]
            ratio = better_ratio(ours["reactive_latency_mean_s"],
                                 theirs["reactive_latency_mean_s"], "lower")
            thr = better_ratio(ours["proactive_per_min"], theirs["proactive_per_min"], "higher")
            latency_ratios.append(ratio)
            throughput_ratios.append(thr)
            cut = None if ratio is None else 1.0 - 1.0 / ratio
            notes.append(
                f"{label}/min vs {base}: reactive latency mean/P90/P99 "
                f"{fmt(ours['reactive_latency_mean_s'])}/{fmt(ours['reactive_latency_p90_s'])}/"
                f"{fmt(ours['reactive_latency_p99_s'])} s vs "
                f"{fmt(theirs['reactive_latency_mean_s'])}/{fmt(theirs['reactive_latency_p90_s'])}"
                f"/{fmt(theirs['reactive_latency_p99_s'])} s = {fmt(cut and cut * 100, '%', 0)} "
                f"lower (paper: >= {PAPER_LATENCY_CUT:.0%}); TTFT "
                f"{fmt(ours['reactive_ttft_mean_s'])} vs {fmt(theirs['reactive_ttft_mean_s'])} s; "
                f"proactive {fmt(ours['proactive_per_min'])} vs "
                f"{fmt(theirs['proactive_per_min'])} req/min = {fmt(thr, 'x')} (paper: "
                f"{PAPER_THROUGHPUT[0]}-{PAPER_THROUGHPUT[1]}x)")
    valid = [r for r in latency_ratios if r is not None]
    thr_valid = [r for r in throughput_ratios if r is not None]
    if thr_valid:
        notes.append(f"proactive throughput ratio range over loads and baselines: "
                     f"{min(thr_valid):.2f}-{max(thr_valid):.2f}x (paper: 1.2-4.9x)")
    notes.extend(device_notes(setup, cost))
    # Each ablation against igpu-only in the ratio's form (the smallest over the loads), next
    # to agent-xpu's own against igpu-only in that form.
    labels = [f"{rate:g}" for rate in rates]

    def vs_igpu(policy: str) -> float | None:
        ratios = [better_ratio(summaries[(policy, x)]["reactive_latency_mean_s"],
                               summaries[("igpu-only", x)]["reactive_latency_mean_s"], "lower")
                  for x in labels]
        return None if any(r is None for r in ratios) else min(ratios)  # type: ignore[type-var]

    notes.extend(f"{name} (igpu-only with the {order} rule) per load: reactive latency mean "
                 + ", ".join(fmt(summaries[(name, x)]["reactive_latency_mean_s"])
                             for x in labels)
                 + " s, proactive " + ", ".join(fmt(summaries[(name, x)]["proactive_per_min"])
                                                for x in labels) + " req/min"
                 for name, order in ABLATIONS.items())
    notes.append(f"{BANDWIDTH_BLIND} (agent-xpu without bandwidth-aware dispatch) per load: "
                 "reactive latency mean "
                 + ", ".join(fmt(summaries[(BANDWIDTH_BLIND, x)]["reactive_latency_mean_s"])
                             for x in labels)
                 + " s, proactive "
                 + ", ".join(fmt(summaries[(BANDWIDTH_BLIND, x)]["proactive_per_min"])
                             for x in labels) + " req/min")
    return Comparison(results=results, ratio=min(valid) if valid else None, notes=notes,
                      attribution={name: vs_igpu(name) for name in (*ABLATIONS,
                                                                    BANDWIDTH_BLIND)},
                      attribution_reference=vs_igpu("agent-xpu"))


def device_notes(setup: AgentXpuSetup, cost: ModelCost) -> list[str]:
    soc = lunar_lake()
    prefill, decode = affinity(soc, cost, setup.chunk_tokens)
    steps = TensorSplitSteps(cost, soc)  # the static-partition baseline's shares
    split = {"prefill": steps.prefill_npu_share, "decode": steps.decode_npu_share}
    out = [f"device model: NPU {soc.npu.peak_fp16_flops / 1e12:.0f} TFLOP/s x "
           f"{soc.npu.compute_eff:.2f}, draws <= {soc.npu.memory_eff:.2f} of DDR; iGPU "
           f"{soc.igpu.peak_fp16_flops / 1e12:.0f} TFLOP/s x {soc.igpu.compute_eff:.2f}, draws "
           f"<= {soc.igpu.memory_eff:.2f}; DDR {soc.ddr_bw_bytes_per_s / 1e9:.1f} GB/s; "
           f"affinity: prefill -> {prefill}, decode -> {decode}; best static NPU share: prefill "
           f"{split.get('prefill', 0):.2f}, decode {split.get('decode', 0):.2f}"]
    for m, predicted, err in model_errors(soc):
        out.append(f"held-out check: {m.source}: {m.tokens_per_s:.2f} tok/s measured, "
                   f"{predicted:.2f} predicted ({err:+.0%})")
    return out


def chunk_sweep(setup: AgentXpuSetup, cost: ModelCost, ctx: ReproContext) -> list[str]:
    """Agent.xpu at every preemption chunk of the replication plan, at 2 requests/min."""
    notes = []
    runs = []
    for chunk in CHUNK_SWEEP:
        run_setup = dataclasses.replace(setup, chunk_tokens=chunk)
        runs.append((f"agent-xpu chunk {chunk}", run_setup, 2.0,
                     agent_xpu_system(run_setup, cost)))
    for chunk, (_, _, _, system), s in zip(CHUNK_SWEEP, runs, run_summaries(ctx, runs),
                                           strict=True):
        notes.append(f"chunk {chunk}: reactive latency mean/P99 "
                     f"{fmt(s['reactive_latency_mean_s'])}/{fmt(s['reactive_latency_p99_s'])} s, "
                     f"TTFT {fmt(s['reactive_ttft_mean_s'])} s, proactive "
                     f"{fmt(s['proactive_per_min'])} req/min, prefill on "
                     f"{system.pools[0][1]}")
    return notes


def _cut_and_gain(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    ratio = better_ratio(ours["reactive_latency_mean_s"], theirs["reactive_latency_mean_s"],
                         "lower")
    thr = better_ratio(ours["proactive_per_min"], theirs["proactive_per_min"], "higher")
    cut = None if ratio is None else (1.0 - 1.0 / ratio) * 100
    return (f"reactive mean {fmt(ours['reactive_latency_mean_s'])} vs "
            f"{fmt(theirs['reactive_latency_mean_s'])} s ({fmt(cut, '%', 0)} lower), "
            f"proactive {fmt(thr, 'x')}")


def background_curve(setup: AgentXpuSetup, cost: ModelCost, ctx: ReproContext) -> list[str]:
    """At 2 requests/min, the ratio over the background load: the number of proactive flows
    (``BACKGROUND_FLOWS``; the paper's is not in its abstracts), every policy."""
    per_flows: dict[int, dict[str, dict[str, Any]]] = {flows: {} for flows in BACKGROUND_FLOWS}
    keys, runs = [], []
    for flows in BACKGROUND_FLOWS:
        run_setup = dataclasses.replace(setup, num_proactive_flows=flows)
        for policy, scheduler in schedulers(run_setup, cost).items():
            if policy == BANDWIDTH_BLIND:  # the ablation runs at the loads only
                continue
            keys.append((flows, policy))
            runs.append((f"{policy}, {flows} proactive flows", run_setup, 2.0, scheduler))
    for (flows, policy), s in zip(keys, run_summaries(ctx, runs), strict=True):
        per_flows[flows][policy] = s

    def latency_ratio(ours: str, theirs: str, s: dict[str, dict[str, Any]]) -> float | None:
        return better_ratio(s[ours]["reactive_latency_mean_s"],
                            s[theirs]["reactive_latency_mean_s"], "lower")

    out = []
    for flows, s in per_flows.items():
        parts = [f"{b} / agent-xpu {fmt(latency_ratio('agent-xpu', b, s), 'x')}"
                 for b in POLICIES[1:]]
        parts += [f"igpu-only / {a} {fmt(latency_ratio(a, 'igpu-only', s), 'x')}"
                  for a in ABLATIONS]
        out.append(f"background {flows} proactive flows at 2/min: reactive latency mean s "
                   + ", ".join(f"{p} {fmt(v['reactive_latency_mean_s'])}" for p, v in s.items())
                   + "; ratios " + ", ".join(parts) + "; proactive req/min "
                   + ", ".join(f"{p} {fmt(v['proactive_per_min'])}" for p, v in s.items()))
    return out


def sensitivity(setup: AgentXpuSetup, cost: ModelCost, ctx: ReproContext) -> list[str]:
    """At 2 requests/min: against an iGPU engine that batches (continuous batching, 8
    slots)."""
    notes = []
    ours, batching = run_summaries(ctx, [
        ("agent-xpu", setup, 2.0, agent_xpu_system(setup, cost)),
        ("igpu-only, 8 slots", setup, 2.0, OnEngine(IGPU, max_running=8))])
    notes.append(f"vs an iGPU engine batching 8 requests (continuous batching, FCFS): "
                 f"{_cut_and_gain(ours, batching)}")
    return notes


AGENT_XPU = add(Reproduction(
    key="agent-xpu",
    paper=Paper(title="Agent.xpu: Efficient Scheduling of Agentic LLM Workloads on "
                      "Heterogeneous SoC", id="arXiv:2506.24045"),
    claim="Reactive latency at least 91% lower and proactive throughput 1.2-4.9x higher than "
          "an industrial iGPU-only engine and static NPU-iGPU tensor partitioning (v2).",
    setup="Core Ultra 7 258V (NPU 24 + iGPU 32 FP16 TFLOP/s, one 136.5 GB/s LPDDR5X), "
          "Llama-3.2-3B at 4.5-bit weights; reactive requests Poisson at 1/2/4 per min plus 4 "
          "proactive flows, Azure-conversation lengths, 30 min (3 with --quick)",
    system="agent-xpu",
    baselines=("igpu-only", "static-partition", *ABLATIONS, BANDWIDTH_BLIND),
    baseline="igpu-only",
    metric=Metric(name="reactive latency (mean)", unit="s", direction="lower"),
    ratio_definition="smallest baseline / agent-xpu mean reactive latency over the loads and "
                     "both baselines (paper: >= 91% lower, i.e. >= 11.1x)",
    # "at least 91% lower" is the paper's smallest cut over its settings, the same form as
    # the ratio (smallest over loads and baselines); its per-setting values are not readable.
    paper_ratio=1.0 / (1.0 - PAPER_LATENCY_CUT),
    paper_ratio_source="v2 abstract (arXiv:2506.24045v2): reactive latency at least 91% lower "
                       "than both baselines, as 1 / (1 - 0.91); a bound over the paper's "
                       "settings, its per-setting figures are not recoverable (the HTML "
                       "stops at the introduction)",
    paper_best=None,
    loads=Loads(name="reactive request rate", unit="req/min", values=RATES,
                quick_values=QUICK_RATES),
    compare=compare,
))
