"""LoongServe (SOSP'24, arXiv:2404.09526): elastic sequence parallelism (ESP) for long-context
serving, against vLLM, chunked prefill (LightLLM with SplitFuse) and P/D disaggregation
(DistServe) on one node of eight A100-80GB.

Setup from the paper's public artifact (``LoongServe/LoongServe``, ``docs/artifact-eval/
README.md`` and ``test/longserve/5-start-api-server.py``), except where marked:

- LWM-Text-1M (the Llama-2-7B shape, 1M context), 8 A800/A100-80GB SXM in one node; we use the
  catalog's A100 (its NVLink 300 GB/s per direction; the A800's is 200 GB/s);
- ``loongserve``: 4 instances of TP 2 (``-tp 2 -sp 4``), 210,000 KV tokens per instance, 10
  decode iterations between admissions, a 5 s prefill limit, 128 requests per decode master:
  an instance group of the main engine (``serving/groups.py``) planned by the ``esp`` group
  planner (``policies/esp.py``, which follows ``router/manager.py``), each member priced by
  the ESP step model (``esp/cost.py``); the scheduler predicts with
  ``T_k = A_k + B_k sum(l) + C_k sum(l^2)`` fitted, like the artifact, to profiled prefills,
  and here the profile is the group's step model;
- ``vllm``: one TP 8 replica, no chunked prefill (v0's prefill-first scheduler), 600,000
  batched tokens, 1,024 sequences, ``--gpu-memory-utilization 0.98``;
- ``lightllm-sf``: one TP 8 replica with SplitFuse chunks of the dataset's
  ``--splitfuse_block_size`` (Mixed 2,048, L-Eval 2,048), 900,000 KV tokens
  (``--max_total_token_num``), admission gated on the whole input;
- ``distserve``: a TP 4 prefill instance and a decode instance on the other 4 GPUs (the
  artifact's decode PP 2 x TP 2; fleetsim has no pipeline parallelism, so TP 4), batches of
  128, ``--gpu-memory-utilization 0.82``, KV over NVLink. The artifact runs DistServe on
  ShareGPT and L-Eval only; we run it on both datasets we sweep and say which one the paper
  has;
- ``loongserve-no-esp``: the same 4 x TP 2 gang with a fixed degree of parallelism (every
  prefill on all instances, decode batches always lent): the artifact's "w/o ESP (TP=2, SP=4)";
- workloads: see ``fleetsim.workloads.long_context`` (ShareGPT lengths embedded; L-Eval
  from its paper's per-task length statistics, ``fleetsim.workloads.leval``; LV-Eval from its
  stated length levels, since its texts are not reachable offline);
- metric: the artifact's Figure 10 (``ae-plot-fig-10-11-12.py``, ``lib_benchmark_serving/
  metrics.py``): mean per-token latency ``latency / (prompt + output)``, mean input-token
  latency ``ttft / prompt`` and mean output-token latency (tpot), each against the dataset's
  absolute SLO (Mixed 70 / 90 / 360 ms, L-Eval 3.5 / 1.8 / 320 ms); the max throughput of a
  system is the rate where its curve first crosses the SLO, interpolated between swept rates
  (``get_intersection_point``);
- published values: every system's max throughput as the authors' notebook printed it
  (``test/longserve/6-data-analyse-evaluation.ipynb``), compared system by system in the notes
  before the ratios.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetsim.esp import DecodeShard, EspCostModel, fit_analytical
from fleetsim.hardware import get_gpu
from fleetsim.metrics.slo import crossing_rate
from fleetsim.models import get_model
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
    is_bound,
)
from fleetsim.repro.loongserve_ablation import (
    CAPACITY,
    Layouts,
    ablation,
    ablation_notes,
    group_config,
)
from fleetsim.repro.sweep import sweep_rates
from fleetsim.workloads import Workload
from fleetsim.workloads.long_context import workload

MODEL, GPU = "lwm-text-1m", "a100"
INSTANCE_TP, NUM_INSTANCES = 2, 4
SYSTEMS = ("loongserve", "vllm", "lightllm-sf", "distserve", "loongserve-no-esp")
# dataset -> per-token, input-token, output-token SLO (ms): Figure 10's ``slos`` rows.
SLO_MS = {"mixed": (70.0, 90.0, 360.0), "leval": (3.5, 1.8, 320.0)}
SPLITFUSE_CHUNK = {"mixed": 2048, "leval": 2048}  # --splitfuse_block_size
MAX_RUNNING = {"mixed": 1024, "leval": 256}  # --running_max_req_size (LightLLM, LoongServe)
MAX_OOE = {"mixed": 4, "leval": 8}  # --max_num_ooe
# Swept up to where LoongServe itself crosses its per-token SLO (Mixed near 1.1 req/s, L-Eval
# near 3.6), so the headline ratio is a measurement, not a bound; every system runs every rate.
RATES: dict[str, tuple[float, ...]] = {
    "mixed": (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5),
    "leval": (0.2, 0.4, 0.6, 0.8, 1.2, 1.6, 2.0, 3.0, 4.0)}
# Requests per rate: the artifact's (num prompts, rate) pairs keep each run near 20 minutes of
# arrivals on Mixed (100 @ 0.1 ... 800 @ 0.6); a fixed count would hide overload (a short
# burst drains and its mean latency stays bounded). L-Eval runs shorter here (CPU time).
ARRIVALS_S = {"mixed": 1200.0, "leval": 300.0}
MIN_REQUESTS = 60
# --quick: 120 requests per rate, too short a burst for LoongServe to cross its SLO, but
# long enough for the baselines to cross inside the sweep (lightllm-sf near 0.44 req/s):
# the quick ratio is then a lower bound above 1 (flagged), not the 1.00x of no crossing.
QUICK_RATES: dict[str, tuple[float, ...]] = {"mixed": (0.1, 0.3, 0.6)}
QUICK_REQUESTS = 120
ABLATION_ALPHAS = (1.0, 1.2)  # 1.4 too (fleetsim.repro.loongserve_ablation): ~2x the CPU
PAPER_VS_PD = 5.81
# The authors' notebook (``test/longserve/6-data-analyse-evaluation.ipynb``, LoongServe/
# LoongServe at f6e8fc1; Apache-2.0), the table ``plot_e2e`` printed (Figure 10): each
# system's max throughput (req/s) at the per-token, input-token and output-token SLO; None
# where the notebook prints ``inf`` (the curve never crossed within its sweep).
PUBLISHED: dict[str, dict[str, tuple[float | None, float | None, float | None]]] = {
    "mixed": {"loongserve": (0.553, 0.516, None), "vllm": (0.208, 0.215, 0.114),
              "lightllm-sf": (0.144, 0.153, 0.083)},
    "leval": {"loongserve": (2.416, 2.249, None), "vllm": (1.144, 1.203, 0.753),
              "lightllm-sf": (1.231, 1.226, 1.225), "distserve": (0.415, 0.629, 0.120)},
}
NOTEBOOK = ("the authors' notebook test/longserve/6-data-analyse-evaluation.ipynb "
            "(LoongServe/LoongServe), plot_e2e's printed table")
# The artifact guide's toy example (docs/artifact-eval/README.md, "Run a Toy Example"): one
# request of 100 input tokens, 16 outputs, sp 4 x tp 2 on A800: "Prefill time usage: avg
# 32.83 ms", "Decoding time usage: avg 12.40 ms".
TOY_INPUT, TOY_PREFILL_MS, TOY_DECODE_MS = 100, 32.8, 12.4
DISTSERVE_DATASETS = ("sharegpt", "leval")
# Two more profiled steps the notebook printed (6-data-analyse-evaluation.ipynb, from its
# db-identical-req.sqlite; batch 1, 16 outputs, A800): (sp, tp, input tokens, prefill ms,
# decode-step ms).
NOTEBOOK_PROFILE = ((4, 2, 100, 38.48, 9.76), (1, 1, 1000, 68.89, 13.01))


def compare(ctx: ReproContext) -> Comparison:
    datasets = ("mixed",) if ctx.quick else ("mixed", "leval")
    rates_by: dict[str, tuple[float, ...]] = QUICK_RATES if ctx.quick else RATES
    esp = _esp_models()
    seed = ctx.config({"seed": 0}).seed  # ``--set seed=N`` reseeds the workloads too
    curves: dict[str, dict[str, dict[str, tuple[float, float, float]]]] = {
        dataset: _sweep(ctx, dataset, rates_by[dataset], seed) for dataset in datasets}
    main = curves["mixed"]
    results: dict[str, dict[str, float | None]] = {
        s: {f"{r:g}": (main[s][f"{r:g}"][0] if f"{r:g}" in main[s] else None)
            for r in rates_by["mixed"]} for s in main}
    rates = rates_by["mixed"]
    at_slo = {s: crossing_rate(rates, [v[0] for v in main[s].values()], SLO_MS["mixed"][0] / 1e3)
              for s in main}
    ratio = better_ratio(at_slo["loongserve"], at_slo["lightllm-sf"], "higher")
    notes = _notes(curves, rates_by, esp)
    if not ctx.quick:  # Figure 12's ablation on the Zipf mixes (CPU time: alpha 1.0, 1.2)
        notes += ablation_notes(ablation(Layouts(MODEL, GPU), seed, ctx.progress,
                                         ABLATION_ALPHAS))
    # loongserve-no-esp: the same gang with a fixed degree of parallelism (no ESP)
    return Comparison(results=results, ratio=ratio, headline=at_slo, notes=notes,
                      reference=("SLO", SLO_MS["mixed"][0] / 1e3),
                      attribution={"loongserve-no-esp": better_ratio(
                          at_slo["loongserve-no-esp"], at_slo["lightllm-sf"], "higher")},
                      ratio_is_bound=is_bound(rates[-1], at_slo["loongserve"],
                                              at_slo["lightllm-sf"]))


# -- one run ---------------------------------------------------------------------------
def _esp_models() -> tuple[EspCostModel, Any]:
    cost = EspCostModel(get_model(MODEL), get_gpu(GPU), INSTANCE_TP)
    return cost, fit_analytical(cost, NUM_INSTANCES, CAPACITY[INSTANCE_TP])


def systems_for(dataset: str) -> tuple[str, ...]:
    """DistServe's 4-GPU instances cannot hold LV-Eval's longest prompts (nor could the
    artifact's: it runs DistServe on ShareGPT and L-Eval only)."""
    return SYSTEMS if dataset in DISTSERVE_DATASETS else tuple(
        s for s in SYSTEMS if s != "distserve")


def _sweep(ctx: ReproContext, dataset: str, rates: tuple[float, ...], seed: int
           ) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Every system at every rate on the same requests per rate: system -> rate label -> the
    three latencies. In a full run a system stops once past every SLO (its crossings are set;
    CPU time); the quick slice runs all."""
    def requests(i: int) -> Workload:
        n = QUICK_REQUESTS if ctx.quick else max(MIN_REQUESTS,
                                                 round(rates[i] * ARRIVALS_S[dataset]))
        return workload(dataset, n, rates[i], seed=seed)

    def past_every_slo(runs: list[Any]) -> bool:
        return _past_every_slo({str(i): _latencies(r) for i, r in enumerate(runs)}, dataset)

    sweep = sweep_rates(ctx, systems_for(dataset), rates,
                        lambda system, _: baseline_config(system, dataset), prefix=f"{dataset} ",
                        workload=requests, until=None if ctx.quick else past_every_slo)
    return sweep.curves(_latencies)


def _latencies(run: Any) -> tuple[float, float, float]:
    req = run.records.requests
    return latency_metrics(req["arrival_s"], req["first_token_s"], req["finish_s"],
                           req["num_prompt_tokens"], req["num_output_tokens"])


def baseline_config(system: str, dataset: str) -> dict[str, Any]:
    """The fleetsim config of a system (its layout from the artifact's server flags); the
    workload is given to ``run`` in memory. LoongServe, with and without ESP, is an instance
    group of the 4 TP 2 instances planned by the ``esp`` group planner."""
    if system in ("loongserve", "loongserve-no-esp"):
        return group_config(MODEL, GPU, INSTANCE_TP, NUM_INSTANCES,
                            elastic=system == "loongserve", max_running=MAX_RUNNING[dataset],
                            max_out_of_order=MAX_OOE[dataset])
    base: dict[str, Any] = {
        "model": MODEL,
        "hardware": {"gpu": GPU, "tp": 8},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},  # the per-token SLOs are applied here
        "seed": 0,
    }
    if system == "vllm":
        base["engine"] = {"max_batched_tokens": 600_000, "max_running": 1024,
                          "gpu_memory_utilization": 0.98, "swap_space_gib": 0.0}
        base["policy"] = {"batching": {"name": "prefill_first"}}
    elif system == "lightllm-sf":
        base["engine"] = {"max_batched_tokens": SPLITFUSE_CHUNK[dataset],
                          "max_running": MAX_RUNNING[dataset],
                          "num_kv_blocks": 900_000 // 16, "swap_space_gib": 0.0}
        base["policy"] = {"batching": {"name": "token_budget",
                                       "args": {"reserve_full_isl": True}}}
    elif system == "distserve":
        base["engine"] = {"max_batched_tokens": 550_000, "max_running": 128,
                          "gpu_memory_utilization": 0.82, "swap_space_gib": 0.0}
        base["policy"] = {"batching": {"name": "prefill_first"}}
        base["cluster"] = {
            "pools": [{"name": "prefill", "gpu": GPU, "num_replicas": 1, "tp": 4,
                       "role": "prefill"},
                      {"name": "decode", "gpu": GPU, "num_replicas": 1, "tp": 4,
                       "role": "decode"}],
            "link": {"placement": "intra_node"}}
    else:
        raise ValueError(f"unknown baseline {system!r}")
    return base


# -- metrics -----------------------------------------------------------------------------
def latency_metrics(arrival_s: Any, first_token_s: Any, finish_s: Any, prompt: Any,
                    output: Any) -> tuple[float, float, float]:
    """The artifact's three means (s/token): per-token ``latency / (prompt + output)``,
    input-token ``ttft / prompt``, output-token ``(latency - ttft) / (output - 1)`` over
    requests with more than one output token."""
    arrival, first, finish = (np.asarray(x, dtype=np.float64)
                              for x in (arrival_s, first_token_s, finish_s))
    p, o = np.asarray(prompt, dtype=np.float64), np.asarray(output, dtype=np.float64)
    latency, ttft = finish - arrival, first - arrival
    multi = o > 1
    tpot = (latency[multi] - ttft[multi]) / (o[multi] - 1) if multi.any() else np.zeros(1)
    return (float(np.mean(latency / (p + o))), float(np.mean(ttft / p)), float(np.mean(tpot)))


def _past_every_slo(curve: dict[str, tuple[float, float, float]], dataset: str) -> bool:
    """Whether a system's curve has reached every SLO column at some swept rate: its first
    crossings (all ``_max_rate`` reads) are then set, and higher rates cannot move them."""
    return bool(curve) and all(any(v[col] >= SLO_MS[dataset][col] / 1e3
                                   for v in curve.values()) for col in range(3))


def _notes(curves: dict[str, Any], rates_by: dict[str, tuple[float, ...]],
           esp: tuple[EspCostModel, Any]) -> list[str]:
    cost = esp[0]
    prefill_ms = cost.prefill_s([TOY_INPUT], NUM_INSTANCES) * 1e3
    # no context migration in the toy run: the KV stays striped over the four instances
    decode_ms = cost.decode_s(1, [DecodeShard(1, TOY_INPUT // NUM_INSTANCES)] * NUM_INSTANCES,
                              1) * 1e3
    notes = [f"cost model vs the artifact's only published profile (its AE toy example: one "
             f"{TOY_INPUT}-token request on sp 4 x tp 2, A800): prefill {prefill_ms:.1f} ms vs "
             f"{TOY_PREFILL_MS} ms ({prefill_ms / TOY_PREFILL_MS - 1:+.0%}), decode step "
             f"{decode_ms:.1f} ms vs {TOY_DECODE_MS} ms ({decode_ms / TOY_DECODE_MS - 1:+.0%})",
             *_profile_notes(),
             f"scheduler's analytical model (A_k + B_k sum(l) + C_k sum(l^2)) vs the ESP cost "
             f"model on the artifact's profiling grid: mean relative error "
             f"{esp[1].mean_rel_error:.1%} (the artifact asks < 10%)"]
    for dataset, by_system in curves.items():
        rates = rates_by[dataset]
        for col, name in enumerate(("per-token", "input-token", "output-token")):
            slo = SLO_MS[dataset][col] / 1e3
            best = {s: crossing_rate(rates, [v[col] for v in by_system[s].values()], slo)
                    for s in by_system}
            rows = ", ".join(f"{s} {_fmt_rate(best[s], rates[-1])}" for s in by_system)
            ls = best["loongserve"]
            vs = ", ".join(f"vs {s} {fmt(better_ratio(ls, best[s], 'higher'), 'x')}"
                           for s in by_system if s != "loongserve")
            notes.append(f"{dataset}, max req/s at the {name} SLO ({SLO_MS[dataset][col]:g} "
                         f"ms): {rows}; loongserve {vs}")
    notes.append(f"published: 3.85x vs chunked prefill (Mixed, per-token SLO), {PAPER_VS_PD}x vs "
                 "P/D disaggregation (L-Eval, per-token SLO); the artifact has DistServe on "
                 "ShareGPT and L-Eval only")
    notes += published_notes(curves, rates_by)
    for dataset, by_system in curves.items():
        notes.append(f"{dataset} per-token latency (ms) per rate "
                     f"{'/'.join(f'{r:g}' for r in rates_by[dataset])}: " + "; ".join(
                         f"{s} " + "/".join(_fmt_ms(by_system[s].get(f"{r:g}"))
                                            for r in rates_by[dataset])
                         for s in by_system) + " (-: not run, past every SLO already)")
    return notes


def _profile_notes() -> list[str]:
    notes = []
    for sp, tp, tokens, prefill_ms, decode_ms in NOTEBOOK_PROFILE:
        cost = EspCostModel(get_model(MODEL), get_gpu(GPU), tp)
        ours_prefill = cost.prefill_s([tokens], sp) * 1e3
        ours_decode = cost.decode_s(1, [DecodeShard(1, tokens // sp)] * sp, 1) * 1e3
        notes.append(f"cost model vs the notebook's profile (one {tokens}-token request on sp "
                     f"{sp} x tp {tp}, A800): prefill {ours_prefill:.1f} ms vs {prefill_ms} ms "
                     f"({ours_prefill / prefill_ms - 1:+.0%}), decode step {ours_decode:.1f} ms "
                     f"vs {decode_ms} ms ({ours_decode / decode_ms - 1:+.0%})")
    return notes


def published_notes(curves: dict[str, Any], rates_by: dict[str, tuple[float, ...]]
                    ) -> list[str]:
    """Each system's max throughput against the notebook's, per dataset and SLO column, with
    fleetsim's relative error, then the ratios in the paper's form (LoongServe over each)."""
    notes = []
    for dataset, published in PUBLISHED.items():
        if dataset not in curves:
            continue
        rates = rates_by[dataset]
        for col, name in enumerate(("per-token", "input-token", "output-token")):
            slo = SLO_MS[dataset][col] / 1e3
            parts, ratios = [], []
            for system, values in published.items():
                ours = crossing_rate(rates, [v[col] for v in curves[dataset][system].values()],
                                 slo)
                parts.append(f"{system} {_fmt_rate(ours, rates[-1])} vs "
                             f"{_fmt_published(values[col])}"
                             f"{_rel_error(ours, values[col], rates[-1])}")
                if system != "loongserve" and values[col] and published["loongserve"][col]:
                    ratios.append(f"vs {system} {published['loongserve'][col] / values[col]:.2f}x")
            notes.append(f"{dataset}, max req/s at the {name} SLO, fleetsim vs {NOTEBOOK}: "
                         + ", ".join(parts) + ("; published ratios " + ", ".join(ratios)
                                               if ratios else ""))
    return notes


def _fmt_ms(value: tuple[float, float, float] | None) -> str:
    return "-" if value is None else f"{value[0] * 1e3:.1f}"


def _fmt_published(value: float | None) -> str:
    return "inf (never crossed)" if value is None else f"{value:g}"


def _rel_error(ours: float | None, published: float | None, top: float) -> str:
    if ours is None or published is None:
        return ""
    bound = ">= " if ours >= top else ""  # not crossed in the sweep: a lower bound
    return f" ({bound}{ours / published - 1:+.0%})"


def _fmt_rate(value: float | None, last: float) -> str:
    if value is None:
        return "< first rate"
    return f">= {last:g}" if value >= last else f"{value:.3f}"


LOONGSERVE = add(Reproduction(
    key="loongserve",
    paper=Paper(title="LoongServe: Efficiently Serving Long-Context Large Language Models "
                      "with Elastic Sequence Parallelism", id="arXiv:2404.09526",
                venue="SOSP'24"),
    claim="Up to 3.85x max throughput vs chunked prefill and 5.81x vs prefill-decode "
          "disaggregation (SOSP'24 abstract).",
    setup="LWM-Text-1M on 8 A100-80GB in one node: LoongServe as 4 ESP instances of TP 2; "
          "vLLM and LightLLM-SplitFuse as TP 8; DistServe as TP 4 prefill + 4-GPU decode; "
          "the Mixed dataset (ShareGPT + L-Eval + LV-Eval lengths) and L-Eval, "
          "Poisson arrivals, 20 minutes' worth per rate on Mixed (5 on L-Eval): the "
          "artifact's server flags and SLOs",
    system="loongserve",
    # DistServe cannot hold Mixed's LV-Eval prompts (nor could the artifact's), so it is
    # compared on L-Eval, in the notes, not in the Mixed table
    baselines=tuple(s for s in SYSTEMS[1:] if s != "distserve"),
    baseline="lightllm-sf",
    metric=Metric(name="mean per-token latency (latency / (prompt + output))", unit="s/token",
                  direction="lower"),
    headline_metric=Metric(name="max throughput within the per-token SLO", unit="req/s",
                           direction="higher"),
    ratio_definition="on Mixed, the rate where mean per-token latency crosses 70 ms "
                     "(interpolated), loongserve over lightllm-sf (chunked prefill)",
    paper_ratio=3.85,  # the notebook's printed "(3.85x)" (its rates are rounded to 3 places)
    paper_ratio_source=f"Figure 10, Mixed, per-token SLO: LoongServe 0.553 req/s over LightLLM "
                       f"w/ SplitFuse 0.144 (3.85x), {NOTEBOOK}; the same panel gives the "
                       f"abstract's 3.85x",
    paper_best=3.85,
    loads=Loads(name="arrival rate", unit="req/s", values=RATES["mixed"],
                quick_values=QUICK_RATES["mixed"]),
    compare=compare,
))
