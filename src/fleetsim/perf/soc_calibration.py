"""The Core Ultra 7 258V's efficiencies, derived from public measurements on that chip, and the
check of the resulting device model against measurements it was not derived from.

An efficiency is what a measured rate implies: measured time over the roofline time at the
datasheet peak. Nothing here looks at Agent.xpu's results.

Derived from (``CALIBRATION``):
- iGPU compute and memory: lhl's llama.cpp runs on a Core Ultra 7 258V (r/LocalLLaMA, "Lunar
  Lake llama.cpp" testing post, Nov 2024): Llama-2-7B Q4_0 through the IPEX-LLM backend,
  pp512 708.15 tok/s and tg128 24.35 tok/s.
- NPU memory: OpenVINO Model Hub, DeepSeek-R1-Distill-Llama-8B INT4 on a Core Ultra 7 (Lunar
  Lake) NPU, 6.10 tok/s decode (quoted in "On the Edge: Agentic AI for Neural Processors"
  section 1.3, bookstack.primecoder.com; secondary).
- NPU compute: no public NPU prefill measurement on this chip was found, so fleetsim's GEMM
  compute efficiency (0.70, ``perf/roofline.py``) stands in; Agent.xpu's NPU-for-prefill
  affinity holds for any NPU efficiency above 0.40 (``igpu compute`` x 32/24).

Held out (``VALIDATION``), each from a different engine than the calibration, so their spread
is also the spread between engines on the same silicon:
- the same OpenVINO Model Hub entry's iGPU decode, 12.80 tok/s;
- elizaOS/eliza pull request #7632 (bench on a Core Ultra 7 258V, May 2026): Llama-3.2-3B
  Q4_K_M through a llama.cpp Vulkan fork on the iGPU, 20.0 tok/s decode;
- intel/ipex-llm issue #13074 (Core Ultra 7 268V, same NPU 4 and LPDDR5X-8533): a Qwen2-7B
  shaped Q4_0 model (DeepSeek-R1-Distill-Qwen-7B) on the NPU through IPEX-LLM's llama.cpp,
  11.46 tok/s decode (the reporter's output was garbled by a driver mismatch, so the speed
  is indicative only).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.hardware.soc import (
    LUNAR_LAKE_DDR_BW,
    LUNAR_LAKE_IGPU_FP16,
    LUNAR_LAKE_MEMORY,
    LUNAR_LAKE_NPU_FP16,
    AcceleratorSpec,
    SoCSpec,
)
from fleetsim.models import get_model
from fleetsim.perf.soc import ModelCost, compute_s

NPU_COMPUTE_EFF_ASSUMED = 0.70  # fleetsim's GEMM_COMPUTE_EFF (perf/roofline.py); no NPU data


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """A published LLM speed on one accelerator of the SoC."""

    source: str
    accelerator: str
    model: str
    bits_per_weight: float
    stage: str
    """``"prefill"`` (``num_tokens`` prompt, tok/s over the prompt) or ``"decode"`` (tok/s
    while generating after a ``num_tokens`` context)."""
    num_tokens: int
    tokens_per_s: float

    def cost(self) -> ModelCost:
        return ModelCost(get_model(self.model), self.bits_per_weight)


LHL_PREFILL = Measurement(
    source="lhl, r/LocalLLaMA Lunar Lake llama.cpp post (IPEX-LLM backend, pp512)",
    accelerator="igpu", model="Llama-2-7B", bits_per_weight=4.5, stage="prefill",
    num_tokens=512, tokens_per_s=708.15)
LHL_DECODE = Measurement(
    source="lhl, r/LocalLLaMA Lunar Lake llama.cpp post (IPEX-LLM backend, tg128)",
    accelerator="igpu", model="Llama-2-7B", bits_per_weight=4.5, stage="decode",
    num_tokens=64, tokens_per_s=24.35)
OPENVINO_NPU_DECODE = Measurement(
    source="OpenVINO Model Hub, DeepSeek-R1-Distill-Llama-8B INT4, NPU (via bookstack §1.3)",
    accelerator="npu", model="Llama-3.1-8B", bits_per_weight=4.5, stage="decode",
    num_tokens=1024, tokens_per_s=6.10)
OPENVINO_IGPU_DECODE = Measurement(
    source="OpenVINO Model Hub, DeepSeek-R1-Distill-Llama-8B INT4, iGPU (via bookstack §1.3)",
    accelerator="igpu", model="Llama-3.1-8B", bits_per_weight=4.5, stage="decode",
    num_tokens=1024, tokens_per_s=12.80)

ELIZA_IGPU_DECODE = Measurement(
    source="elizaOS/eliza PR #7632, Llama-3.2-3B Q4_K_M, llama.cpp Vulkan fork, iGPU",
    accelerator="igpu", model="Llama-3.2-3B", bits_per_weight=4.85, stage="decode",
    num_tokens=128, tokens_per_s=20.0)  # Q4_K_M: ~4.85 bits per weight (llama.cpp quantize)
IPEX_NPU_DECODE = Measurement(
    source="intel/ipex-llm issue #13074, Qwen2-7B-shaped Q4_0, IPEX-LLM llama.cpp, NPU",
    accelerator="npu", model="Qwen2.5-7B", bits_per_weight=4.5, stage="decode",
    num_tokens=38, tokens_per_s=11.46)  # Qwen2.5-7B has Qwen2-7B's shapes (28 x 3584, 152064)

CALIBRATION = (LHL_PREFILL, LHL_DECODE, OPENVINO_NPU_DECODE)
VALIDATION = (OPENVINO_IGPU_DECODE, ELIZA_IGPU_DECODE, IPEX_NPU_DECODE)


def _prefill_flops(m: Measurement) -> float:
    return m.cost().prefill(m.num_tokens, 0).flops


def _decode_bytes(m: Measurement) -> float:
    return m.cost().decode([m.num_tokens]).bytes


def compute_eff_from(m: Measurement, peak_flops: float) -> float:
    """Achieved FLOP rate of a measured prefill over the peak."""
    measured_s = m.num_tokens / m.tokens_per_s
    return _prefill_flops(m) / (peak_flops * measured_s)


def memory_eff_from(m: Measurement, ddr_bw: float) -> float:
    """Bandwidth a measured decode step streams (weights + KV) over the DDR peak."""
    return _decode_bytes(m) * m.tokens_per_s / ddr_bw


def lunar_lake() -> SoCSpec:
    """Core Ultra 7 258V with efficiencies derived from ``CALIBRATION``."""
    igpu = AcceleratorSpec(
        name="igpu", peak_fp16_flops=LUNAR_LAKE_IGPU_FP16,
        compute_eff=compute_eff_from(LHL_PREFILL, LUNAR_LAKE_IGPU_FP16),
        memory_eff=memory_eff_from(LHL_DECODE, LUNAR_LAKE_DDR_BW))
    npu = AcceleratorSpec(
        name="npu", peak_fp16_flops=LUNAR_LAKE_NPU_FP16, compute_eff=NPU_COMPUTE_EFF_ASSUMED,
        memory_eff=memory_eff_from(OPENVINO_NPU_DECODE, LUNAR_LAKE_DDR_BW))
    # The memory controller delivers at most what the hungriest agent was measured to draw.
    share = max(igpu.memory_eff, npu.memory_eff)
    return SoCSpec(name="Core Ultra 7 258V", npu=npu, igpu=igpu,
                   ddr_bw_bytes_per_s=LUNAR_LAKE_DDR_BW, ddr_achievable_share=share,
                   memory_bytes=LUNAR_LAKE_MEMORY)


def predicted_tokens_per_s(soc: SoCSpec, m: Measurement) -> float:
    """The device model's speed for the measurement's setting (the accelerator alone)."""
    acc = soc.accelerator(m.accelerator)
    cost = m.cost()
    bw = acc.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s)
    if m.stage == "prefill":
        op = cost.prefill(m.num_tokens, 0)
        return m.num_tokens / max(compute_s(acc, op), op.bytes / bw)
    op = cost.decode([m.num_tokens])
    return 1.0 / max(compute_s(acc, op), op.bytes / bw)


def model_errors(soc: SoCSpec) -> list[tuple[Measurement, float, float]]:
    """(measurement, predicted tok/s, relative error) for every held-out measurement."""
    out = []
    for m in VALIDATION:
        predicted = predicted_tokens_per_s(soc, m)
        out.append((m, predicted, predicted / m.tokens_per_s - 1.0))
    return out
