"""FastServe (NSDI'26, arXiv:2305.05920): skip-join MLFQ with proactive KV swapping against
vLLM, vLLM with chunked prefill, FCFS on the same engine and an SRPT oracle.

Everything below comes from the paper's public artifact (``LLMServe/FastServe``,
``benchmarks/artifact-evaluation/overall``: the ``overall_*_sharegpt.sh`` run scripts, the
``benchmark-serving.py`` client and the ``fig11_sharegpt.py`` / ``fig12.py`` plot scripts),
except where marked as an assumption:

- the MLFQ's quanta, skip-join, starvation rule and proactive swapping: ``fastserve/
  scheduler.py`` (see ``fleetsim.policies.fastserve``);
- OPT-13B on one GPU; max batch 16; 2,048 tokens per batch; 56 GiB of swap space and a 0.9
  GPU memory fraction for FastServe; vLLM with ``--max-num-seqs 16 --max-num-batched-tokens
  2048 --max-model-len 2048`` and no chunked prefill (v0's scheduler: ``prefill_first``,
  recompute preemption), and ``--enable-chunked-prefill`` for vLLM+CP (``token_budget``);
- each ShareGPT conversation's first turn (its first user message as the prompt, the first
  answer's length as ``max_tokens``, ``ignore_eos``), OPT-tokenized, pairs with both sides
  under 4 tokens, a prompt over 1,024 tokens or over 2,048 in all dropped
  (``benchmark-serving.py``'s ``sample_requests``); Poisson arrivals at the scripts' rates
  with their numbers of jobs per rate;
- the metric: per job, latency divided by output tokens (s/token; the scripts' ``tpot``
  field, "latency per output token, not the same as tpot"), averaged over jobs (Figure 11) or
  its 95th percentile (Figure 12); the SLO: 0.3 s/token (the dashed line of both figures);
  throughput at the SLO: the arrival rate where a policy's curve crosses the SLO, linearly
  interpolated between swept rates (the scripts' ``interp1d``), FastServe's over vLLM's;
- the artifact's vLLM runs with ``--enforce-eager`` (no CUDA graphs): its decode steps pay
  the eager launch overhead measured in vLLM PR #1440 (below), a property of that baseline
  engine; ``vllm-graphs`` is the same vLLM with CUDA graphs (the step model's default);
- the panel's published values (``PAPER_AT_SLO``): the artifact's committed figures
  ``overall/fig11_sharegpt.pdf`` and ``fig12.pdf``, read as vector data;
- the first turns' lengths: statistics of the vLLM paper's artifact (Kwon et al., SOSP'23,
  arXiv:2309.06180; ``sosp-ae-39/sosp-ae-astra``, ``datasets/
  sharegpt_opt_text_completion_length.pkl``: ShareGPT's first turns of March 2023, OPT
  tokenizer), a 2-D histogram embedded as ``embedded:sharegpt_first_turn_opt``; the
  artifact read ``ShareGPT_V3_unfiltered_cleaned_split.json``, a later snapshot of ShareGPT;
- assumption: the GPU (an A100-80GB; the artifact does not name it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from fleetsim.perf.step_model import STEP_OVERHEAD_S
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
from fleetsim.repro.sweep import sweep_rates
from fleetsim.workloads.config import PairedLengthsConfig
from fleetsim.workloads.loaders import read_column

MODEL, GPU = "opt-13b", "a100"
SLO_S_PER_TOKEN = 0.3  # the artifact's figures 11 and 12
MAX_BATCH = 16  # --max-batch-size / --max-num-seqs
TOKENS_PER_BATCH = 2048  # --max-tokens-per-batch / --max-num-batched-tokens
SWAP_SPACE_GIB = 56.0  # --swap-space of the OPT-13B runs
# The ShareGPT rates and jobs per rate of overall_fastserve_sharegpt.sh.
RATES = (0.1, 0.2, 0.5, 1.0, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 4.0, 4.5, 5.0, 5.5, 6.0, 10.0)
JOBS = (20, 50, 100, 200, 300, 350, 400, 400, 400, 400, 400, 400, 400, 400, 400, 400)
# --quick: three of those rates, with their jobs, that bracket both vLLM's and FastServe's
# crossings of the SLO (so the quick ratio is a measurement, not a bound).
QUICK_RATES, QUICK_JOBS = (1.0, 3.0, 10.0), (200, 400, 400)

# The panel fleetsim runs, as published (ShareGPT, OPT-13B, SLO 0.3 s/token): throughput at
# the SLO, FastServe over vLLM, for the mean (Figure 11) and the p95 (Figure 12) per-token
# latency, and FastServe over FastServe-FCFS at the mean SLO (Figure 11).
PAPER_AT_SLO = {"mean": 2.59, "p95": 2.01}
PAPER_VS_FCFS = 1.84
PANEL_SOURCE = ("the artifact's committed figures (LLMServe/FastServe, benchmarks/"
                "artifact-evaluation/overall/fig11_sharegpt.pdf and fig12.pdf, read as vector "
                "data): ShareGPT, OPT-13B, SLO 0.3 s/token; 2.59x at the mean (Figure 11), "
                "2.01x at the p95 (Figure 12); FastServe over FastServe-FCFS 1.84x")

# vLLM with --enforce-eager launches every kernel of a decode step from Python instead of
# replaying one CUDA graph. vLLM PR #1440 (the CUDA-graph prototype, Llama-2-7B on one GPU,
# batch 1) measured 1.2 s without and 1.05 s with CUDA graphs for 100 output tokens: 1.5 ms
# per decode step. Launches are per layer, so it is scaled by the layer count (Llama-2-7B
# 32, OPT-13B 40: the models' config.json). The same comment saw no visible gain at larger
# batches, where kernels run long enough to hide launches: at batch 16 this is an upper
# bound (``vllm-graphs`` shows the other end). Never fitted to the figure.
EAGER_S_PER_DECODE_STEP_LLAMA2_7B = (1.2 - 1.05) / 100
EAGER_OVERHEAD_S = EAGER_S_PER_DECODE_STEP_LLAMA2_7B * 40 / 32

# The client's prompts: each ShareGPT conversation's first user message and first answer,
# OPT-tokenized, through benchmark-serving.py's filter. Their statistics come from the vLLM
# paper's artifact (first turns of ShareGPT, March 2023, OPT tokenizer; src/fleetsim/data/
# README.md), the filter already applied; applied again here it keeps every row.
SHAREGPT_FIRST_TURNS = "embedded:sharegpt_first_turn_opt"
MAX_PROMPT_TOKENS, MAX_TOTAL_TOKENS = 1024, 2048  # benchmark-serving.py's filter
LENGTHS = {"path": SHAREGPT_FIRST_TURNS, "count_column": "num_requests",
           "max_prompt_tokens": MAX_PROMPT_TOKENS, "max_total_tokens": MAX_TOTAL_TOKENS}
# What the entry drew before: whole conversations (Llama-2 tokens), kept for the lengths note.
SHAREGPT_CONVERSATIONS = "embedded:sharegpt_lengths"

# policy -> (batching spec, max running requests). FastServe's engine keeps every admitted
# job resident (paused, or swapped to host) and batches 16 of them; its only limit is memory,
# so 256 here is a cap that never binds (4,096 gives identical results at 3 and 10 req/s).
POLICIES: dict[str, tuple[dict[str, Any], int]] = {
    "fastserve": ({"name": "fastserve", "args": {"scheduler": "mlfq",
                                                 "max_batch_size": MAX_BATCH}}, 256),
    "fcfs": ({"name": "fastserve", "args": {"scheduler": "fcfs",
                                            "max_batch_size": MAX_BATCH}}, 256),
    "srpt": ({"name": "fastserve", "args": {"scheduler": "srpt",
                                            "max_batch_size": MAX_BATCH}}, 256),
    "vllm": ({"name": "prefill_first"}, MAX_BATCH),
    "vllm-chunked": ({"name": "token_budget"}, MAX_BATCH),
    "vllm-graphs": ({"name": "prefill_first"}, MAX_BATCH),
}
EAGER = ("vllm", "vllm-chunked")  # the artifact's vLLM runs: --enforce-eager


def config(policy: str, rate: float, num_jobs: int) -> dict[str, Any]:
    batching, max_running = POLICIES[policy]
    return {
        "model": MODEL,
        "hardware": {"gpu": GPU},
        "engine": {"max_batched_tokens": TOKENS_PER_BATCH, "max_running": max_running,
                   "gpu_memory_utilization": 0.9,
                   # vLLM's runs give no --swap-space (its default 4 GiB never matters: v0
                   # preempts by recompute); FastServe's engine swaps into 56 GiB.
                   "swap_space_gib": SWAP_SPACE_GIB if policy in ("fastserve", "fcfs", "srpt")
                   else 0.0,
                   # the step model's per-step CPU cost, plus eager launches for vLLM's
                   # --enforce-eager runs (on every step: prefill steps too, a small share)
                   "step_overhead_s": STEP_OVERHEAD_S + (EAGER_OVERHEAD_S if policy in EAGER
                                                         else 0.0)},
        # a copy: a caller may change the run's policy args (not every later run's)
        "policy": {"batching": copy.deepcopy(batching)},
        "workload": {"trace": None, "arrival": "poisson", "rate_per_s": rate,
                     "num_requests": num_jobs, "lengths": dict(LENGTHS)},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},  # the per-token-latency SLO is applied here
        "seed": 0,
    }


def compare(ctx: ReproContext) -> Comparison:
    rates, jobs = (QUICK_RATES, QUICK_JOBS) if ctx.quick else (RATES, JOBS)
    sweep = sweep_rates(ctx, tuple(POLICIES), rates,
                        lambda policy, i: config(policy, rates[i], jobs[i]))
    mean = sweep.curves(lambda run: _per_token(run, np.mean))
    p95 = sweep.curves(lambda run: _per_token(run, lambda x: np.percentile(x, 95)))
    at_slo = sweep.crossings(mean, SLO_S_PER_TOKEN)
    tail_at_slo = sweep.crossings(p95, SLO_S_PER_TOKEN)
    ratio = better_ratio(at_slo["fastserve"], at_slo["vllm"], "higher")
    tail_ratio = better_ratio(tail_at_slo["fastserve"], tail_at_slo["vllm"], "higher")
    last = rates[-1]
    graphs_ratio = better_ratio(at_slo["fastserve"], at_slo["vllm-graphs"], "higher")
    notes = [f"fastserve vs vllm at the SLO: mean {fmt(ratio, 'x')} (paper "
             f"{PAPER_AT_SLO['mean']}x), p95 {fmt(tail_ratio, 'x')} (paper "
             f"{PAPER_AT_SLO['p95']}x); fastserve vs fcfs "
             f"{fmt(better_ratio(at_slo['fastserve'], at_slo['fcfs'], 'higher'), 'x')} (paper "
             f"{PAPER_VS_FCFS}x)",
             f"vllm's --enforce-eager costs {EAGER_OVERHEAD_S * 1e3:.2f} ms per step (vLLM PR "
             f"#1440, scaled to 40 layers); with CUDA graphs (vllm-graphs) fastserve's ratio "
             f"would be {fmt(graphs_ratio, 'x')}",
             f"throughput at the SLO (mean latency per output token <= {SLO_S_PER_TOKEN} s), "
             "req/s: " + ", ".join(f"{p} {_fmt_rate(v, last)}" for p, v in at_slo.items()),
             f"throughput at the tail SLO (p95 latency per output token <= "
             f"{SLO_S_PER_TOKEN} s, Figure 12), req/s: "
             + ", ".join(f"{p} {_fmt_rate(v, last)}" for p, v in tail_at_slo.items())
             + f"; fastserve vs vllm {fmt(tail_ratio, 'x')}",
             "p95 latency per output token, s, per rate: " + "; ".join(
                 f"{p} " + "/".join(fmt(x) for x in v.values()) for p, v in p95.items()),
             lengths_note()]
    for policy in ("vllm-chunked", "srpt"):
        r = better_ratio(at_slo["fastserve"], at_slo[policy], "higher")
        notes.append(f"fastserve vs {policy}: {fmt(r, 'x')}")
    if any(v is not None and v >= last for v in at_slo.values()):
        notes.append(f"a rate shown as >= {last:g} never crossed the SLO in the sweep: the "
                     f"ratios involving it are bounds")
    # FastServe-FCFS is FastServe's engine (swapping, pausing) without the MLFQ.
    attribution = {"fcfs": better_ratio(at_slo["fcfs"], at_slo["vllm"], "higher")}
    return Comparison(results=mean, ratio=ratio, headline=at_slo, notes=notes,
                      reference=("SLO", SLO_S_PER_TOKEN), attribution=attribution,
                      ratio_is_bound=is_bound(last, at_slo["fastserve"], at_slo["vllm"]))


def lengths_note() -> str:
    """The first turns the entry draws, measured, against the whole-conversation rows it
    drew before (their prompts are many turns long, so the filter drops most of them)."""
    first = PairedLengthsConfig(**LENGTHS).distribution()  # type: ignore[arg-type]
    rows = PairedLengthsConfig(path=SHAREGPT_CONVERSATIONS, max_prompt_tokens=MAX_PROMPT_TOKENS,
                               max_total_tokens=MAX_TOTAL_TOKENS).distribution()
    every = read_column(SHAREGPT_CONVERSATIONS, "num_prefill_tokens")
    return (f"lengths: ShareGPT first turns (OPT tokens, the vLLM artifact's statistics, "
            f"the client's filter applied): mean prompt {np.mean(first.prompts):.0f} / "
            f"output {np.mean(first.outputs):.0f} tokens (median {np.median(first.prompts):.0f}"
            f" / {np.median(first.outputs):.0f}); whole conversations (Llama-2 tokens) "
            f"through the same filter would keep {len(rows.prompts):,} of {len(every):,} "
            f"rows, mean prompt {np.mean(rows.prompts):.0f} / output "
            f"{np.mean(rows.outputs):.0f}")


def latency_per_output_token(req: Any) -> Any:
    """Each finished job's end-to-end latency over its output tokens (s/token): the
    artifact's per-job ``tpot`` field ``(end_time - start_time) / output_len``."""
    return (np.asarray(req["finish_s"], dtype=np.float64)
            - np.asarray(req["arrival_s"], dtype=np.float64)) / np.asarray(
        req["num_output_tokens"], dtype=np.float64)


def _per_token(run: Any, stat: Callable[[Any], Any]) -> float | None:
    """``stat`` of a run's latencies per output token; None where jobs were left unfinished."""
    if run.summary["num_unfinished"]:
        return None
    return float(stat(latency_per_output_token(run.records.requests)))


def _fmt_rate(value: float | None, last: float) -> str:
    if value is not None and value >= last:
        return f">= {last:g}"
    return fmt(value)


FASTSERVE = add(Reproduction(
    key="fastserve",
    paper=Paper(title="FastServe: Iteration-Level Preemptive Scheduling for Large Language "
                      "Model Inference", id="arXiv:2305.05920", venue="NSDI'26"),
    claim="Up to 6.1x throughput against vLLM at the same latency requirement (NSDI'26 "
          "abstract); earlier versions: 31.4x / 17.9x at the same mean / tail latency.",
    setup=f"OPT-13B on one A100-80GB (GPU assumed), ShareGPT rows (prompt <= 1,024, prompt + "
          f"output <= 2,048), Poisson arrivals at {', '.join(f'{r:g}' for r in RATES)} req/s "
          f"with 20-400 jobs per rate, max batch {MAX_BATCH}, {TOKENS_PER_BATCH} tokens per "
          f"batch, {SWAP_SPACE_GIB:g} GiB host swap space: the paper's artifact scripts",
    system="fastserve",
    baselines=("vllm", "vllm-chunked", "fcfs", "srpt", "vllm-graphs"),
    baseline="vllm",
    metric=Metric(name="mean latency per output token", unit="s/token", direction="lower"),
    headline_metric=Metric(name="throughput at the latency SLO", unit="req/s",
                           direction="higher"),
    ratio_definition=(f"arrival rate where the mean latency per output token crosses "
                      f"{SLO_S_PER_TOKEN} s (interpolated), fastserve over vllm"),
    paper_ratio=PAPER_AT_SLO["mean"],
    paper_ratio_source=PANEL_SOURCE,
    paper_best=6.1,
    loads=Loads(name="arrival rate", unit="req/s", values=RATES, quick_values=QUICK_RATES),
    compare=compare,
))
