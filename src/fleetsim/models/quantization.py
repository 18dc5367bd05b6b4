"""Weight/activation quantization modes and KV-cache dtypes, by vLLM's and AIConfigurator's names.

A mode says, for the dense linear layers (attention projections, dense and shared-expert MLPs)
and for the routed experts separately, how many bits a weight takes in memory (scales
included), which tensor-core format the GEMM computes in, and which ``gemm_dtype`` /
``moe_dtype`` rows of aiconfigurator-core's measured tables price it. Embeddings, the LM head,
norms and MoE routers stay 16-bit, as vLLM's and ModelOpt's quantizers leave them.

Bits per weight, scales included (each a format definition, not a fit):
- fp8 / fp8_static / fp8_block: 8 bits; per-tensor or per-channel scales are negligible, and
  DeepSeek-V3's 128x128 fp32 block scales add 32 / 16384 bits (arXiv:2412.19437, sec. 3.3.2).
- int8_wo, sq (SmoothQuant W8A8, arXiv:2211.10438): 8 bits, per-channel scales.
- int4_wo (AWQ arXiv:2306.00978 / GPTQ arXiv:2210.17323, group size 128 with a 16-bit scale):
  4 + 16 / 128 = 4.125 bits; w4afp8 packs the same int4 groups and runs the GEMM in FP8.
- nvfp4: 4-bit E2M1 plus one FP8 E4M3 scale per 16 elements = 4.5 bits (NVIDIA, "Introducing
  NVFP4 for Efficient and Accurate Low-Precision Inference", 2025).
- w4a16_mxfp4: 4-bit E2M1 plus one E8M0 scale per 32 elements = 4.25 bits (OCP Microscaling
  Formats (MX) Specification v1.0, 2023); gpt-oss ships its experts so and keeps the rest
  BF16 (gpt-oss model card, arXiv:2508.10925).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fleetsim.errors import FleetsimInputError
from fleetsim.models.spec import ModelSpec

COMPUTE_FORMATS = ("bf16", "fp8", "int8", "fp4")
"""Tensor-core formats a GEMM can compute in (``GPUSpec`` says which a GPU has)."""


@dataclass(frozen=True, slots=True)
class QuantPart:
    """How one group of linear layers is stored and computed."""

    weight_bits: float
    """Bits per weight in HBM, scales included."""
    compute: str
    """Tensor-core format of the GEMM: one of ``COMPUTE_FORMATS``."""
    tables: tuple[str, ...]
    """aiconfigurator-core ``gemm_dtype``/``moe_dtype`` names that measure it, first match."""

    @property
    def weight_bytes(self) -> float:
        return self.weight_bits / 8


@dataclass(frozen=True, slots=True)
class QuantMode:
    """A ``quantization`` setting: the dense layers' part and the routed experts' part."""

    name: str
    dense: QuantPart
    experts: QuantPart
    experts_only: bool = False
    """The mode quantizes MoE experts only (meaningless on a dense model)."""
    description: str = ""

    @property
    def compute_formats(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((self.dense.compute, self.experts.compute)))


BF16 = QuantPart(16, "bf16", ("bfloat16",))
_FP8 = QuantPart(8, "fp8", ("fp8",))
_FP8_BLOCK = QuantPart(8 + 32 / (128 * 128), "fp8", ("fp8_block",))
_INT4_GROUP_BITS = 4 + 16 / 128

QUANT_MODES: dict[str, QuantMode] = {m.name: m for m in (
    QuantMode("fp8", _FP8, _FP8, description="W8A8 FP8, dynamic per-tensor activation scales "
              "(vLLM --quantization fp8)"),
    QuantMode("fp8_static", QuantPart(8, "fp8", ("fp8_static",)), _FP8,
              description="W8A8 FP8 with static (calibrated) activation scales (ModelOpt FP8)"),
    QuantMode("fp8_block", _FP8_BLOCK, _FP8_BLOCK,
              description="W8A8 FP8 with 128x128 weight blocks (DeepSeek-V3's checkpoints)"),
    QuantMode("int8_wo", QuantPart(8, "bf16", ("int8_wo",)),
              QuantPart(8, "bf16", ("int8_wo",)), description="INT8 weights, BF16 compute"),
    QuantMode("int4_wo", QuantPart(_INT4_GROUP_BITS, "bf16", ("int4_wo",)),
              QuantPart(_INT4_GROUP_BITS, "bf16", ("int4_wo",)),
              description="INT4 weights in groups of 128, BF16 compute (AWQ, GPTQ)"),
    QuantMode("sq", QuantPart(8, "int8", ("sq",)), QuantPart(8, "int8", ("sq",)),
              description="SmoothQuant W8A8 INT8"),
    QuantMode("nvfp4", QuantPart(4.5, "fp4", ("nvfp4",)), QuantPart(4.5, "fp4", ("nvfp4",)),
              description="W4A4 NVFP4 (Blackwell)"),
    QuantMode("w4afp8", _FP8_BLOCK, QuantPart(_INT4_GROUP_BITS, "fp8", ("w4afp8",)),
              experts_only=True,
              description="MoE experts INT4 weights with FP8 compute; dense layers fp8_block"),
    QuantMode("w4a16_mxfp4", BF16, QuantPart(4.25, "bf16", ("w4a16_mxfp4",)),
              experts_only=True,
              description="MoE experts MXFP4 weights, BF16 compute; dense layers BF16 (gpt-oss)"),
)}
"""Modes by AIConfigurator's names (vLLM's ``fp8`` is AIConfigurator's ``fp8`` too)."""

VLLM_QUANTIZATION_ALIASES = {
    "awq": "int4_wo", "awq_marlin": "int4_wo", "gptq": "int4_wo", "gptq_marlin": "int4_wo",
    "modelopt": "fp8_static", "modelopt_fp4": "nvfp4", "mxfp4": "w4a16_mxfp4",
    "fbgemm_fp8": "fp8",
}
"""vLLM ``--quantization`` methods that map onto one mode above (its quantization/ folder)."""

KV_CACHE_DTYPE_BYTES = {"auto": None, "bfloat16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1,
                        "fp8_e5m2": 1}
"""vLLM's ``--kv-cache-dtype`` values -> bytes per element (None: the model's own, BF16)."""


def quant_mode(name: str, where: str = "quantization") -> QuantMode:
    """The mode named ``name`` (AIConfigurator's name or a vLLM alias); bad names fail."""
    mode = QUANT_MODES.get(VLLM_QUANTIZATION_ALIASES.get(name, name))
    if mode is None:
        raise FleetsimInputError(where, name, f"unknown mode; use one of "
                                 f"{', '.join(QUANT_MODES)} (or vLLM's "
                                 f"{', '.join(VLLM_QUANTIZATION_ALIASES)})")
    return mode


def modes_for(compute_formats: tuple[str, ...]) -> tuple[str, ...]:
    """Modes a GPU with these tensor-core formats runs (``GPUSpec.compute_formats``)."""
    return tuple(m.name for m in QUANT_MODES.values()
                 if set(m.compute_formats) <= set(compute_formats))


def check_kv_cache_dtype(value: str, where: str = "engine.kv_cache_dtype") -> None:
    if value not in KV_CACHE_DTYPE_BYTES:
        raise FleetsimInputError(where, value, f"use one of {', '.join(KV_CACHE_DTYPE_BYTES)}")


def quantize(model: ModelSpec, quantization: str | None, kv_cache_dtype: str = "auto"
             ) -> ModelSpec:
    """``model`` served with ``quantization`` (None: its checkpoint's dtype, unchanged) and
    ``kv_cache_dtype`` (``auto``: its own, BF16). Idempotent; the defaults return ``model``
    itself, so default runs are bit-identical to runs that never heard of quantization."""
    check_kv_cache_dtype(kv_cache_dtype)
    changes: dict[str, object] = {}
    if quantization is not None:
        mode = quant_mode(quantization)
        if mode.experts_only and not model.is_moe:
            raise FleetsimInputError("quantization", quantization,
                                     f"quantizes MoE experts only and {model.name} is dense; "
                                     f"use fp8, int4_wo or nvfp4")
        # whole bytes for code that reads weight_dtype_bytes (EP, weight sync); the memory
        # and step models read the mode itself
        changes.update(quantization=mode,
                       weight_dtype_bytes=2 if mode.dense.weight_bits > 8 else 1)
    kv_bytes = KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    if kv_bytes is not None:
        changes["kv_dtype_bytes"] = kv_bytes
    if all(getattr(model, k) == v for k, v in changes.items()):
        return model
    return dataclasses.replace(model, **changes)  # type: ignore[arg-type]
