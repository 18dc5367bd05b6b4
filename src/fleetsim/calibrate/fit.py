"""Fit a deployment's per-step CPU overhead and kernel speed to its own measurements.

Two kinds of evidence:

- ``vllm bench serve --save-result`` JSONs (fleetsim writes the same with ``--vllm-json``). Each
  names its workload (prompt count, mean input/output tokens, request rate, burstiness,
  max concurrency); fleetsim replays that workload with candidate parameters and compares mean
  TTFT and mean TPOT. Step times are linear in the three parameters (``t = fixed + per_seq * R
  + scale * kernels``), so Gauss-Newton on relative errors converges in a few simulations.
- A CSV of measured step times, one row per step (``num_decode, decode_kv_tokens,
  prefill_tokens, prefill_context_tokens, step_time_s``): ordinary least squares on
  ``[1, sequences, kernel time]``, exact.

Results held back from the fit are predicted with the fitted values, which is the error to
expect on new runs of the same deployment.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fleetsim.config import SimConfig, load_config
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.inputs import read_json, read_text
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.perf import build_step_model
from fleetsim.run import run
from fleetsim.vllm_json import vllm_result
from fleetsim.workloads.shorthand import workload_overrides

PARAMS = ("step_overhead_s", "step_overhead_per_seq_s", "kernel_time_scale")
DEFAULTS = {"step_overhead_s": 1.5e-3, "step_overhead_per_seq_s": 0.0, "kernel_time_scale": 1.0}
# Search box (the engine's own bounds, narrower where no deployment goes) and the unit each
# parameter is solved in, so the normal equations are well scaled.
BOUNDS = {"step_overhead_s": (0.0, 0.05), "step_overhead_per_seq_s": (0.0, 0.002),
          "kernel_time_scale": (0.2, 5.0)}
UNITS = {"step_overhead_s": 1e-3, "step_overhead_per_seq_s": 1e-5, "kernel_time_scale": 1.0}
METRICS = ("mean_ttft_ms", "mean_tpot_ms")
_NEEDED = ("completed", "total_input_tokens", "total_output_tokens", *METRICS)
MAX_ITERATIONS = 6


@dataclass(frozen=True, slots=True)
class BenchResult:
    """What one ``vllm bench serve`` result says about its workload and latencies."""

    path: str
    model_id: str | None
    num_prompts: int
    isl: int  # mean input tokens per request
    osl: int  # mean output tokens per request
    request_rate: float  # inf: all at once (or as fast as max_concurrency allows)
    burstiness: float
    max_concurrency: int | None
    measured_ms: dict[str, float]  # METRICS -> measured value


def load_bench_result(path: str) -> BenchResult:
    """Read one result JSON; a one-line input error names the file and the missing field."""
    data = read_json(path, "result")
    if not isinstance(data, Mapping):
        raise FleetsimInputError(path, type(data).__name__, "expected a `vllm bench serve "
                                 "--save-result` JSON object")
    for key in _NEEDED:
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value) or value < 0:
            raise FleetsimInputError(f"{path}: {key}", value, "a `vllm bench serve "
                                     "--save-result` JSON has it as a number >= 0")
    completed = int(data["completed"])
    if completed < 1:
        raise FleetsimInputError(f"{path}: completed", completed, "no request completed; "
                                 "nothing to fit")
    rate = data.get("request_rate")
    rate = math.inf if rate in (None, "inf", "Infinity") else rate
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        raise FleetsimInputError(f"{path}: request_rate", rate, "requests per second > 0, "
                                 "or \"inf\"")
    concurrency = data.get("max_concurrency")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(
            concurrency, int) or concurrency < 1):
        raise FleetsimInputError(f"{path}: max_concurrency", concurrency, "an integer >= 1 "
                                 "or null")
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, int | float) or not (
            burstiness > 0):
        raise FleetsimInputError(f"{path}: burstiness", burstiness, "a number > 0 (1: Poisson)")
    measured = {m: float(data[m]) for m in METRICS}
    if not all(v > 0 for v in measured.values()):
        raise FleetsimInputError(f"{path}: {METRICS}", measured, "both must be > 0 ms; "
                                 "benchmark with --random-output-len > 1")
    return BenchResult(
        path=path, model_id=data.get("model_id") if isinstance(data.get("model_id"), str)
        else None,
        num_prompts=int(data.get("num_prompts") or completed),
        isl=max(1, round(data["total_input_tokens"] / completed)),
        osl=max(2, round(data["total_output_tokens"] / completed)),
        request_rate=float(rate), burstiness=float(burstiness),
        max_concurrency=concurrency, measured_ms=measured)


def result_config(base: Callable[[list[str]], SimConfig], r: BenchResult,
                  params: Mapping[str, float]) -> SimConfig:
    """The config that replays ``r``'s workload on the base deployment with ``params``."""
    flags = argparse.Namespace(
        isl=r.isl, osl=r.osl, random_range_ratio=0.0, num_prompts=r.num_prompts,
        request_rate=str(r.request_rate), max_concurrency=r.max_concurrency,
        burstiness=None if r.burstiness == 1.0 else r.burstiness)
    sets = [*workload_overrides(flags), *(f"engine.{k}={v!r}" for k, v in params.items())]
    return base(sets)


@dataclass(slots=True)
class Simulator:
    """Predicts the metrics of bench results for given parameters (memoized)."""

    base: Callable[[list[str]], SimConfig]
    cache: dict[tuple, dict[str, float]] = field(default_factory=dict)
    num_runs: int = 0
    on_run: Callable[[int], None] | None = None

    def predict(self, r: BenchResult, params: Mapping[str, float]) -> dict[str, float]:
        key = (r.path, *(round(params[k] / UNITS[k], 12) for k in PARAMS))
        if key not in self.cache:
            out = vllm_result(run(result_config(self.base, r, params)), [50])
            self.cache[key] = {m: float(out[m]) for m in METRICS}
            self.num_runs += 1
            if self.on_run is not None:
                self.on_run(self.num_runs)
        return self.cache[key]

    def residuals(self, results: Sequence[BenchResult], params: Mapping[str, float]
                  ) -> np.ndarray:
        """Relative errors ``predicted / measured - 1``, metric by metric."""
        return np.array([self.predict(r, params)[m] / r.measured_ms[m] - 1.0
                         for r in results for m in METRICS])


def fit_bench_results(sim: Simulator, results: Sequence[BenchResult],
                      names: Sequence[str] = PARAMS) -> dict[str, float]:
    """Parameters ``names`` (others at their defaults) minimizing the squared relative errors
    of mean TTFT and TPOT over ``results``: bounded Gauss-Newton, forward differences."""
    if 2 * len(results) < len(names):
        raise FleetsimInputError("RESULTS", [r.path for r in results],
                                 f"{len(names)} parameters need at least "
                                 f"{math.ceil(len(names) / 2)} results to fit on")
    params = dict(DEFAULTS)
    for _ in range(MAX_ITERATIONS):
        r0 = sim.residuals(results, params)
        jac = np.empty((r0.size, len(names)))
        for j, name in enumerate(names):
            lo, hi = BOUNDS[name]
            h = 0.25 * UNITS[name] if params[name] + 0.25 * UNITS[name] <= hi else (
                -0.25 * UNITS[name])
            jac[:, j] = (sim.residuals(results, {**params, name: params[name] + h}) - r0) / (
                h / UNITS[name])
        step = np.linalg.lstsq(jac, -r0, rcond=None)[0]
        new = dict(params)
        for j, name in enumerate(names):
            lo, hi = BOUNDS[name]
            new[name] = float(min(max(params[name] + step[j] * UNITS[name], lo), hi))
        moved = max(abs(new[n] - params[n]) / UNITS[n] for n in names)
        if np.sum(sim.residuals(results, new) ** 2) > np.sum(r0 ** 2):
            break  # the linear step overshot (bounds or a schedule change): keep the best
        params = new
        if moved < 1e-6:
            break
    return params


# ---- step-time CSV ----------------------------------------------------------------------
STEP_COLUMNS = ("num_decode", "decode_kv_tokens", "prefill_tokens", "prefill_context_tokens",
                "step_time_s")


def load_step_csv(path: str) -> np.ndarray:
    """Rows of ``STEP_COLUMNS`` as floats; one-line errors name the file, row and column."""
    reader = csv.DictReader(io.StringIO(read_text(path, "step-time CSV")))
    missing = [c for c in STEP_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise FleetsimInputError(path, reader.fieldnames, f"needs columns "
                                 f"{', '.join(STEP_COLUMNS)} (missing {', '.join(missing)})")
    rows = []
    for i, row in enumerate(reader, start=2):
        try:
            values = [float(row[c]) for c in STEP_COLUMNS]
        except (TypeError, ValueError):
            raise FleetsimInputError(f"{path} line {i}", row, "every column must be a "
                                     "number") from None
        if not all(math.isfinite(v) and v >= 0 for v in values) or values[-1] <= 0:
            raise FleetsimInputError(f"{path} line {i}", row, "counts must be >= 0 and "
                                     "step_time_s > 0")
        rows.append(values)
    if len(rows) < 4:
        raise FleetsimInputError(path, f"{len(rows)} rows", "give at least 4 steps to fit")
    return np.array(rows)


def kernel_times_s(config: SimConfig, rows: np.ndarray) -> np.ndarray:
    """The built-in model's kernel (GPU) time of each step: no CPU overhead, scale 1."""
    pool = config.pools[0]
    model = quantize(get_model(config.model), config.quantization, config.engine.kv_cache_dtype)
    sm = build_step_model(model, get_gpu(pool.gpu, config.hardware.catalog),
                          pool.tp, config.perf_backend, step_overhead_s=0.0)
    out = []
    for n, kv, new, ctx, _ in rows.tolist():
        chunks = [(int(new), int(ctx))] if new > 0 else []
        out.append(sm.step_time_s(chunks, int(n), int(kv)))
    return np.array(out)


def fit_step_rows(kernels_s: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """Least squares of ``step_time_s = fixed + per_seq * sequences + scale * kernels``."""
    seqs = rows[:, 0] + (rows[:, 2] > 0)
    a = np.c_[np.ones(len(rows)), seqs, kernels_s]
    fixed, per_seq, scale = np.linalg.lstsq(a, rows[:, 4], rcond=None)[0]
    return {"step_overhead_s": float(fixed), "step_overhead_per_seq_s": float(per_seq),
            "kernel_time_scale": float(scale)}


def predict_step_rows(kernels_s: np.ndarray, rows: np.ndarray,
                      params: Mapping[str, float]) -> np.ndarray:
    seqs = rows[:, 0] + (rows[:, 2] > 0)
    return (params["step_overhead_s"] + params["step_overhead_per_seq_s"] * seqs
            + params["kernel_time_scale"] * kernels_s)


def base_config(config_path: str | None, overrides: Sequence[str]
                ) -> Callable[[list[str]], SimConfig]:
    """``sets -> SimConfig``: the deployment's config file and ``--set`` items, then ``sets``."""
    def build(sets: list[str]) -> SimConfig:
        return load_config(config_path, [*overrides, *sets])

    if build([]).engine.async_scheduling:  # also fails early, once, on a bad base config
        # The fit is linear in the overheads because a synchronous step adds them to the
        # kernels; under async scheduling they hide behind the GPU and barely move a result.
        raise FleetsimInputError(
            "engine.async_scheduling", True, "calibrate fits the CPU cost the GPU waits for, "
            "which async scheduling hides; calibrate on results of vllm serve "
            "--no-async-scheduling, then add engine.async_scheduling = true to the snippet")
    return build


def snippet_toml(config: SimConfig, params: Mapping[str, float], notes: Sequence[str]) -> str:
    """A config file with the deployment (model, hardware) and the fitted engine keys."""
    pool = config.pools[0]
    lines = [f"# {n}" for n in notes]
    lines += [f"model = {config.model!r}".replace("'", '"'), "", "[hardware]",
              f"gpu = \"{pool.gpu}\"", f"tp = {pool.tp}", "", "[engine]"]
    lines += [f"{k} = {float(f'{params[k]:.6g}')!r}" for k in PARAMS]
    return "\n".join(lines) + "\n"


def model_override(results: Sequence[BenchResult]) -> list[str]:
    """``model=...`` when every result names the same model fleetsim knows."""
    ids = {r.model_id for r in results}
    if len(ids) != 1 or None in ids:
        return []
    (model_id,) = ids
    try:
        get_model(model_id)  # type: ignore[arg-type]
    except FleetsimInputError:
        return []
    return [f"model={model_id!r}"]


def is_csv(path: str) -> bool:
    return Path(path).suffix.lower() == ".csv"
