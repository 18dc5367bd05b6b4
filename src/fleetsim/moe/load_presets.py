"""Expert-load presets with a measured source, and the calibration that turns a measured
max/mean GPU load into the ``ou`` generator's dispersion (``LoadSpec.log_sd``).

A preset is one published measurement: the mean over layers and micro-batches of the max/mean
routed tokens per GPU, with experts placed in order (expert ``e`` on rank
``e // (num_experts / ep)``, Megatron-LM's and SGLang's placement without balancing), for one
model at one EP size. Calibration is by construction: the ``log_sd`` whose stationary law gives
that max/mean for a given shape (experts, top-k, tokens, EP size) is found by bisection on a
fixed set of draws, so the same inputs always give the same ``log_sd``. Nothing here is fitted
to a speed-up.

Source of every preset: UltraEP (arXiv:2606.04101), the authors' blog in the public repository
Dots-Infra/UltraEP (MIT), ``docs/blog_v1.md`` and its figures ``blog-eval_train_e2e``
("Avg Imbalance" bars, training on Megatron-LM at EP64, checkpoints from mid-to-late
pre-training) and ``blog-eval_serving_e2e`` ("Avg Imbalance" bars, SGLang prefill, EP64 for the
128-expert Qwen3, EP40 for the 160-expert GLM-4.7, STEM and Mixed request sets). Model shapes
from each model's config.json on Hugging Face.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.loads import LoadSpec, popularity

UltraEP_BLOG = "UltraEP (arXiv:2606.04101), Dots-Infra/UltraEP docs/blog_v1.md"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadPreset:
    """One published max/mean GPU load without balancing, and the shape it was measured on."""

    name: str
    """Registry key (``ultraep-<model>-<phase>``)."""
    model: str
    """The model measured, as its authors name it."""
    phase: str
    """``train`` (forward + backward micro-batches) or ``prefill``."""
    max_over_mean: float
    """Published mean per-(layer, micro-batch) max/mean routed tokens per GPU."""
    ep: int
    """EP size of the measurement (GPUs the experts are spread over)."""
    num_experts: int
    """Routed experts per layer of the model measured."""
    top_k: int
    """Experts per token of the model measured."""
    source: str
    """Where the figure is published."""

    def __post_init__(self) -> None:
        if self.phase not in ("train", "prefill"):
            raise FleetsimInputError("phase", self.phase, "use train or prefill")
        if not 1.0 <= self.max_over_mean <= self.ep:
            raise FleetsimInputError("max_over_mean", self.max_over_mean,
                                     f"must be in [1, ep={self.ep}]")
        if self.num_experts % self.ep:
            raise FleetsimInputError("ep", self.ep,
                                     f"must divide num_experts={self.num_experts}")


def _train(name: str, model: str, imb: float, experts: int) -> LoadPreset:
    return LoadPreset(name=name, model=model, phase="train", max_over_mean=imb, ep=64,
                      num_experts=experts, top_k=8,
                      source=f"{UltraEP_BLOG}, training figure (Megatron-LM, EP64)")


def _prefill(name: str, model: str, imb: float, experts: int, ep: int, requests: str
             ) -> LoadPreset:
    return LoadPreset(name=name, model=model, phase="prefill", max_over_mean=imb, ep=ep,
                      num_experts=experts, top_k=8,
                      source=f"{UltraEP_BLOG}, inference figure (SGLang prefill, EP{ep}, "
                             f"{requests} requests)")


# name -> preset. Shapes: zai-org/GLM-4.5-Air and GLM-4.7 config.json (128 / 160 routed
# experts, top-8), Qwen/Qwen3-235B-A22B (128, top-8), deepseek-ai/DeepSeek-V3 (256, top-8).
LOAD_PRESETS: dict[str, LoadPreset] = {p.name: p for p in (
    _train("ultraep-deepseek-v3-train", "DeepSeek-V3-671B-A37B", 1.30, 256),
    _train("ultraep-glm4.5-106b-train", "GLM4.5-106B-A12B", 2.23, 128),
    _train("ultraep-qwen3-235b-train", "Qwen3-235B-A22B", 2.86, 128),
    _prefill("ultraep-glm4.7-358b-prefill-mixed", "GLM4.7-358B-A32B", 2.06, 160, 40, "Mixed"),
    _prefill("ultraep-glm4.7-358b-prefill-stem", "GLM4.7-358B-A32B", 3.09, 160, 40, "STEM"),
    _prefill("ultraep-qwen3-235b-prefill-stem", "Qwen3-235B-A22B", 3.68, 128, 64, "STEM"),
    _prefill("ultraep-qwen3-235b-prefill-mixed", "Qwen3-235B-A22B", 4.01, 128, 64, "Mixed"),
)}


def get_preset(name: str) -> LoadPreset:
    preset = LOAD_PRESETS.get(name)
    if preset is None:
        raise FleetsimInputError("preset", name, f"use one of {', '.join(LOAD_PRESETS)}")
    return preset


# Calibration draws: independent layers of the stationary law. 2,048 draws put the Monte
# Carlo error of the mean max/mean near 0.5%, and a fixed seed makes log_sd a pure function
# of its inputs.
NUM_CALIBRATION_DRAWS = 2048
CALIBRATION_SEED = 20260602
MAX_LOG_SD = 8.0


def stationary_imbalance(log_sd: float, *, num_experts: int, top_k: int, ep: int,
                         num_tokens: int, num_draws: int = NUM_CALIBRATION_DRAWS,
                         seed: int = CALIBRATION_SEED) -> float:
    """Mean max/mean routed tokens per GPU (experts in order, ``num_experts // ep`` per GPU)
    under the ``ou`` generator's stationary law with dispersion ``log_sd`` and multinomial
    routing of ``num_tokens * top_k`` pairs.

    The multinomial count of a GPU is replaced by its normal approximation with fixed
    standard normals (common random numbers), so the result is smooth and monotone in
    ``log_sd``; at EP64 and 4K tokens per GPU the sampling part is under 1% anyway."""
    if num_experts % ep:
        raise FleetsimInputError("ep", ep, f"must divide num_experts={num_experts}")
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((num_draws, num_experts))
    eta = rng.standard_normal((num_draws, ep))
    p = popularity(log_sd * z, top_k).reshape(num_draws, ep, -1).sum(-1)
    pairs = float(num_tokens * top_k)
    counts = pairs * p + np.sqrt(pairs * p * (1 - p)) * eta
    counts = np.maximum(counts, 0.0)
    return float(np.mean(counts.max(-1) / counts.mean(-1)))


@lru_cache(maxsize=256)  # pure in its arguments; the repros ask for the same ones per setting
def calibrate_log_sd(target: float, *, num_experts: int, top_k: int, ep: int,
                     num_tokens: int) -> float:
    """The ``log_sd`` whose stationary max/mean GPU load equals ``target`` (bisection, to
    1e-5 in ``log_sd``)."""
    def imb(s: float) -> float:
        return stationary_imbalance(s, num_experts=num_experts, top_k=top_k, ep=ep,
                                    num_tokens=num_tokens)

    def out_of_range(bound: str) -> FleetsimInputError:
        return FleetsimInputError(
            "max_over_mean", target,
            f"must be {bound} for {num_experts} experts, top-{top_k}, EP{ep} and {num_tokens} "
            f"tokens (sampling noise alone gives {imb(0.0):.3f})")

    if target < imb(0.0):
        raise out_of_range("at least the uniform load's max/mean")
    # Bracket by doubling from a mild skew: the top of the range is slow to evaluate (the
    # 1 / top_k cap binds for many experts) and no measured load comes near it.
    lo, hi = 0.0, 0.5
    while imb(hi) < target:
        lo, hi = hi, 2 * hi
        if hi > MAX_LOG_SD:
            raise out_of_range(f"reachable with log_sd <= {MAX_LOG_SD}")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if imb(mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-5:
            break
    return 0.5 * (lo + hi)


def preset_spec(preset: LoadPreset | str, spec: LoadSpec, *, tokens_per_gpu: int,
                match_ep: int | None = None, autocorr: float | None = None) -> LoadSpec:
    """``spec`` with ``log_sd`` calibrated so that its shape (``spec.num_experts``,
    ``spec.top_k``) on ``match_ep`` GPUs (default: the preset's own EP size), with
    ``tokens_per_gpu`` tokens per GPU, gives the preset's measured max/mean.

    Default: "this model, routed as skewed as the preset's model was at its EP size"; a run at
    another EP size then gets the max/mean that follows from ``log_sd`` (e.g. lower at EP32).
    With ``match_ep`` = the run's EP size the measured max/mean is held as a skew level."""
    p = get_preset(preset) if isinstance(preset, str) else preset
    match_ep = p.ep if match_ep is None else match_ep
    if spec.num_experts % match_ep:
        # e.g. GLM-4.7's EP40 on a 128-expert model: match at the nearest EP that divides
        match_ep = max(d for d in range(1, spec.num_experts + 1)
                       if spec.num_experts % d == 0 and d <= p.ep)
    log_sd = calibrate_log_sd(p.max_over_mean, num_experts=spec.num_experts, top_k=spec.top_k,
                              ep=match_ep, num_tokens=tokens_per_gpu * match_ep)
    return replace(spec, log_sd=log_sd,
                   autocorr=spec.autocorr if autocorr is None else autocorr)
