"""Compare fleetsim's pipeline-parallel replicas against published PP vs TP measurements.

1. Substratus, "Benchmarking 70B model on 8 x L4 GPUs vLLM: Pipeline vs Tensor Parallelism"
   (substratus.ai/blog/benchmarking-llama-3.1-70b-on-l4, 2024): vLLM (KubeAI, late 2024, so the
   V0 engine), neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8 with --kv-cache-dtype=fp8 on one
   node of 8 L4 (PCIe, no NVLink), vLLM's benchmark_serving.py on ShareGPT (1,000 prompts, all
   sent at once: its default --request-rate inf), flags --max-num-batched-token=32768
   --max-num-seqs=512 --gpu-memory-utilization=0.9 --enable-prefix-caching
   --enable-chunked-prefill=false --enforce-eager. Published: PP4 x TP2 1.76 req/s and 307.61
   output tok/s; PP2 x TP4 1.50 req/s and 261.16 output tok/s.
2. NVIDIA, "Boosting Llama 3.1 405B Throughput by Another 1.5x on NVIDIA H200 Tensor Core GPUs
   and NVLink Switch" (developer.nvidia.com technical blog, October 2024): Llama-3.1-405B FP8 on
   one HGX H200 (8 GPUs) with TensorRT-LLM; in the minimum-latency scenario (one request) TP8 is
   5.6x faster than PP8. A different engine from vLLM; only the ratio is compared, on one decode
   step.
3. vLLM issue #6610 ("Multi-node Pipeline Parallel double bandwidth, no change in performance",
   github.com/vllm-project/vllm/issues/6610, July 2024): Llama-3-70B-Instruct, PP2 over two
   GH200 nodes (one GPU each); 400 and 800 Gb/s between the nodes gave the same tokens/s.
   Compared: the change in a decode step and a 4,096-token prefill step when the NIC doubles
   (an H200 stands in for the GH200's 96 GB Hopper: both Hopper at 4+ TB/s; bf16).

Every setting below is the published run's, or a fleetsim default; vLLM V0's CPU cost is
Vidur's profile (``vllm_v0_overhead``), as the other V0 validations use. Nothing is fitted to
these points. Run: ``python benchmarks/validate_pipeline.py`` (about a minute).
"""

from __future__ import annotations

from fleetsim.config import config_from_dict
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.perf import build_step_model
from fleetsim.perf.cpu_overhead import vllm_v0_overhead
from fleetsim.perf.pipeline import build_pipeline_step_model
from fleetsim.run import run

SUBSTRATUS = {  # (pp, tp) -> (requests/s, output tokens/s), as published
    (4, 2): (1.76, 307.61),
    (2, 4): (1.50, 261.16),
}
NVIDIA_MIN_LATENCY_TP_OVER_PP = 5.6


def substratus_config(pp: int, tp: int) -> dict:
    fixed_s, per_seq_s = vllm_v0_overhead(tp)  # V0's CPU cost per scheduled batch
    return {
        "seed": 12345,  # the blog's --seed
        "model": "llama-3.1-70b",
        "quantization": "fp8",
        "hardware": {"gpu": "l4", "tp": tp, "pp": pp},
        "engine": {"max_num_seqs": 512, "max_num_batched_tokens": 32768,
                   "gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
                   "enable_chunked_prefill": False, "kv_cache_dtype": "fp8",
                   "step_overhead_s": fixed_s, "step_overhead_per_seq_s": per_seq_s},
        "perf_backend": "roofline",  # no measured tables for the L4
        # The blog's ShareGPT sample served 233 prompt and 175 output tokens per request on
        # average (its total minus output tok/s, over req/s: (717.77 - 307.61) / 1.76 and
        # 307.61 / 1.76); the embedded ShareGPT lengths are another cut (etalon's 8k-filtered
        # conversations, 2.4x longer outputs), so lengths are lognormal with the published
        # means and cv 1 (an assumption: ShareGPT's lengths are heavy-tailed).
        "workload": {"trace": "synthetic", "arrival": "at_once", "num_requests": 1000,
                     "prompt_tokens": {"kind": "lognormal", "mean": 233.0, "cv": 1.0},
                     "output_tokens": {"kind": "lognormal", "mean": 175.0, "cv": 1.0}},
    }


def main() -> None:
    print("| run | published req/s | fleetsim req/s | error % | published out tok/s | "
          "fleetsim out tok/s | error % |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ours = {}
    for (pp, tp), (req_s, tok_s) in SUBSTRATUS.items():
        s = run(config_from_dict(substratus_config(pp, tp))).summary["throughput"]
        ours[pp, tp] = s["requests_per_s"]
        print(f"| 8x L4, PP{pp} x TP{tp} | {req_s:.2f} | {s['requests_per_s']:.2f} | "
              f"{100 * (s['requests_per_s'] / req_s - 1):+.1f} | {tok_s:.1f} | "
              f"{s['output_tokens_per_s']:.1f} | "
              f"{100 * (s['output_tokens_per_s'] / tok_s - 1):+.1f} |")
    measured = SUBSTRATUS[4, 2][0] / SUBSTRATUS[2, 4][0]
    predicted = ours[4, 2] / ours[2, 4]
    print(f"| PP4xTP2 / PP2xTP4 | {measured:.3f}x | {predicted:.3f}x | "
          f"{100 * (predicted / measured - 1):+.1f} | | | |")

    model = quantize(get_model("llama-3.1-405b"), "fp8")
    h200 = get_gpu("h200")
    tp8 = build_step_model(model, h200, 8)
    pp8 = build_pipeline_step_model(
        model, h200, 1, 8, "auto", step_overhead_s=1.5e-3, step_overhead_per_seq_s=0.0,
        kernel_time_scale=1.0, async_scheduling=False, async_step_gap_s=160e-6)
    ratio = pp8.step_time_s((), 1, 2048) / tp8.step_time_s((), 1, 2048)
    import dataclasses

    l3 = get_model("llama-3.1-70b")  # Llama-3 70B's shapes (Llama-3.1 only widened RoPE)
    steps = []
    for gbps in (400, 800):
        gpu = dataclasses.replace(h200, num_gpus_per_node=1,
                                  network_bw_bytes_per_s=gbps / 8 * 1e9)
        sm = build_pipeline_step_model(
            l3, gpu, 1, 2, "auto", step_overhead_s=1.5e-3, step_overhead_per_seq_s=0.0,
            kernel_time_scale=1.0, async_scheduling=False, async_step_gap_s=160e-6)
        steps.append((sm.step_time_s((), 64, 64 * 1000), sm.step_time_s([(4096, 0)], 0, 0)))
    for i, what in enumerate(("decode step, 64 x 1,000 tokens", "prefill step, 4,096 tokens")):
        change = 100 * (steps[0][i] / steps[1][i] - 1)
        print(f"| PP2 over 2 nodes, 400 -> 800 Gb/s: {what} | 0% | {change:+.2f}% | | | | |")
    print(f"| 405B FP8, 8x H200, one request: PP8 / TP8 step | "
          f"{NVIDIA_MIN_LATENCY_TP_OVER_PP:.1f}x | {ratio:.2f}x | "
          f"{100 * (ratio / NVIDIA_MIN_LATENCY_TP_OVER_PP - 1):+.1f} | | | |")


if __name__ == "__main__":
    main()
