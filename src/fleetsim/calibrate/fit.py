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
from fleetsim.inputs import MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS, check_number, read_json, read_text
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
    check_number(data["completed"], f"{path}: completed", lo=0, hi=MAX_REQUESTS, integer=True)
    completed = int(data["completed"])
    if completed < 1:
        raise FleetsimInputError(f"{path}: completed", completed, "no request completed; "
                                 "nothing to fit")
    rate = data.get("request_rate")
    rate = math.inf if rate in (None, "inf", "Infinity") else rate
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        raise FleetsimInputError(f"{path}: request_rate", rate, "requests per second > 0, "
                                 "or \"inf\"")
    if rate != math.inf:  # the bounds of `fleetsim run --request-rate`, named as the field
        check_number(rate, f"{path}: request_rate", lo=1e-6, hi=1e7)
    concurrency = data.get("max_concurrency")
    if concurrency is not None and (isinstance(concurrency, bool) or not isinstance(
            concurrency, int) or concurrency < 1):
        raise FleetsimInputError(f"{path}: max_concurrency", concurrency, "an integer >= 1 "
                                 "or null")
    if concurrency is not None:
        check_number(concurrency, f"{path}: max_concurrency", lo=1, hi=10_000_000)
    burstiness = data.get("burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, int | float) or not (
            burstiness > 0):
        raise FleetsimInputError(f"{path}: burstiness", burstiness, "a number > 0 (1: Poisson)")
    check_number(burstiness, f"{path}: burstiness", lo=1e-4, hi=1e6)
    if burstiness != 1 and rate == math.inf:
        raise FleetsimInputError(f"{path}: burstiness", burstiness, "shapes arrivals at a "
                                 "finite request_rate; this result sent them all at once")
    measured = {m: float(data[m]) for m in METRICS}
    for m, v in measured.items():
        if not v > 0:
            raise FleetsimInputError(f"{path}: {m}", v, "must be > 0 ms; benchmark with "
                                     "--random-output-len > 1")
        check_number(v, f"{path}: {m}", lo=0, hi=MAX_TIME_S * 1e3)
    num_prompts = data.get("num_prompts") or completed
    check_number(num_prompts, f"{path}: num_prompts", lo=1, hi=MAX_REQUESTS, integer=True)
    isl = max(1, round(data["total_input_tokens"] / completed))
    osl = max(2, round(data["total_output_tokens"] / completed))
    for name, value in (("total_input_tokens", isl), ("total_output_tokens", osl)):
        if value > MAX_TOKENS:
            raise FleetsimInputError(f"{path}: {name}", data[name], f"{value:,} tokens per "
                                     f"completed request, more than {MAX_TOKENS:,}; check the "
                                     f"file")
    model_id = data.get("model_id")
    if model_id is not None and not isinstance(model_id, str):
        raise FleetsimInputError(f"{path}: model_id", model_id, "a model name or null")
    return BenchResult(
        path=path, model_id=model_id, num_prompts=int(num_prompts), isl=isl, osl=osl,
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
# Column -> largest value: the config's bounds (max_running, a prompt, a time); a step's
# decode KV is at most num_decode full contexts.
STEP_LIMITS = {"num_decode": 10_000_000, "prefill_tokens": MAX_TOKENS,
               "prefill_context_tokens": MAX_TOKENS, "step_time_s": MAX_TIME_S}


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
        for c, v in zip(STEP_COLUMNS, values, strict=True):
            hi = STEP_LIMITS[c] if c != "decode_kv_tokens" else values[0] * MAX_TOKENS
            check_number(v, f"{path} line {i}, column {c!r}", lo=0, hi=hi,
                         integer=c != "step_time_s")
        rows.append(values)
    if len(rows) < 4:
        raise FleetsimInputError(path, f"{len(rows)} rows", "give at least 4 steps to fit")
    return np.array(rows)


def kernel_times_s(config: SimConfig, rows: np.ndarray) -> np.ndarray:
    """The built-in model's kernel (GPU) time of each step: no CPU overhead, scale 1."""
    pool = config.pools[0]
    if pool.pp > 1:  # the CSV's steps are one forward pass, not a pipeline's period
        raise FleetsimInputError("hardware.pp", pool.pp, "step-time CSVs calibrate one "
                                 "forward pass (pp = 1); fit on steps of the stage's GPUs at "
                                 "pp = 1, or fit a pp run from its vllm bench serve JSON")
    model = quantize(get_model(config.model), config.quantization, config.engine.kv_cache_dtype)
    context = model.max_context_tokens
    for i, (n, kv, new, ctx, _) in enumerate(rows.tolist()):
        # Steps the model cannot run would be priced by extrapolation: refuse them.
        if new + ctx > context or kv > n * context:
            raise FleetsimInputError(
                f"step-time CSV line {i + 2}", f"prefill {int(new)} + {int(ctx)} tokens, "
                f"{int(kv)} KV tokens over {int(n)} decodes", f"longer than {model.name}'s "
                f"{context:,}-token context; check the CSV or the model (--set model=...)")
    sm = build_step_model(model, get_gpu(pool.gpu, config.hardware.catalog),
                          pool.tp, config.perf_backend, step_overhead_s=0.0)
    out = []
    for n, kv, new, ctx, _ in rows.tolist():
        chunks = [(int(new), int(ctx))] if new > 0 else []
        out.append(sm.step_time_s(chunks, int(n), int(kv)))
    return np.array(out)


def fit_step_rows(kernels_s: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """Least squares of ``step_time_s = fixed + per_seq * sequences + scale * kernels`` with
    each parameter inside ``BOUNDS`` (which ``fleetsim run`` accepts): a negative overhead
    fits noisy data but is not a config. Exact: every choice of parameters held at a bound
    (free, low or high: 27) is solved and the best one within the box kept."""
    import itertools

    seqs = rows[:, 0] + (rows[:, 2] > 0)
    a = np.c_[np.ones(len(rows)), seqs, kernels_s] * [UNITS[k] for k in PARAMS]
    y = rows[:, 4]
    lo = np.array([BOUNDS[k][0] / UNITS[k] for k in PARAMS])
    hi = np.array([BOUNDS[k][1] / UNITS[k] for k in PARAMS])
    best: tuple[float, np.ndarray] | None = None
    for states in itertools.product((None, "lo", "hi"), repeat=len(PARAMS)):
        x = np.where([s == "lo" for s in states], lo, hi)
        free = [s is None for s in states]
        if any(free):
            x[free] = np.linalg.lstsq(a[:, free], y - a[:, ~np.array(free)] @ x[~np.array(
                free)], rcond=None)[0]
        if np.all(x >= lo - 1e-12) and np.all(x <= hi + 1e-12):
            sse = float(np.sum((a @ x - y) ** 2))
            if best is None or sse < best[0] - 1e-15 * max(1.0, sse):
                best = (sse, np.clip(x, lo, hi))
    assert best is not None  # all parameters at bounds is always in the box
    return {k: float(v * UNITS[k]) for k, v in zip(PARAMS, best[1], strict=True)}


def unbounded_step_fit(kernels_s: np.ndarray, rows: np.ndarray) -> dict[str, float]:
    """Ordinary least squares without bounds (what the data alone says; for the notes)."""
    seqs = rows[:, 0] + (rows[:, 2] > 0)
    a = np.c_[np.ones(len(rows)), seqs, kernels_s]
    return dict(zip(PARAMS, map(float, np.linalg.lstsq(a, rows[:, 4], rcond=None)[0]),
                    strict=True))


def clamp_notes(params: Mapping[str, float], unbounded: Mapping[str, float]) -> list[str]:
    """One note per parameter held at a bound, with the value the data alone gave."""
    notes = []
    for k in PARAMS:
        lo, hi = BOUNDS[k]
        if params[k] in (lo, hi) and not math.isclose(unbounded[k], params[k], rel_tol=1e-6,
                                                      abs_tol=1e-12):
            notes.append(f"{k} held at {params[k]:.6g} (the calibration bound "
                         f"[{lo:g}, {hi:g}] that `fleetsim run` accepts); unbounded least "
                         f"squares gave {unbounded[k]:.6g}, which no deployment has: check "
                         f"the CSV's steps")
    return notes


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


def model_override(results: Sequence[BenchResult], model_given: bool = False) -> list[str]:
    """``model=...`` from the results' ``model_id``; none when ``model_given`` (the config or
    ``--set`` names the model) or no result names one. Results naming different models, or
    a model fleetsim does not know, are errors: fitting them to the default model would
    calibrate the wrong deployment without a word."""
    named = [r for r in results if r.model_id is not None]
    ids = sorted({r.model_id for r in named})  # type: ignore[type-var]
    if len(ids) > 1:
        raise FleetsimInputError("RESULTS: model_id", ids, "the results come from different "
                                 "models; calibrate one deployment at a time")
    if not ids or model_given:
        return []
    try:
        get_model(ids[0])
    except FleetsimInputError:
        raise FleetsimInputError(
            f"{named[0].path}: model_id", ids[0], "fleetsim does not know this model; name "
            "it with --set model=<a `fleetsim models` name or a config.json path>") from None
    return [f"model={ids[0]!r}"]


def model_given(config_path: str | None, overrides: Sequence[str]) -> bool:
    """Whether the config file or a ``--set`` names the model."""
    from fleetsim.inputs import read_toml

    if any(o.partition("=")[0].strip() == "model" for o in overrides):
        return True
    return config_path is not None and "model" in read_toml(config_path, "config")


def is_csv(path: str) -> bool:
    return Path(path).suffix.lower() == ".csv"
