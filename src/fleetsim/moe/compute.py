"""Grouped-GEMM time of one GPU's experts: measured tables (aiconfigurator-core) or roofline.

A model maps the routed tokens on each GPU to seconds. The slowest GPU gates the layer
(dispatch and combine are barriers), so placements are judged by this per-GPU time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError

if TYPE_CHECKING:
    from fleetsim.hardware import GPUSpec
    from fleetsim.models import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeLayerSpec:
    """Shape of one routed-expert MoE layer (defaults: DeepSeek-V3)."""

    hidden_size: int = 7168
    """Model width."""
    moe_inter_size: int = 2048
    """Intermediate width of one expert's FFN."""
    num_experts: int = 256
    """Routed (logical) experts per layer."""
    top_k: int = 8
    """Experts per token."""
    num_moe_layers: int = 58
    """MoE layers in the model."""
    weight_bytes_per_param: float = 1.0
    """Expert weight bytes per parameter (1 = fp8)."""
    dispatch_bytes_per_value: float = 1.0
    """Bytes per hidden value sent to the experts (DeepEP dispatches fp8)."""
    combine_bytes_per_value: float = 2.0
    """Bytes per hidden value sent back (bf16 combine)."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "moe_inter_size", "num_experts", "top_k", "num_moe_layers"):
            if getattr(self, name) <= 0:
                raise FleetsimInputError(name, getattr(self, name), "must be > 0")
        if self.top_k > self.num_experts:
            raise FleetsimInputError(
                "top_k", self.top_k, f"must be <= num_experts={self.num_experts}"
            )

    @classmethod
    def from_model(cls, model: ModelSpec) -> MoeLayerSpec:
        """The routed-expert layer of a ``fleetsim.models.ModelSpec``."""
        if not model.is_moe:
            raise FleetsimInputError("model", model.name, "is not a MoE model (num_experts = 0)")
        return cls(
            hidden_size=model.hidden_size,
            moe_inter_size=model.moe_intermediate_size,
            num_experts=model.num_experts,
            top_k=model.num_experts_per_token,
            num_moe_layers=model.num_moe_layers,
            weight_bytes_per_param=float(model.weight_dtype_bytes),
        )

    @property
    def expert_bytes(self) -> float:
        """Weights of one expert: gate, up and down projections."""
        return 3.0 * self.hidden_size * self.moe_inter_size * self.weight_bytes_per_param

    @property
    def flops_per_routed_token(self) -> float:
        """Three GEMMs of (hidden x inter), 2 flops per multiply-add."""
        return 6.0 * self.hidden_size * self.moe_inter_size


@dataclass(frozen=True, slots=True, kw_only=True)
class EpHardware:
    """The few GPU and network numbers the expert-parallel model needs (defaults: H200 SXM)."""

    peak_flops: float = 1979e12
    """Dense tensor flops/s at the expert GEMM dtype (H200 fp8)."""
    hbm_bytes_per_s: float = 4.8e12
    """HBM bandwidth."""
    intra_node_bytes_per_s: float = 450e9
    """NVLink bandwidth per GPU, one direction."""
    inter_node_bytes_per_s: float = 50e9
    """Network bandwidth per GPU (one 400 Gb/s NIC), one direction."""
    kernel_overhead_s: float = 20e-6
    """Fixed launch/synchronization time of the grouped GEMM."""
    aic_system: str | None = "h200_sxm"
    """aiconfigurator-core system with measured MoE tables, or None for the roofline only."""

    @classmethod
    def from_gpu(cls, gpu: GPUSpec, *, fp8: bool = True) -> EpHardware:
        """The numbers of a ``fleetsim.hardware.GPUSpec``; ``fp8`` picks the GEMM peak."""
        return cls(
            peak_flops=gpu.fp8_gemm_flops if fp8 else gpu.peak_bf16_flops,
            hbm_bytes_per_s=gpu.hbm_bw_bytes_per_s,
            intra_node_bytes_per_s=gpu.nvlink_bw_bytes_per_s,
            inter_node_bytes_per_s=gpu.network_bw_bytes_per_s,
            aic_system=gpu.aic_system,
        )

    def __post_init__(self) -> None:
        for name in (
            "peak_flops",
            "hbm_bytes_per_s",
            "intra_node_bytes_per_s",
            "inter_node_bytes_per_s",
        ):
            if not getattr(self, name) > 0:
                raise FleetsimInputError(name, getattr(self, name), "must be > 0")


class ExpertCompute(Protocol):
    """Seconds for each GPU's experts given its routed tokens."""

    def gpu_time_s(self, tokens_by_slot: NDArray[np.float64]) -> NDArray[np.float64]:
        """tokens_by_slot: (..., num_gpus, slots_per_gpu) -> (..., num_gpus) seconds."""
        ...


@dataclass(frozen=True, slots=True)
class RooflineExpertCompute:
    """max(flops / peak, bytes / HBM) + overhead, where bytes are the weights of every slot
    that computes at least one token (a grouped GEMM reads each active expert once)."""

    spec: MoeLayerSpec
    hardware: EpHardware

    def gpu_time_s(self, tokens_by_slot: NDArray[np.float64]) -> NDArray[np.float64]:
        tokens = tokens_by_slot.sum(-1)
        active = (tokens_by_slot > 0).sum(-1)
        flops_s = tokens * self.spec.flops_per_routed_token / self.hardware.peak_flops
        act_bytes = tokens * self.spec.hidden_size * 2.0 * 2.0  # bf16 in and out
        bytes_s = (active * self.spec.expert_bytes + act_bytes) / self.hardware.hbm_bytes_per_s
        return np.where(
            tokens > 0, np.maximum(flops_s, bytes_s) + self.hardware.kernel_overhead_s, 0.0
        )


@dataclass(frozen=True, slots=True)
class TableExpertCompute:
    """Interpolates a measured curve: seconds vs routed tokens on one GPU.

    routed_tokens, seconds: increasing sample points; beyond the last point the time grows
    linearly with the last segment's slope.
    """

    routed_tokens: NDArray[np.float64]
    seconds: NDArray[np.float64]
    source: str = ""

    def gpu_time_s(self, tokens_by_slot: NDArray[np.float64]) -> NDArray[np.float64]:
        tokens = tokens_by_slot.sum(-1)
        x, y = self.routed_tokens, self.seconds
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2]) if x.size > 1 else 0.0
        inside = np.interp(tokens, x, y)
        beyond = y[-1] + slope * (tokens - x[-1])
        return np.where(tokens > x[-1], beyond, np.where(tokens > 0, inside, 0.0))


def _moe_data_root() -> Path | None:
    try:
        import aiconfigurator_core
    except ImportError:
        return None
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


@functools.lru_cache(maxsize=16)
def load_moe_table(
    spec: MoeLayerSpec,
    num_gpus: int,
    *,
    system: str = "h200_sxm",
    framework: str = "sglang",
    moe_dtype: str = "fp8_block",
    min_routed_tokens: float = 0.0,
) -> TableExpertCompute | None:
    """aiconfigurator-core's measured MoE latency for this layer shape, or None if absent.

    The table's rows (``moe_perf.parquet``: num_tokens, topk, moe_ep_size, latency in ms) time
    one EP rank under balanced routing. What ``num_tokens`` counts differs between data sets,
    and the rows tell which: if doubling EP from 1 to 2 leaves the latency unchanged (DeepSeek-V3
    shapes on H200), the rank computes ``num_tokens * topk`` routed tokens; if it halves it
    (Qwen3-235B shapes on GB200 and H200: 4.62 -> 2.35 ms at 16,384 tokens on GB200),
    ``num_tokens`` is the whole EP group's batch and a rank computes its share,
    ``num_tokens * topk / moe_ep_size`` (read the other way, those ep=64 rows would run at
    24 PFLOP/s on a 2.5 PFLOP/s GPU). The cut is a ratio of 0.75, midway.

    We keep the curve latency(routed tokens per rank) of the EP size closest to ours among
    those whose curve reaches ``min_routed_tokens`` (the curve reaching furthest if none
    does): a rank with few experts but many tokens each has as many GEMM rows as one with
    many experts of fewer tokens. The newest framework version with rows wins.
    """
    root = _moe_data_root()
    if root is None:
        return None
    base = root / system / "moe" / framework
    if not base.is_dir():
        return None
    try:
        import pandas  # noqa: F401  (the table reader's; absent, no measured table)
    except ImportError:
        return None
    for version_dir in sorted(base.iterdir(), key=lambda p: _version_key(p.name), reverse=True):
        path = version_dir / "moe_perf.parquet"
        if not path.is_file():
            continue
        df = _read_table(path)
        rows = df[
            (df.hidden_size == spec.hidden_size)
            & (df.inter_size == spec.moe_inter_size)
            & (df.topk == spec.top_k)
            & (df.num_experts == spec.num_experts)
            & (df.moe_tp_size == 1)
            & (df.moe_dtype == moe_dtype)
            & (df.distribution == "balanced")
        ]
        if rows.empty:
            continue
        by_ep = {int(ep): rows[rows.moe_ep_size == ep].groupby("num_tokens").latency.min()
                 .sort_index() for ep in rows.moe_ep_size.unique()}
        per_group = _batch_is_per_group(by_ep)
        reading = "num_tokens for the EP group" if per_group else "num_tokens per rank"
        curves = {}  # ep -> (routed tokens per rank, seconds)
        for ep, curve in by_ep.items():
            routed = curve.index.to_numpy(dtype=np.float64) * spec.top_k
            curves[ep] = (routed / ep if per_group else routed,
                          curve.to_numpy(dtype=np.float64) * 1e-3)
        covering = [ep for ep, c in curves.items() if c[0][-1] >= min_routed_tokens]
        ep = (min(covering, key=lambda p: (abs(np.log(p / num_gpus)), -p)) if covering
              else max(curves, key=lambda p: curves[p][0][-1]))
        routed, seconds = curves[ep]
        source = (f"{path.relative_to(root)} (ep={ep}, {rows.kernel_source.iloc[0]}, "
                  f"{reading})")
        return TableExpertCompute(routed, seconds, source)
    return None


@functools.lru_cache(maxsize=4)
def _read_table(path: Path) -> Any:
    """The parquet file, read once per process: every pool size of a layer shape asks for
    the same table (0.1 s a read; three of them in an ExpertPlex entry). Callers only
    filter it."""
    import pandas as pd

    return pd.read_parquet(path)


def _batch_is_per_group(by_ep: dict[int, object]) -> bool:
    """True if the ep=2 rows take about half the ep=1 rows' time at the largest common
    ``num_tokens`` (the rank's share halves); False without both."""
    one, two = by_ep.get(1), by_ep.get(2)
    if one is None or two is None:
        return False
    common = one.index.intersection(two.index)  # type: ignore[attr-defined]
    if common.empty:
        return False
    last = common.max()
    return bool(two[last] / one[last] < 0.75)  # type: ignore[index]


def _version_key(name: str) -> tuple[int, ...]:
    pieces = name.replace("rc", ".").replace("post", ".").split(".")
    return tuple(int(piece) if piece.isdigit() else -1 for piece in pieces)


def default_compute(spec: MoeLayerSpec, hardware: EpHardware, num_gpus: int,
                    min_routed_tokens: float = 0.0) -> ExpertCompute:
    """The measured table when aiconfigurator-core has this GPU and shape, else the roofline;
    ``min_routed_tokens`` per GPU that the table should reach (``load_moe_table``)."""
    table = None
    if hardware.aic_system is not None:
        dtype = "fp8_block" if spec.weight_bytes_per_param <= 1 else "bfloat16"
        table = load_moe_table(spec, num_gpus, system=hardware.aic_system, moe_dtype=dtype,
                               min_routed_tokens=min_routed_tokens)
    return table if table is not None else RooflineExpertCompute(spec, hardware)
