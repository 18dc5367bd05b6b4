"""AReaL-TIK / KernelBraid (arXiv 2609.35140, as a secondary summary of the paper gives it):
bitwise-aligned unified rollout and training kernels let the trainer reuse the rollout's
log-probabilities, removing the recompute forward pass, at the price of slower attention
kernels.

Parameters and their sources ([P]: the public areal-project/AReaL-TIK and inclusionAI/AReaL
repositories; [S]: secondary summaries of the paper):
- the kernel slowdowns on H20: vendor over unified latency 0.710 for decode attention
  (FlashInfer) and 0.964 for prefill attention (FA3), from the public
  ``experimental/figures/attention_performance.csv`` of areal-project/AReaL-TIK [P]; the
  unified kernels serve rollout (decode and prefill) and every training-side forward;
- the baseline: AReaL with log-prob recomputation (an extra actor forward over prompt plus
  response) [P code, S paper]; both run AReaL's disaggregated pipeline *synchronously*
  (``max_head_offpolicyness = 0``: the trainer takes a whole batch generated with the current
  weights). The mechanism needs that setting: in AReaL's asynchronous mode the recompute pass
  (``actor.recompute_logprob: true``) produces the *proximal* policy's log-probs for the
  decoupled PPO loss (``use_decoupled_loss: true``, inclusionAI/AReaL
  ``examples/math/gsm8k_grpo.yaml``), which are not the rollout's and which matching kernels
  cannot replace: ``areal/engine/ppo/actor.py`` takes the behaviour log-probs "FROM
  INFERENCE" and recomputes the proximal ones by a forward pass under the decoupled loss, and
  only in standard on-policy PPO lets the recomputed values overwrite the inference ones
  (``compute_advantages``). So only when the behaviour and proximal policies coincide
  (synchronous) is the recompute pass the one matching kernels make redundant;
- AReaL's default split of generation and training GPUs: half and half
  (``allocation_mode: sglang:d4p1t1+d4p1t1`` on 8 GPUs in the same file), so 16 H20 are 8
  generation + 8 training (4 + 4 with --quick);
- H20 GPUs, end-to-end throughput averaged over configurations (the paper: 12 configs, 1.10x
  on average) [S];
- our choices (the 12 configs are not in what we could read: models, lengths and H20 counts
  are ours): Qwen2.5-7B GRPO on 16 H20, 128 prompts x 8 samples, maximum response
  lengths 4K / 8K / 16K with PolyTrace's DeepCoder-14B group lengths scaled by cap / 16,000
  (reasoning-length responses, as the StreamRL entry, which says why), 3 steps. H20 has no
  measured tables: its times are roofline.
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
    fmt_ratios,
)
from fleetsim.rl.runs import run_kept

H20_DECODE_VENDOR_OVER_UNIFIED = 0.710  # attention_performance.csv, H20 decode vs FlashInfer
H20_PREFILL_VENDOR_OVER_UNIFIED = 0.964  # attention_performance.csv, H20 prefill vs FA3
MODEL = "qwen2.5-7b"
GPUS, QUICK_GPUS = (8, 8), (4, 4)  # (generation, training): AReaL's d4+d4 half split
PROMPTS, QUICK_PROMPTS = 128, 32
GROUP = 8
STEPS = 3
MAX_LENGTHS = (4096.0, 8192.0, 16384.0)
QUICK_LENGTHS = (8192.0,)
RUN_CAP = 16000  # DeepCoder-14B's response cap in PolyTrace's run (as in the StreamRL entry)


def config(tik: bool, max_len: int, gpus: tuple[int, int], prompts: int) -> dict[str, Any]:
    # Synchronous: the precondition of log-prob reuse (module docstring).
    system: dict[str, Any] = {"name": "areal-tik" if tik else "areal", "streaming": False,
                              "staleness": 0, "recompute_logprobs": not tik}
    if tik:
        system["rollout_decode_attention_slowdown"] = 1 / H20_DECODE_VENDOR_OVER_UNIFIED
        system["rollout_prefill_attention_slowdown"] = 1 / H20_PREFILL_VENDOR_OVER_UNIFIED
    return {
        "num_steps": STEPS, "actor": MODEL, "num_prompts_per_step": prompts,
        "samples_per_prompt": GROUP, "max_response_tokens": max_len,
        "lengths": {"kind": "polytrace", "run": "deepcoder-14b",
                    "scale": max_len / RUN_CAP},
        "pools": [{"name": "generation", "gpu": "h20", "num_gpus": gpus[0],
                   "stages": ["generation"]},
                  {"name": "trainer", "gpu": "h20", "num_gpus": gpus[1],
                   "stages": ["inference", "training"]}],
        "generation": {"engine": {"max_running": 1024, "gpu_memory_utilization": 0.9,
                                  "enable_prefix_caching": False}},
        "system": system,
    }


def compare(ctx: ReproContext) -> Comparison:
    gpus = QUICK_GPUS if ctx.quick else GPUS
    prompts = QUICK_PROMPTS if ctx.quick else PROMPTS
    lengths = QUICK_LENGTHS if ctx.quick else MAX_LENGTHS
    results: dict[str, dict[str, float | None]] = {"areal-tik": {}, "areal": {}}
    ratios = []
    notes = []
    for max_len in (int(x) for x in lengths):
        label = f"{max_len // 1024}K"
        for policy, tik in (("areal-tik", True), ("areal", False)):
            s = run_kept(ctx, policy, label, config(tik, max_len, gpus, prompts)).summary
            results[policy][label] = s["steady_samples_per_s"]
            notes.append(f"{policy} @ {label}: stage seconds per step " + ", ".join(
                f"{k} {v:.1f}" for k, v in s["stage_time_s"].items()))
        ratios.append(better_ratio(results["areal-tik"][label], results["areal"][label],
                                   "higher"))
    valid = [r for r in ratios if r is not None]
    ratio = sum(valid) / len(valid) if valid else None
    notes.insert(0, f"areal-tik / areal per length: {fmt_ratios(ratios, 3)} "
                    f"(paper: 1.10x on average)")
    return Comparison(results=results, ratio=ratio, notes=notes)


AREAL_TIK = add(Reproduction(
    key="areal-tik",
    paper=Paper(title="AReaL-TIK: Stateful Agentic Optimization of Unified RL Kernels through "
                      "an Optimization IR", id="arXiv:2609.35140"),
    claim="1.10x average end-to-end RL throughput against AReaL with log-probability "
          "recomputation, over 12 configurations on H20.",
    setup=f"Qwen2.5-7B GRPO on {sum(GPUS)} H20 ({GPUS[0]} generation + {GPUS[1]} training; "
          f"{sum(QUICK_GPUS)} with --quick), {PROMPTS} prompts x {GROUP} samples, max response "
          f"4K/8K/16K (DeepCoder group lengths scaled to the cap), synchronous (the mechanism's "
          f"precondition), AReaL's half split; "
          f"unified kernels: decode attention x{1 / H20_DECODE_VENDOR_OVER_UNIFIED:.3f}, "
          f"prefill x{1 / H20_PREFILL_VENDOR_OVER_UNIFIED:.3f} slower",
    system="areal-tik",
    baselines=("areal",),
    baseline="areal",
    metric=Metric(name="steady-state throughput", unit="samples/s", direction="higher"),
    ratio_definition="mean over the max lengths of areal-tik / areal samples/s",
    paper_ratio=1.10,
    paper_ratio_source="abstract: 1.10x averaged over the paper's 12 H20 configurations, the "
                       "same averaging as the ratio; the 12 configurations and their own "
                       "values are not in what we could read, so the average stands for the panel",
    paper_best=None,
    loads=Loads(name="max response length", unit="tokens", values=MAX_LENGTHS,
                quick_values=QUICK_LENGTHS),
    compare=compare,
))
