"""GPU specs and the built-in catalog (vendor datasheet numbers, dense, no sparsity).

Users extend the catalog with a TOML file of ``[[gpu]]`` tables carrying the same fields as
``GPUSpec``; loading is strict (unknown keys and missing fields name the file and field).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from fleetsim.configutil import from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_toml

_GB = 1e9  # datasheets quote decimal GB/s and TFLOP/s
# Memory is the total the driver reports (nvidia-smi / torch.cuda.mem_get_info), which is what
# vLLM's gpu_memory_utilization multiplies; HBM stacks are binary-sized, so an "80 GB" H100 has
# 81,559 MiB usable, not 80e9 bytes.
_MIB = 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One accelerator model. All rates are per GPU."""

    name: str
    """Canonical name, e.g. ``"H100-SXM"``."""
    peak_bf16_flops: float
    """Dense BF16 tensor-core peak, FLOP/s."""
    peak_fp8_flops: float | None = None
    """Dense FP8 tensor-core peak, FLOP/s; None (unset) on GPUs without FP8 tensor cores
    (A100), whose FP8 checkpoints run weight-only (``fp8_gemm_flops``)."""
    hbm_bytes: float
    """Device memory the driver reports, bytes (what vLLM's memory utilization applies to)."""
    hbm_bw_bytes_per_s: float
    """Peak device-memory bandwidth, bytes/s."""
    nvlink_bw_bytes_per_s: float
    """Intra-node GPU-to-GPU bandwidth, one direction, bytes/s (PCIe when there is no NVLink)."""
    network_bw_bytes_per_s: float
    """Inter-node bandwidth per GPU (its NIC share), one direction, bytes/s."""
    num_gpus_per_node: int
    """GPUs in one node (the largest tensor-parallel group)."""
    price_per_hour_usd: float
    """On-demand price per GPU-hour; an editable assumption, not a quote."""
    aic_system: str | None = None
    """aiconfigurator-core system dir with measured kernel tables, or None (roofline only)."""
    pcie_bw_bytes_per_s: float = 32e9
    """GPU-host link (PCIe), one direction, bytes/s: what swapping KV to host memory crosses
    (default PCIe Gen4 x16, 64 GB/s bidirectional)."""
    peak_int8_ops: float | None = None
    """Dense INT8 tensor-core peak, op/s (W8A8 ``sq``); None: not given, INT8 modes refused."""
    peak_fp4_flops: float | None = None
    """Dense FP4 (NVFP4/MXFP4) tensor-core peak, FLOP/s; None: no FP4 units (pre-Blackwell)."""
    pcie_latency_s: float = 1e-5
    """Setup latency of one GPU-host copy, seconds (no datasheet gives it: 10 us, the order
    of a cudaMemcpyAsync launch and DMA setup; an assumption)."""

    def __post_init__(self) -> None:
        if self.peak_fp8_flops is not None and not self.peak_fp8_flops > 0:
            raise ValueError(f"peak_fp8_flops must be > 0 (or left out on a GPU without FP8 "
                             f"tensor cores), got {self.peak_fp8_flops}")
        for field in (
            "peak_bf16_flops",
            "hbm_bytes",
            "hbm_bw_bytes_per_s",
            "nvlink_bw_bytes_per_s",
            "network_bw_bytes_per_s",
            "pcie_bw_bytes_per_s",
        ):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field} must be > 0, got {getattr(self, field)}")
        for field in ("peak_int8_ops", "peak_fp4_flops"):
            value = getattr(self, field)
            if value is not None and not value > 0:
                raise ValueError(f"{field} must be > 0 or unset, got {value}")
        if self.num_gpus_per_node < 1:
            raise ValueError(f"num_gpus_per_node must be >= 1, got {self.num_gpus_per_node}")
        if self.price_per_hour_usd < 0:
            raise ValueError(f"price_per_hour_usd must be >= 0, got {self.price_per_hour_usd}")
        if not 0 <= self.pcie_latency_s <= 1:
            raise ValueError(f"pcie_latency_s must be in [0, 1] s, got {self.pcie_latency_s}")

    @property
    def compute_formats(self) -> tuple[str, ...]:
        """Tensor-core formats this GPU computes in (``bf16``, ``fp8``, ``int8``, ``fp4``)."""
        out = ["bf16"]
        if self.peak_fp8_flops is not None and self.peak_fp8_flops > self.peak_bf16_flops:
            out.append("fp8")
        if self.peak_int8_ops is not None:
            out.append("int8")
        if self.peak_fp4_flops is not None:
            out.append("fp4")
        return tuple(out)

    def peak_flops(self, compute: str) -> float:
        """Dense tensor-core peak of a compute format (``bf16``, ``fp8``, ``int8``, ``fp4``),
        per second; whether the GPU has those units at all is ``compute_formats``."""
        peak = {"bf16": self.peak_bf16_flops, "fp8": self.fp8_gemm_flops,
                "int8": self.peak_int8_ops, "fp4": self.peak_fp4_flops}[compute]
        if peak is None:
            raise ValueError(f"{self.name} has no {compute} tensor cores")
        return peak

    @property
    def fp8_gemm_flops(self) -> float:
        """Peak FLOP/s of a GEMM with FP8 weights: the FP8 tensor-core peak, or without FP8
        units the BF16 one (vLLM runs FP8 checkpoints there as weight-only FP8, W8A16, with
        Marlin kernels that dequantize to 16-bit before the tensor cores)."""
        return self.peak_fp8_flops if self.peak_fp8_flops is not None else self.peak_bf16_flops


# Prices are approximate 2025 on-demand list prices per GPU-hour (Lambda / AWS public price
# pages); they drift often, so edit them (or override in a catalog TOML) for real cost studies.
_BUILTIN: tuple[GPUSpec, ...] = (
    # NVIDIA A100 datasheet (80GB SXM): 312 TF BF16 dense, 2,039 GB/s HBM2e, NVLink 600 GB/s
    # bidirectional; DGX A100 has one 200 Gb/s HDR NIC per GPU. The datasheet lists no FP8
    # (Ampere's tensor cores have none), so peak_fp8_flops is left out.
    # Price: Lambda on-demand 8x A100-80GB SXM, ~$1.79/GPU-h.
    GPUSpec(
        name="A100-80GB-SXM",
        pcie_bw_bytes_per_s=32e9,  # PCIe Gen4 x16: 64 GB/s bidirectional (A100 datasheet)
        peak_bf16_flops=312e12,
        hbm_bytes=81920 * _MIB,
        hbm_bw_bytes_per_s=2039 * _GB,
        nvlink_bw_bytes_per_s=300 * _GB,
        network_bw_bytes_per_s=25 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=1.79,
        aic_system="a100_sxm",
        peak_int8_ops=624e12,  # A100 datasheet: INT8 624 TOPS dense (1,248 sparse); no FP4
    ),
    # NVIDIA H100 datasheet (SXM5): 989 TF BF16 / 1,979 TF FP8 dense, 3.35 TB/s HBM3, NVLink
    # 900 GB/s bidirectional; DGX H100 has one 400 Gb/s NDR NIC per GPU.
    # Price: Lambda on-demand 8x H100 SXM, ~$2.99/GPU-h.
    GPUSpec(
        name="H100-SXM",
        pcie_bw_bytes_per_s=64e9,  # PCIe Gen5 x16: 128 GB/s bidirectional (H100 datasheet)
        peak_bf16_flops=989e12,
        peak_fp8_flops=1979e12,
        hbm_bytes=81559 * _MIB,
        hbm_bw_bytes_per_s=3350 * _GB,
        nvlink_bw_bytes_per_s=450 * _GB,
        network_bw_bytes_per_s=50 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=2.99,
        aic_system="h100_sxm",
        peak_int8_ops=1979e12,  # H100 datasheet: INT8 1,979 TOPS dense; Hopper has no FP4
    ),
    # NVIDIA H200 datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    # Price: typical neocloud on-demand ~$3.50/GPU-h (assumption).
    GPUSpec(
        name="H200",
        pcie_bw_bytes_per_s=64e9,  # PCIe Gen5 x16: 128 GB/s bidirectional (H200 datasheet)
        peak_bf16_flops=989e12,
        peak_fp8_flops=1979e12,
        hbm_bytes=143771 * _MIB,
        hbm_bw_bytes_per_s=4800 * _GB,
        nvlink_bw_bytes_per_s=450 * _GB,
        network_bw_bytes_per_s=50 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=3.50,
        aic_system="h200_sxm",
        peak_int8_ops=1979e12,  # H200 datasheet: INT8 3,958 TOPS sparse = 1,979 dense
    ),
    # NVIDIA H20 (China SKU) product brief: 148 TF BF16 / 296 TF FP8 dense, 96 GB HBM3 at
    # 4.0 TB/s, NVLink 900 GB/s. No aiconfigurator tables: roofline only.
    # Price: rough assumption ~$1.50/GPU-h (not widely listed outside China).
    GPUSpec(
        name="H20",
        pcie_bw_bytes_per_s=64e9,  # PCIe Gen5 x16: 128 GB/s bidirectional (H20 product brief)
        peak_bf16_flops=148e12,
        peak_fp8_flops=296e12,
        hbm_bytes=96 * 1024 * _MIB,  # 96 GiB nominal; driver total not verified
        hbm_bw_bytes_per_s=4000 * _GB,
        nvlink_bw_bytes_per_s=450 * _GB,
        network_bw_bytes_per_s=50 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=1.50,
        aic_system=None,
        peak_int8_ops=296e12,  # H20 product brief: INT8 296 TOPS dense
    ),
    # NVIDIA H800 SXM5 (China SKU of the H100) datasheet: the H100 SXM's compute (989 TF BF16 /
    # 1,979 TF FP8 dense) and memory (80 GB HBM3 at 3.35 TB/s), NVLink cut to 400 GB/s
    # bidirectional; HGX H800 nodes carry one 400 Gb/s NIC per GPU (as DGX H100). Same die and
    # clocks as the H100, so the H100's measured tables are used; their TP all-reduce was
    # measured over 900 GB/s NVLink, so TP communication is optimistic on an H800 (roughly 2x
    # too fast at large messages).
    # Price: StreamRL's relative machine cost, H800 = 2.85x H20 (arXiv:2504.15930), times our
    # H20 figure below; an assumption like every price here.
    GPUSpec(
        name="H800",
        pcie_bw_bytes_per_s=64e9,  # PCIe Gen5 x16 (as H100 SXM)
        peak_bf16_flops=989e12,
        peak_fp8_flops=1979e12,
        hbm_bytes=81559 * _MIB,  # the H100 SXM's 80 GB HBM3 stacks (driver total as H100)
        hbm_bw_bytes_per_s=3350 * _GB,
        nvlink_bw_bytes_per_s=200 * _GB,
        network_bw_bytes_per_s=50 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=round(2.85 * 1.50, 2),
        aic_system="h100_sxm",
        peak_int8_ops=1979e12,  # H800 SXM5 datasheet: INT8 3,958 TOPS sparse = 1,979 dense
    ),
    # NVIDIA L40S datasheet: 362 TF BF16 / 733 TF FP8 dense, 48 GB GDDR6 at 864 GB/s, no NVLink
    # (PCIe Gen4 x16, 32 GB/s per direction). Price: AWS g6e.xlarge ~$1.86/h for one L40S.
    GPUSpec(
        name="L40S",
        pcie_bw_bytes_per_s=32e9,  # PCIe Gen4 x16: 64 GB/s bidirectional (L40S datasheet)
        peak_bf16_flops=362e12,
        peak_fp8_flops=733e12,
        hbm_bytes=46068 * _MIB,  # 48 GB GDDR6 less ECC reservation
        hbm_bw_bytes_per_s=864 * _GB,
        nvlink_bw_bytes_per_s=32 * _GB,
        network_bw_bytes_per_s=12.5 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=1.86,
        aic_system="l40s",
        peak_int8_ops=733e12,  # L40S datasheet: INT8 733 TOPS dense; Ada has no FP4
    ),
    # NVIDIA L4 datasheet (Ada, 72 W, PCIe card): 242 TF BF16 / 485 TF FP8 / 485 TOPS INT8 with
    # sparsity, so 121 / 242.5 / 242.5 dense; 24 GB GDDR6 at 300 GB/s (nvidia-smi reports
    # 23,034 MiB); no NVLink: GPUs talk over PCIe Gen4 x16 (64 GB/s bidirectional). Nodes: GCP
    # g2-standard-96 (8 L4, 100 Gb/s of network for the machine, 12.5 GB/s / 8 per GPU;
    # cloud.google.com/compute/docs/gpus, G2 machine types). No aiconfigurator tables: roofline.
    # Price: GCP g2-standard-96 on demand, about $8 per machine-hour, ~$1.00/GPU-h (assumption).
    GPUSpec(
        name="L4",
        pcie_bw_bytes_per_s=32e9,
        peak_bf16_flops=121e12,
        peak_fp8_flops=242.5e12,
        hbm_bytes=23034 * _MIB,
        hbm_bw_bytes_per_s=300 * _GB,
        nvlink_bw_bytes_per_s=32 * _GB,  # PCIe Gen4 x16, one direction
        network_bw_bytes_per_s=12.5 * _GB / 8,
        num_gpus_per_node=8,
        price_per_hour_usd=1.00,
        aic_system=None,
        peak_int8_ops=242.5e12,
    ),
    # NVIDIA HGX B200 datasheet (8 GPUs: 36 PF BF16 / 72 PF FP8 sparse, 1.44 TB HBM3e at
    # 64 TB/s, NVLink 5 1.8 TB/s per GPU bidirectional) divided per GPU, dense = sparse / 2.
    # Price: Lambda on-demand 8x B200, ~$4.99/GPU-h.
    GPUSpec(
        name="B200",
        pcie_bw_bytes_per_s=64e9,  # PCIe Gen5 x16 per GPU (HGX B200 platform)
        peak_bf16_flops=2250e12,
        peak_fp8_flops=4500e12,
        hbm_bytes=183359 * _MIB,
        hbm_bw_bytes_per_s=8000 * _GB,
        nvlink_bw_bytes_per_s=900 * _GB,
        network_bw_bytes_per_s=50 * _GB,
        num_gpus_per_node=8,
        price_per_hour_usd=4.99,
        aic_system="b200_sxm",
        # HGX B200 datasheet: 144 PF FP4 and 72 POPS INT8 sparse for 8 GPUs -> per GPU dense
        peak_int8_ops=4500e12,
        peak_fp4_flops=9000e12,
    ),
    # NVIDIA GB200 NVL72 (rack-scale: 72 Blackwell GPUs in one NVLink domain). Per GPU, from
    # NVIDIA's Blackwell datasheet as aiconfigurator-core's systems/gb200.yaml records it
    # (NVIDIA, Apache-2.0): 2.5 PF BF16 / 5 PF FP8 dense, 8 TB/s HBM3e, 189,471 MiB reported
    # by nvidia-smi, NVLink 5 at 900 GB/s per direction to every GPU of the rack (the NVL72
    # datasheet's 130 TB/s over 72 GPUs = 1.8 TB/s bidirectional each), ConnectX-8 800 Gb/s
    # (100 GB/s) per GPU between racks, PCIe Gen5 to the host. The NVLink domain is the rack,
    # so num_gpus_per_node is 72. Price: an assumption (~2x a B200), not a quote.
    GPUSpec(
        name="GB200-NVL72",
        pcie_bw_bytes_per_s=64e9,
        peak_bf16_flops=2500e12,
        peak_fp8_flops=5000e12,
        hbm_bytes=189471 * _MIB,
        hbm_bw_bytes_per_s=8000 * _GB,
        nvlink_bw_bytes_per_s=900 * _GB,
        network_bw_bytes_per_s=100 * _GB,
        num_gpus_per_node=72,
        price_per_hour_usd=10.00,
        aic_system="gb200",
        # GB200 NVL72 datasheet: 1,440 PF FP4 and 720 POPS INT8 sparse for 72 GPUs -> per GPU
        # dense (the same halving that gives the 5 PF FP8 above)
        peak_int8_ops=5000e12,
        peak_fp4_flops=10000e12,
    ),
)

_ALIASES = {
    "a100": "A100-80GB-SXM",
    "a100-80gb": "A100-80GB-SXM",
    "a100-sxm": "A100-80GB-SXM",
    "a100_sxm": "A100-80GB-SXM",
    "a100-80gb-sxm4": "A100-80GB-SXM",
    "h100": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h100_sxm": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h200-sxm": "H200",
    "h200_sxm": "H200",
    "l40s-48gb": "L40S",
    "l4-24gb": "L4",
    "nvidia-l4": "L4",
    "b200-sxm": "B200",
    "b200_sxm": "B200",
    "gb200": "GB200-NVL72",
    "gb200-nvl72": "GB200-NVL72",
    "nvl72": "GB200-NVL72",
    "h20-96gb": "H20",
    "h800-sxm": "H800",
    "h800-sxm5": "H800",
}


def _key(name: str) -> str:
    return name.strip().lower().replace(" ", "-")


def load_gpu_catalog(path: str | Path) -> tuple[GPUSpec, ...]:
    """Read ``[[gpu]]`` tables from a TOML file; strict on unknown keys and missing fields."""
    path = Path(path)
    data = read_toml(path, "gpu catalog")
    extra = set(data) - {"gpu"}
    if extra:
        raise FleetsimInputError(
            f"{path}: {sorted(extra)[0]}",
            data[sorted(extra)[0]],
            "only [[gpu]] tables are allowed in a GPU catalog",
        )
    tables = data.get("gpu", [])
    if not isinstance(tables, list):
        raise FleetsimInputError(f"{path}: gpu", tables, "write each GPU as a [[gpu]] table")
    required = [f.name for f in dataclasses.fields(GPUSpec) if f.default is dataclasses.MISSING]
    specs = []
    for i, table in enumerate(tables):
        where = f"{path}: gpu[{i}]"
        for field in required:
            if isinstance(table, dict) and field not in table:
                raise FleetsimInputError(
                    f"{where}.{field}", None, f"missing field; required: {', '.join(required)}"
                )
        specs.append(from_dict(GPUSpec, table, where))
    return tuple(specs)


def list_gpus(catalog_path: str | Path | None = None) -> list[GPUSpec]:
    """Built-in GPUs plus those in ``catalog_path`` (a user entry replaces a same-named one)."""
    by_key = {_key(g.name): g for g in _BUILTIN}
    if catalog_path is not None:
        for g in load_gpu_catalog(catalog_path):
            by_key[_key(g.name)] = g
    return list(by_key.values())


def get_gpu(name: str, catalog_path: str | Path | None = None) -> GPUSpec:
    """Look a GPU up by name, case-insensitively, with common aliases ("h100", "a100")."""
    gpus = list_gpus(catalog_path)
    by_key = {_key(g.name): g for g in gpus}
    key = _key(name)
    if key in by_key:
        return by_key[key]
    alias = _ALIASES.get(key)
    if alias is not None and _key(alias) in by_key:
        return by_key[_key(alias)]
    known = ", ".join(g.name for g in gpus)
    raise FleetsimInputError(
        "gpu",
        name,
        f"unknown GPU; known: {known} (or add one in a TOML catalog with [[gpu]] tables)",
    )
