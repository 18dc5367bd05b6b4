"""Compare fleetsim's wide-EP replica (``hardware.dp_attention``) with LMSYS's H100 decode.

LMSYS / SGLang team, "Deploying DeepSeek with PD Disaggregation and Large-scale Expert
Parallelism on 96 H100 GPUs" (lmsys.org/blog/2025-05-05-large-scale-ep, May 2025): DeepSeek-V3
(FP8 checkpoint) decode on 9 nodes of 8 H100 (InfiniBand, one 400 Gb/s NIC per GPU), SGLang
with ``--tp-size 72 --dp-size 72 --enable-dp-attention --enable-deepep-moe --deepep-mode
low_latency --enable-two-batch-overlap --ep-num-redundant-experts 32 --cuda-graph-bs 256``
(the launch command of its reproduction instructions, sgl-project/sglang issue #6017), decode
saturated with the blog's slow-down API, 2,000-token inputs and 100-token outputs: 22.3k output
tokens/s per node (22,282).

fleetsim's step for that batch: 256 decodes per attention rank (the CUDA-graph batch the
saturated decode reaches), each with 2,050 cached tokens (2,000 prompt plus half of the 100
outputs). Two differences are forced and stated: 64 GPUs (8 nodes) instead of 72, because the
EP model places the 256 experts in equal shares and 256 do not split over 72 GPUs without
SGLang's 32 redundant slots; per-node throughput at a fixed per-rank batch barely depends on
the group size (the NIC share of the all-to-all is 56/64 against 64/72). Two-batch overlap
(which hides the all-to-all behind compute) is not modelled. Reported twice: with static
expert placement (the layout's default, vLLM without --enable-eplb) and with the MoE layers
force-balanced (the ideal EPLB approaches). Nothing is fitted.

Run: ``python benchmarks/validate_wide_ep.py`` (a few seconds).
"""

from __future__ import annotations

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.moe.serving import PoolEpConfig
from fleetsim.moe.wide_ep import DpAttentionStepModel
from fleetsim.perf import build_step_model

PUBLISHED_TOKENS_PER_S_PER_NODE = 22_282
DP, PER_RANK, CONTEXT = 64, 256, 2_050


def main() -> None:
    model, gpu = quantize(get_model("deepseek-v3"), "fp8_block"), get_gpu("h100")
    base = build_step_model(model, gpu, 1)
    wide = DpAttentionStepModel(base, model, gpu, 1, DP,
                                PoolEpConfig(balancer="none", num_spare_slots_per_gpu=0))
    n = DP * PER_RANK
    step_s = wide.step_time_s((), n, n * CONTEXT)
    moe_s = wide.group_moe_s(n)
    balanced_s = step_s - moe_s + moe_s / wide.balance_ratio
    nodes = DP // gpu.num_gpus_per_node
    print(f"DeepSeek-V3 FP8, {DP} x H100 (dp {DP} x tp 1), {PER_RANK} decodes per rank, "
          f"{CONTEXT} cached tokens each")
    for what, s in (("static placement", step_s), ("force-balanced MoE", balanced_s)):
        rate = n / s / nodes
        err = rate / PUBLISHED_TOKENS_PER_S_PER_NODE - 1
        print(f"  {what:20s} step {s * 1e3:6.1f} ms  {rate:8.0f} tok/s/node  "
              f"(LMSYS {PUBLISHED_TOKENS_PER_S_PER_NODE}: {err:+.0%})")
    print(f"  MoE layers {moe_s * 1e3:.1f} ms ({wide.balance_ratio:.2f}x force-balanced)")
    for key in ("moe", "dp_attention", "attention"):
        print(f"  {key}: {wide.sources[key]}")


if __name__ == "__main__":
    main()
