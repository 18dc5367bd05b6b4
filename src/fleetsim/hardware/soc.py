"""A laptop SoC with two accelerators (NPU and integrated GPU) sharing one DDR bandwidth.

The built-in part is the Intel Core Ultra 7 258V ("Lunar Lake"), the class of Intel Core Ultra
SoC Agent.xpu ran on (arXiv:2506.24045; its abstract names only "an Intel Core Ultra SoC").
Peaks come from Intel's published figures; the efficiencies (the share of a peak an LLM engine
reaches) come from public measurements on that chip, derived in ``calibration.py`` and
checked there against measurements they were not derived from.
"""

from __future__ import annotations

from dataclasses import dataclass

_GB = 1e9
_T = 1e12


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceleratorSpec:
    """One accelerator of the SoC. Rates are peaks; efficiencies are achieved fractions."""

    name: str
    """``"npu"`` or ``"igpu"``."""
    peak_fp16_flops: float
    """Dense FP16 peak, FLOP/s (weight-only int4 models compute in FP16 after dequantising)."""
    compute_eff: float
    """Share of ``peak_fp16_flops`` an LLM GEMM reaches on this accelerator."""
    memory_eff: float
    """Share of the DDR peak this accelerator can draw on its own (its DMA/cache path)."""

    def __post_init__(self) -> None:
        if not self.peak_fp16_flops > 0:
            raise ValueError(f"{self.name}: peak_fp16_flops must be > 0, got "
                             f"{self.peak_fp16_flops}")
        for field in ("compute_eff", "memory_eff"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise ValueError(f"{self.name}: {field} must be in (0, 1], got {value}")

    def max_draw_bytes_per_s(self, ddr_bw_bytes_per_s: float) -> float:
        """The most DDR bandwidth this accelerator draws when nothing else runs."""
        return self.memory_eff * ddr_bw_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class SoCSpec:
    """Two accelerators and the DDR they share."""

    name: str
    npu: AcceleratorSpec
    igpu: AcceleratorSpec
    ddr_bw_bytes_per_s: float
    """Peak DDR bandwidth (bus width x transfer rate), bytes/s."""
    ddr_achievable_share: float
    """Share of the DDR peak the memory controller delivers to all agents together: the
    most any one agent was measured to draw (concurrent agents share it, they do not add)."""
    memory_bytes: float
    """System memory (weights, KV and everything else share it), bytes."""

    def __post_init__(self) -> None:
        if not self.ddr_bw_bytes_per_s > 0:
            raise ValueError(f"ddr_bw_bytes_per_s must be > 0, got {self.ddr_bw_bytes_per_s}")
        if not self.memory_bytes > 0:
            raise ValueError(f"memory_bytes must be > 0, got {self.memory_bytes}")
        if not 0 < self.ddr_achievable_share <= 1:
            raise ValueError(f"ddr_achievable_share must be in (0, 1], got "
                             f"{self.ddr_achievable_share}")

    @property
    def accelerators(self) -> tuple[AcceleratorSpec, AcceleratorSpec]:
        return (self.npu, self.igpu)

    def accelerator(self, name: str) -> AcceleratorSpec:
        for acc in self.accelerators:
            if acc.name == name:
                return acc
        raise KeyError(f"no accelerator {name!r} on {self.name}; have npu, igpu")

    @property
    def achievable_bw_bytes_per_s(self) -> float:
        return self.ddr_achievable_share * self.ddr_bw_bytes_per_s


# ---- Core Ultra 7 258V datasheet peaks -------------------------------------------------
# DDR: on-package LPDDR5X-8533 on a 128-bit bus: 8533e6 transfers/s x 16 bytes = 136.5 GB/s
# (Intel ARK, Core Ultra 7 258V, "Max Memory Bandwidth 136.5 GB/s").
LUNAR_LAKE_DDR_BW = 136.5 * _GB
# Memory: 32 GB of on-package LPDDR5X on the 258V (Intel ARK, Core Ultra 7 258V, "Max Memory
# Size 32 GB"; Lunar Lake has no DIMM slots).
LUNAR_LAKE_MEMORY = 32 * _GB
# NPU 4: 48 TOPS INT8 (Intel Lunar Lake architecture briefing, Tom's Hardware "Intel unwraps
# Lunar Lake architecture", June 2024: six neural compute engines). Its MAC array runs FP16 at
# half the INT8 rate, as NPU 3 and Xe XMX do: 24 TFLOP/s FP16.
LUNAR_LAKE_NPU_FP16 = 48 * _T / 2
# Arc 140V (8 Xe2 cores, 64 XMX engines): 64 TOPS INT8 on the 258V (Intel ARK, "GPU Peak TOPS
# (Int8)"); XMX does 2,048 FP16 ops/clock against 4,096 INT8, so 32 TFLOP/s FP16 (as computed
# by lhl, r/LocalLLaMA "Lunar Lake llama.cpp" testing post, Nov 2024).
LUNAR_LAKE_IGPU_FP16 = 64 * _T / 2


ACCELERATORS = ("npu", "igpu")
SOC_DEVICES = ("core-ultra-7-258v",)
"""SoCs ``cluster.soc.device`` may name (built in ``perf/soc_calibration.py``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SocConfig:
    """The cluster's pools on one laptop SoC (Agent.xpu, arXiv:2506.24045): each pool is one
    replica on the accelerator its ``gpu`` names (``npu`` or ``igpu``, one pool each), and
    every step streams its weights and KV over the one DDR bus the accelerators share
    (max-min shares of its bandwidth)."""

    device: str = "core-ultra-7-258v"
    """The SoC: core-ultra-7-258v (Lunar Lake; efficiencies from public measurements)."""
    bits_per_weight: float = 4.5
    """Weight precision streamed per step (4.5: llama.cpp's Q4_0, 18 bytes per 32 weights;
    weights are dequantised and computed in FP16)."""

    def __post_init__(self) -> None:
        if self.device not in SOC_DEVICES:
            raise ValueError(f"cluster.soc.device must be one of {', '.join(SOC_DEVICES)}, got "
                             f"{self.device!r}")
        if (isinstance(self.bits_per_weight, bool)
                or not isinstance(self.bits_per_weight, int | float)
                or not 1 <= self.bits_per_weight <= 16):
            raise ValueError(f"cluster.soc.bits_per_weight must be in [1, 16] (4.5: Q4_0), "
                             f"got {self.bits_per_weight!r}")
