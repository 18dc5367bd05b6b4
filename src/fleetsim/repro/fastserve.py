"""FastServe (NSDI'26, arXiv:2305.05920): skip-join MLFQ with proactive KV swapping against
vLLM, vLLM with chunked prefill, FCFS on the same engine and an SRPT oracle.

Parameters and their sources:
- the MLFQ's quanta, skip-join, starvation rule and proactive swapping: FastServe's public
  code (``fastserve/scheduler.py``; see ``fleetsim.policies.fastserve``);
- one GPU, Llama-3-8B, ShareGPT lengths, Poisson arrivals, max batch 16, 2,048 tokens per
  batch, up to 400 prompts per run: the paper's artifact README (``../shared/papers/
  scheduling.md`` section 7). Llama-3-8B has Llama-3.1-8B's shape (our catalog's model);
- ShareGPT lengths filtered as vLLM's serving benchmark does (prompts over 1,024 tokens and
  outputs over 1,024 dropped, so a job fits OPT-13B's 2,048-token context as in the paper);
- vLLM (2023) is ``prefill_first`` (vLLM v0's scheduler: whole prompts, recompute
  preemption) with ``max_num_seqs`` 16; vLLM with chunked prefill is ``token_budget``;
- assumptions, not from the paper: the GPU (A100-80GB; our notes do not name it), 64 GiB of
  host swap space per GPU (a DGX node has 1-2 TB), and the latency SLO below.

The headline is throughput at the same latency requirement: for each policy, the highest
arrival rate whose mean job completion time (JCT) stays within ``SLO_SCALE`` times the mean
standalone JCT (each job alone on the idle GPU), found by linear interpolation between the
swept rates; the ratio is FastServe's over vLLM's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetsim.repro.frame import (
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    add,
    better_ratio,
)

SLO_SCALE = 5.0  # mean JCT within 5x the standalone mean (our choice; see the docstring)
MAX_BATCH = 16  # the paper's max batch size
TOKENS_PER_BATCH = 2048  # the paper's tokens per batch
NUM_REQUESTS, QUICK_REQUESTS = 400, 60
RATES = (1.0, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0)
QUICK_RATES = (2.0, 4.0)

LENGTHS = {  # vLLM's ShareGPT benchmark filter
    "prompt_tokens": {"kind": "empirical", "path": "embedded:sharegpt_lengths",
                      "column": "num_prefill_tokens", "max_tokens": 1024},
    "output_tokens": {"kind": "empirical", "path": "embedded:sharegpt_lengths",
                      "column": "num_decode_tokens", "max_tokens": 1024},
}

# policy -> (batching spec, max running requests)
POLICIES: dict[str, tuple[dict[str, Any], int]] = {
    "fastserve": ({"name": "fastserve", "args": {"scheduler": "mlfq",
                                                 "max_batch_size": MAX_BATCH}}, 256),
    "fcfs": ({"name": "fastserve", "args": {"scheduler": "fcfs",
                                            "max_batch_size": MAX_BATCH}}, 256),
    "srpt": ({"name": "fastserve", "args": {"scheduler": "srpt",
                                            "max_batch_size": MAX_BATCH}}, 256),
    "vllm": ({"name": "prefill_first"}, MAX_BATCH),
    "vllm-chunked": ({"name": "token_budget"}, MAX_BATCH),
}


def config(policy: str, rate: float, num_requests: int) -> dict[str, Any]:
    batching, max_running = POLICIES[policy]
    return {
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "a100"},
        "engine": {"max_batched_tokens": TOKENS_PER_BATCH, "max_running": max_running,
                   "swap_space_gib": 64.0},
        "policy": {"batching": batching},
        "workload": {"trace": None, "arrival": "poisson", "rate_per_s": rate,
                     "num_requests": num_requests, **LENGTHS},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},  # the JCT SLO is applied here, not per token
        "seed": 0,
    }


def compare(ctx: ReproContext) -> Comparison:
    rates = QUICK_RATES if ctx.quick else RATES
    n = QUICK_REQUESTS if ctx.quick else NUM_REQUESTS
    mean_jct: dict[str, dict[str, float | None]] = {}
    p90_jct: dict[str, dict[str, float | None]] = {}
    for policy in POLICIES:
        mean_jct[policy], p90_jct[policy] = {}, {}
        for rate in rates:
            label = f"{rate:g}"
            summary = ctx.run(policy, label, config(policy, rate, n)).summary
            unfinished = summary["num_unfinished"]
            mean_jct[policy][label] = summary["e2e_s"]["mean"] if not unfinished else None
            p90_jct[policy][label] = summary["e2e_s"]["p90"] if not unfinished else None
    slo_s = SLO_SCALE * _standalone_mean_jct(ctx, rates)
    throughput = {p: _rate_within(rates, list(v.values()), slo_s) for p, v in mean_jct.items()}
    ratio = better_ratio(throughput["fastserve"], throughput["vllm"], "higher")
    notes = [f"latency SLO: mean JCT <= {slo_s:.2f} s ({SLO_SCALE:g}x the mean standalone "
             f"JCT); throughput within it, req/s: "
             + ", ".join(f"{p} {_fmt(v)}" for p, v in throughput.items()),
             "p90 JCT, s, per rate: " + "; ".join(
                 f"{p} " + "/".join(_fmt(x) for x in v.values()) for p, v in p90_jct.items())]
    for policy in ("fcfs", "srpt", "vllm-chunked"):
        r = better_ratio(throughput["fastserve"], throughput[policy], "higher")
        notes.append(f"fastserve vs {policy}: {_fmt(r)}x")
    return Comparison(results=mean_jct, ratio=ratio, headline=throughput, notes=notes)


def _standalone_mean_jct(ctx: ReproContext, rates: tuple[float, ...]) -> float:
    """Mean JCT of the lowest-rate workload's jobs each alone on the idle GPU."""
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.perf import build_step_model
    from fleetsim.serving.standalone import standalone_latency_s

    result = ctx.runs[("vllm", f"{rates[0]:g}")]
    req = result.records.requests
    model = build_step_model(get_model("llama-3.1-8b"), get_gpu("a100"), 1)
    latency = standalone_latency_s(model, req["num_prompt_tokens"], req["num_output_tokens"],
                                   TOKENS_PER_BATCH)
    return float(np.mean(latency))


def _rate_within(rates: tuple[float, ...], values: list[float | None], slo_s: float
                 ) -> float | None:
    """The highest rate whose value stays within ``slo_s``, interpolating linearly between
    the last swept rate within and the first beyond (None if even the lowest misses)."""
    best = None
    for i, (rate, value) in enumerate(zip(rates, values, strict=True)):
        if value is None or value > slo_s:
            if best is not None and value is not None:
                prev = values[i - 1]
                assert prev is not None
                best = rates[i - 1] + (rate - rates[i - 1]) * (slo_s - prev) / (value - prev)
            return best
        best = rate
    return best


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


FASTSERVE = add(Reproduction(
    key="fastserve",
    paper=Paper(title="FastServe: Iteration-Level Preemptive Scheduling for Large Language "
                      "Model Inference", id="arXiv:2305.05920", venue="NSDI'26"),
    claim="Up to 6.1x throughput against vLLM at the same latency requirement (NSDI'26 "
          "abstract); earlier versions: 31.4x / 17.9x at the same mean / tail latency.",
    setup=f"Llama-3-8B on one A100-80GB, ShareGPT lengths (prompt and output <= 1,024), "
          f"Poisson arrivals at {', '.join(f'{r:g}' for r in RATES)} req/s, "
          f"{NUM_REQUESTS} jobs per run, max batch {MAX_BATCH}, {TOKENS_PER_BATCH} tokens "
          f"per batch, 64 GiB host swap space",
    system="fastserve",
    baselines=("vllm", "vllm-chunked", "fcfs", "srpt"),
    baseline="vllm",
    metric=Metric(name="mean job completion time", unit="s", direction="lower"),
    headline_metric=Metric(name="throughput within the mean-JCT SLO", unit="req/s",
                           direction="higher"),
    ratio_definition=(f"highest rate with mean JCT <= {SLO_SCALE:g}x the standalone mean, "
                      f"fastserve over vllm"),
    paper_ratio=6.1,
    loads=Loads(name="arrival rate", unit="req/s", values=RATES, quick_values=QUICK_RATES),
    compare=compare,
))
