"""Expert parallelism inside a serving replica: the MoE part of each step, balancer-aware.

vLLM's expert-parallel mode (``--enable-expert-parallel``): attention and dense layers stay
tensor-parallel over the replica's ``tp`` GPUs, and the routed experts are spread over the
same GPUs as an EP group, dispatched and combined with all-to-all. A step's time is the
performance model's dense part plus the EP model's MoE part.

The EP part must cost microseconds per step, so the balancer is not re-run every step:
``EpStepModel`` measures once, at build time, how much slower than the force-balanced ideal
the chosen balancer leaves the MoE layers on a synthetic routing scenario (a few dozen
steps of ``ExpertParallelStepModel``), and then charges
``ratio x ideal_moe_time(tokens)`` per step, from a precomputed grid. The ratio is
reported (``balance_ratio``) so users see what the balancer costs.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.moe.compute import EpHardware, MoeLayerSpec, default_compute
from fleetsim.moe.load_presets import LOAD_PRESETS
from fleetsim.moe.loads import SCENARIOS
from fleetsim.moe.step_model import ExpertParallelConfig, ExpertParallelStepModel

# "ou" alone is uncalibrated (uniform); its measured forms are the presets.
EP_SCENARIOS = (*(s for s in SCENARIOS if s != "ou"), *LOAD_PRESETS)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolEpConfig:
    """Expert parallelism of a pool's replicas (the EP group is the replica's TP GPUs)."""

    balancer: str = "eplb"
    """none | eplb | eplb_stale | quota | two_timescale | pkg.mod:Cls."""
    balancer_args: Mapping[str, object] = field(default_factory=dict)
    """Keyword arguments of the balancer."""
    num_spare_slots_per_gpu: int = 1
    """Redundant expert slots per GPU (EPLB's num_redundant_experts / EP size)."""
    scenario: str = "zipf"
    """Routing used to measure the balancer: a synthetic scenario (zipf | drift | rl |
    rl_switch | decode) or a measured preset (e.g. ultraep-qwen3-235b-prefill-stem)."""
    num_calibration_steps: int = 24
    """Steps of the balancer simulated to measure its slowdown (more: steadier figure)."""

    def __post_init__(self) -> None:
        if self.scenario not in EP_SCENARIOS:
            raise ValueError(f"ep.scenario must be one of {', '.join(EP_SCENARIOS)}, "
                             f"got {self.scenario!r}")
        if self.num_calibration_steps < 1:
            raise ValueError(f"ep.num_calibration_steps must be >= 1, got "
                             f"{self.num_calibration_steps}")
        if self.num_spare_slots_per_gpu < 0:
            raise ValueError(f"ep.num_spare_slots_per_gpu must be >= 0, got "
                             f"{self.num_spare_slots_per_gpu}")


class EpStepModel:
    """A ``StepTimeModel``: ``base`` with its tensor-parallel MoE replaced by expert parallelism.

    Keeps the bit-exact decode contract: the same scalar is added to both paths.
    """

    def __init__(self, base: object, model: ModelSpec, gpu: GPUSpec, tp: int,
                 cfg: PoolEpConfig, *, max_tokens: int = 16384, seed: int = 0) -> None:
        if not model.is_moe:
            raise FleetsimInputError("ep", model.name, "expert parallelism needs a MoE model; "
                                     "remove the ep table")
        q = model.quantization
        if q is not None and q.name not in ("fp8", "fp8_static", "fp8_block"):
            # its expert model (moe/compute.py) knows BF16 and FP8 weights only
            raise FleetsimInputError("quantization", q.name,
                                     "expert parallelism prices BF16 and FP8 experts only; use "
                                     "fp8 or fp8_block, or remove the ep table")
        if model.num_experts % tp:
            raise FleetsimInputError("ep", f"{model.num_experts} experts over {tp} GPUs",
                                     "the EP group (the replica's tp) must divide the experts")
        self.base = base
        self.ep = ExpertParallelConfig(
            num_gpus=tp, gpus_per_node=min(tp, gpu.num_gpus_per_node),
            num_spare_slots_per_gpu=cfg.num_spare_slots_per_gpu, balancer=cfg.balancer,
            balancer_args=dict(cfg.balancer_args))
        spec = MoeLayerSpec.from_model(model)
        hw = EpHardware.from_gpu(gpu, fp8=model.weight_dtype_bytes <= 1)
        compute = default_compute(spec, hw, tp)
        self.balance_ratio = _measure_ratio(self.ep, spec, hw, compute, cfg, seed)
        # Ideal (force-balanced) MoE time of all layers per token count, on a grid.
        grid = sorted({int(x) for x in np.geomspace(1, max_tokens, 64)} | {0})
        ideal = _ideal_all_layers_s(self.ep, spec, hw, compute, np.asarray(grid, np.float64))
        self._grid = [float(x) for x in grid]
        self._ep_s = [float(v) * self.balance_ratio for v in ideal]
        self._base_moe = base.op_time_lookup("moe")  # type: ignore[attr-defined]
        self.sources = dict(getattr(base, "sources", {}))
        self.sources["moe"] = (f"expert parallel over {tp} GPUs, balancer {cfg.balancer} "
                               f"({self.balance_ratio:.3f}x force-balanced on {cfg.scenario} "
                               f"routing); {compute.__class__.__name__}")

    def _moe_delta_s(self, num_tokens: int) -> float:
        g, v = self._grid, self._ep_s
        x = float(num_tokens)
        i = bisect.bisect_right(g, x) - 1
        if i >= len(g) - 1:
            ep_s = v[-1] * x / g[-1]
        else:
            ep_s = v[i] + (v[i + 1] - v[i]) * (x - g[i]) / (g[i + 1] - g[i])
        return ep_s - self._base_moe(num_tokens)

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        num_tokens = num_decode
        for new, _ in prefill_chunks:
            num_tokens += new
        base_s = self.base.step_time_s(prefill_chunks, num_decode, decode_kv_tokens)  # type: ignore[attr-defined]
        return base_s + self._moe_delta_s(num_tokens)

    def decode_step_times_s(self, num_decode: int,
                            decode_kv_tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        base_s = self.base.decode_step_times_s(num_decode, decode_kv_tokens)  # type: ignore[attr-defined]
        return base_s + self._moe_delta_s(num_decode)

    # The shape-changing interface of the table model (``TableStepModel.step_parts_s``,
    # ``cpu_s``, ``layer_pass_s``), so that speculative decoding (``perf/speculative.py``)
    # wraps expert parallelism: its verify pass routes all ``n (k + 1)`` positions through the
    # experts, so the EP change is taken at that token count.
    def step_parts_s(self, prefill_chunks: Sequence[tuple[int, int]], num_tokens: int,
                     num_seqs: int, num_decode: int, decode_kv_tokens: int) -> float:
        """Kernel seconds of a step of these counts: the base's, MoE by expert parallelism."""
        base_s = self.base.step_parts_s(  # type: ignore[attr-defined]
            prefill_chunks, num_tokens, num_seqs, num_decode, decode_kv_tokens)
        return base_s + self._moe_delta_s(num_tokens)

    def cpu_s(self, num_seqs: int, kernels_s: float) -> float:
        """The base's CPU cost (what async scheduling hides depends on the kernels given)."""
        return self.base.cpu_s(num_seqs, kernels_s)  # type: ignore[attr-defined,no-any-return]

    def layer_pass_s(self, num_tokens: int, num_decode: int, decode_kv_tokens: int,
                     num_layers: int) -> float:
        """One average layer of the base plus its share of the EP change (a draft head)."""
        base_s = self.base.layer_pass_s(  # type: ignore[attr-defined]
            num_tokens, num_decode, decode_kv_tokens, num_layers)
        return base_s + self._moe_delta_s(num_tokens) / num_layers

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        """``step_time_s((), n, kv) == (base + per_kv * kv) + extra``, bit for bit."""
        base, per_kv, extra = self.base.decode_terms_s(num_decode)  # type: ignore[attr-defined]
        assert extra == 0.0  # the table model's; the EP delta is the extra term
        return base, per_kv, self._moe_delta_s(num_decode)


def _ideal_all_layers_s(ep: ExpertParallelConfig, spec: MoeLayerSpec, hw: EpHardware,
                        compute: object, tokens: NDArray[np.float64]) -> NDArray[np.float64]:
    """Force-balanced seconds of all MoE layers for each total token count."""
    from fleetsim.moe.step_model import moe_layer_time_s

    return np.array([moe_layer_time_s(ep, int(t), spec=spec, hardware=hw, compute=compute)
                     * spec.num_moe_layers for t in tokens])


def _measure_ratio(ep: ExpertParallelConfig, spec: MoeLayerSpec, hw: EpHardware,
                   compute: object, cfg: PoolEpConfig, seed: int) -> float:
    """Balancer's MoE time over the force-balanced ideal, on the synthetic scenario."""
    tokens = 2048 if cfg.scenario != "decode" else 256
    model = ExpertParallelStepModel(ep, spec=spec, hardware=hw, compute=compute,
                                    scenario=cfg.scenario, num_layers=4, seed=seed)
    measured = sum(model.moe_time_s(tokens) for _ in range(cfg.num_calibration_steps))
    ideal = _ideal_all_layers_s(ep, spec, hw, compute, np.array([float(tokens)]))[0]
    ratio = measured / cfg.num_calibration_steps / ideal if ideal > 0 else 1.0
    return max(1.0, float(ratio))
