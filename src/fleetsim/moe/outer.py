"""What a Megatron-LM MoE training step spends outside one expert-parallel micro-batch: the
pipeline bubble, the activations between pipeline stages, the data-parallel gradient reduction
and the optimizer step, each spread over the step's micro-batches.

The layout is a published one: NVIDIA's Megatron-Bridge performance recipe for Qwen3-235B-A22B
in BF16 on DGX-GB200 (NVIDIA-NeMo/Megatron-Bridge, ``docs/performance-summary.md``, NeMo 25.11:
256 GPUs, GBS 8,192, MBS 1, sequence 4,096, TP 1, PP 8, VP 3, EP 32, GA 256), the recipe that
measures 4,916 tokens/s/GPU with force-balanced routing. These parts are the same for every
balancing policy (none of them depends on the expert placement); ``ep_pass.EpPassModel`` prices
the micro-batch itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf import roofline as rl
from fleetsim.perf.training import OPTIMIZER_BYTES_PER_PARAM


@dataclass(frozen=True, slots=True, kw_only=True)
class OuterLayout:
    """Parallelism outside the EP group (defaults: Megatron-Bridge's GB200 Qwen3-235B row)."""

    pp: int = 8
    """Pipeline stages."""
    vp: int = 3
    """Virtual stages per pipeline rank (interleaved 1F1B)."""
    num_microbatches: int = 256
    """Micro-batches per pipeline per optimizer step (GA = GBS / (DP x MBS))."""
    dp: int = 32
    """Data-parallel replicas of the dense (non-expert) weights."""
    ep: int = 32
    """Expert-parallel ranks the experts of one stage are spread over."""
    tokens_per_microbatch: int = 4096
    """MBS x sequence length."""

    def __post_init__(self) -> None:
        for name in ("pp", "vp", "num_microbatches", "dp", "ep", "tokens_per_microbatch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FleetsimInputError(name, value, "must be an integer >= 1")


def outer_s(model: ModelSpec, gpu: GPUSpec, layout: OuterLayout, microbatch_s: float
            ) -> dict[str, float]:
    """Seconds per micro-batch of each part outside the EP micro-batch of ``microbatch_s``
    seconds (one whole-model forward and backward):

    - ``bubble``: interleaved 1F1B idles ``(pp - 1) / (vp m)`` of the step's compute
      (Narayanan et al., SC'21, sec. 2.2.2);
    - ``p2p``: each stage boundary sends the activations forward and their gradients back
      (``tokens x hidden`` bf16) over NVLink, ``2 vp`` boundaries per rank and micro-batch;
    - ``grad_reduce``: the fp32 gradients of a stage's dense weights all-reduced over ``dp``
      ranks across racks (the network), once per step, counted whole (not overlapped: an upper
      bound; Megatron overlaps it with the last backward);
    - ``optimizer``: memory-bound Adam over the GPU's share of the weights (experts: ``1 / (pp
      ep)``; dense: ``1 / (pp dp)``, the distributed optimizer), once per step.
    """
    m, pp = layout.num_microbatches, layout.pp
    expert = model.num_params - _dense_params(model)
    dense_per_gpu = _dense_params(model) / pp
    bubble = (pp - 1) / (layout.vp * m) * microbatch_s
    act_bytes = layout.tokens_per_microbatch * model.hidden_size * 2
    p2p = 2 * layout.vp * act_bytes / gpu.nvlink_bw_bytes_per_s if pp > 1 else 0.0
    dp = layout.dp
    reduce = (2 * (dp - 1) / dp * dense_per_gpu * 4
              / (gpu.network_bw_bytes_per_s * rl.ALLREDUCE_BW_EFF)) / m
    params = expert / (pp * layout.ep) + dense_per_gpu / dp
    optimizer = params * OPTIMIZER_BYTES_PER_PARAM / (
        gpu.hbm_bw_bytes_per_s * rl.GEMM_MEMORY_EFF) / m
    return {"bubble": bubble, "p2p": p2p, "grad_reduce": reduce, "optimizer": optimizer}


def _dense_params(model: ModelSpec) -> int:
    """Everything but the routed experts (attention, router, shared experts, embeddings)."""
    if not model.is_moe:
        return model.num_params
    routed = model.num_moe_layers * 3 * model.hidden_size * model.moe_intermediate_size * (
        model.num_experts)
    return model.num_params - routed
