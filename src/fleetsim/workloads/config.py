"""The ``[workload]`` table of a run config, and ``build_workload`` that turns it into requests.

A workload is either a trace (a file or an embedded trace) or synthetic (an arrival process
plus prompt and output length distributions). Rate scaling, time slicing and truncation then
apply to either, in that order. Every time field is simulated seconds, after ``rate_scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import MAX_REQUESTS, MAX_TIME_S
from fleetsim.workloads.distributions import (
    Empirical,
    Fixed,
    LengthDistribution,
    LogNormal,
    PairedEmpirical,
    Uniform,
)
from fleetsim.workloads.loaders import FORMATS, load_trace, read_column
from fleetsim.workloads.rate_profile import RateProfile, swing
from fleetsim.workloads.synthetic import (
    ArrivalProcess,
    AtOnce,
    Constant,
    Gamma,
    Poisson,
    synthesize,
)
from fleetsim.workloads.transforms import head, scale_rate, time_slice
from fleetsim.workloads.workload import Workload

LENGTH_KINDS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "lognormal": ("mean", "cv"),
    "empirical": ("path", "column"),
}
"""Length distribution kind -> the LengthConfig fields it needs (all others must stay unset)."""
ARRIVALS = ("poisson", "gamma", "constant", "at_once")
OVER_LONG = ("error", "clip", "drop")
SYNTHETIC_TRACE = "synthetic"
"""``trace`` value that selects a synthetic workload from TOML (which has no null)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthConfig:
    """A token-length distribution; ``kind`` picks which of the other fields are used."""

    kind: str
    """fixed | uniform | lognormal | empirical."""
    value: int | None = None
    """fixed: tokens of every request."""
    low: int | None = None
    """uniform: smallest length in tokens (inclusive)."""
    high: int | None = None
    """uniform: largest length in tokens (inclusive)."""
    mean: float | None = None
    """lognormal: mean length in tokens."""
    cv: float | None = None
    """lognormal: coefficient of variation (std / mean), > 0."""
    path: str | None = None
    """empirical: CSV/JSONL file (or embedded:azure_conv_2023) whose column is resampled."""
    column: str | None = None
    """empirical: CSV header name or JSONL key holding token counts, e.g. num_decode_tokens."""
    max_tokens: int | None = None
    """empirical (optional): resample only the values up to this many tokens (as vLLM's
    ShareGPT benchmark drops prompts over 1,024 tokens)."""

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            if self.kind != "empirical":
                raise ValueError(f"max_tokens is used by kind = 'empirical' only; remove it "
                                 f"from kind = {self.kind!r}")
            if self.max_tokens < 1:
                raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.kind not in LENGTH_KINDS:
            raise ValueError(
                f"length kind must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}"
            )
        needed = LENGTH_KINDS[self.kind]
        for name in ("value", "low", "high", "mean", "cv", "path", "column"):
            given = getattr(self, name) is not None
            if name in needed and not given:
                raise ValueError(
                    f"kind = {self.kind!r} needs {' and '.join(needed)}; {name} is missing"
                )
            if name not in needed and given:
                raise ValueError(
                    f"{name} is not used by kind = {self.kind!r} (it takes {', '.join(needed)}); "
                    f"remove {name}"
                )
        # Build the distribution once to run its own range checks (no I/O for empirical).
        if self.kind != "empirical":
            self.distribution()

    def distribution(self) -> LengthDistribution:
        """The distribution object; ``empirical`` reads its file here."""
        if self.kind == "fixed":
            return Fixed(value=self.value)  # type: ignore[arg-type]
        if self.kind == "uniform":
            return Uniform(low=self.low, high=self.high)  # type: ignore[arg-type]
        if self.kind == "lognormal":
            return LogNormal(mean_tokens=self.mean, cv=self.cv)  # type: ignore[arg-type]
        dist = Empirical.from_file(self.path, self.column)  # type: ignore[arg-type]
        if self.max_tokens is None:
            return dist
        kept = dist.values[dist.values <= self.max_tokens]
        if not len(kept):
            raise ValueError(f"no value of {dist.source} is <= max_tokens = {self.max_tokens}")
        return Empirical(values=kept, source=f"{dist.source}<={self.max_tokens}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PairedLengthsConfig:
    """(prompt, output) lengths resampled together, row by row, from one file: what
    ``vllm bench serve --dataset-name sharegpt`` does, keeping each conversation's prompt with
    its own output. Rows failing a limit are dropped before resampling, never clipped."""

    path: str
    """CSV/JSONL file or embedded:<name> (e.g. embedded:sharegpt_lengths)."""
    prompt_column: str = "num_prefill_tokens"
    """CSV header name or JSONL key of the prompt token counts."""
    output_column: str = "num_decode_tokens"
    """CSV header name or JSONL key of the output token counts."""
    max_prompt_tokens: int | None = None
    """Drop rows whose prompt is longer (vLLM's ShareGPT benchmark: 1024)."""
    max_total_tokens: int | None = None
    """Drop rows whose prompt + output is longer (vLLM's ShareGPT benchmark: 2048)."""
    count_column: str | None = None
    """Column of how many requests each row stands for (a histogram's counts, e.g.
    ``num_requests`` of embedded:sharegpt_first_turn_opt): rows are drawn in proportion;
    unset, every row once."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("lengths.path must name a file or embedded:<name>, got \"\"")
        if self.count_column == "":
            raise ValueError("lengths.count_column must name a column (or be left out), "
                             "got \"\"")
        for name in ("max_prompt_tokens", "max_total_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or unset for no limit), got {value}")

    def distribution(self) -> PairedEmpirical:
        """The rows that pass the limits; reads the file here."""
        prompts = read_column(self.path, self.prompt_column)
        outputs = read_column(self.path, self.output_column)
        if self.count_column is not None:
            # (read as token counts are: whole numbers >= 1, an error naming the row if not)
            counts = read_column(self.path, self.count_column)
            # a row per request it stands for: uniform draws over them weigh rows by count
            prompts, outputs = np.repeat(prompts, counts), np.repeat(outputs, counts)
        keep = np.ones(len(prompts), dtype=bool)
        if self.max_prompt_tokens is not None:
            keep &= prompts <= self.max_prompt_tokens
        if self.max_total_tokens is not None:
            keep &= prompts + outputs <= self.max_total_tokens
        if not keep.any():
            raise FleetsimInputError(
                "workload.lengths", self.path,
                f"no row passes max_prompt_tokens = {self.max_prompt_tokens} and "
                f"max_total_tokens = {self.max_total_tokens}; raise or remove them")
        return PairedEmpirical(prompts=prompts[keep], outputs=outputs[keep],
                               source=f"{self.path}:{self.prompt_column},{self.output_column}")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    """Where requests come from (trace or synthetic) and how they are scaled and cut."""

    trace: str | None = "embedded:azure_conv_2023"
    """Trace file path or embedded:<name>; None (TOML: "synthetic") generates requests instead."""
    format: str = "auto"
    """Trace format: auto | azure | mooncake | generic."""
    hash_block_tokens: int = 512
    """Tokens per hash_ids entry in a generic trace (Mooncake traces are always 512; a trace
    whose rows carry their own, as live recordings do, uses that)."""
    rate_scale: float = 1.0
    """Multiply the arrival rate by this (divides every arrival time by it)."""
    start_s: float = 0.0
    """Drop requests arriving before this time (simulated s, after rate_scale); it becomes 0."""
    duration_s: float | None = None
    """Keep only requests arriving within this many simulated seconds after start_s."""
    max_requests: int | None = None
    """Keep at most this many requests (the earliest), after slicing."""
    arrival: str = "poisson"
    """Synthetic arrival process: poisson | gamma | constant | at_once (every request at 0 s,
    vLLM's --request-rate inf; needs num_requests, no rate_per_s)."""
    rate_per_s: float | None = None
    """Synthetic: mean arrival rate in requests per second (required unless at_once)."""
    cv: float = 1.0
    """Synthetic gamma arrivals: coefficient of variation of inter-arrival times (>1 bursty)."""
    num_requests: int | None = None
    """Synthetic: requests to generate; if unset, generate until start_s + duration_s."""
    prompt_tokens: LengthConfig | None = None
    """Synthetic: prompt length distribution (required)."""
    output_tokens: LengthConfig | None = None
    """Synthetic: output length distribution (required)."""
    lengths: PairedLengthsConfig | None = None
    """Synthetic, instead of prompt_tokens and output_tokens: (prompt, output) rows of one
    file resampled together, e.g. {path = "embedded:sharegpt_lengths", max_prompt_tokens =
    1024, max_total_tokens = 2048} as vLLM's ShareGPT benchmark."""
    rate_profile: tuple[tuple[float, float], ...] | None = None
    """Traffic that swings: [[time_s, multiplier], ...] points of a piecewise-linear multiplier
    of the arrival rate over simulated time (after rate_scale), its first and last values held
    before and after them, e.g. [[0, 0.5], [600, 2.0], [1200, 0.5]]. Trace or synthetic; the
    arrivals are time-rescaled, so a trace keeps its burstiness and order (docs/workloads.md)."""
    max_concurrency: int | None = None
    """Closed loop: at most this many requests in flight; a request is sent at its arrival
    time or, when all slots are busy, as soon as one frees (vLLM bench's --max-concurrency).
    None: open loop, every request at its arrival time."""
    over_long: str = "error"
    """Requests longer than the model's context (prompt + output): error | clip (cut the
    prompt, then the output, to fit, as Vidur does) | drop. The count is in the summary."""

    @property
    def is_synthetic(self) -> bool:
        return self.trace is None or self.trace == SYNTHETIC_TRACE

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.hash_block_tokens < 1:
            raise ValueError(f"hash_block_tokens must be >= 1, got {self.hash_block_tokens}")
        if not (math.isfinite(self.rate_scale) and self.rate_scale > 0):
            raise ValueError(
                f"rate_scale must be > 0 (2.0 = twice the rate), got {self.rate_scale}"
            )
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ValueError(f"start_s must be >= 0 seconds, got {self.start_s}")
        if self.duration_s is not None and not (
            math.isfinite(self.duration_s) and self.duration_s > 0
        ):
            raise ValueError(
                f"duration_s must be > 0 seconds (or unset for all), got {self.duration_s}"
            )
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(
                f"max_requests must be >= 1 (or unset for all), got {self.max_requests}"
            )
        if self.over_long not in OVER_LONG:
            raise ValueError(f"over_long must be one of {', '.join(OVER_LONG)}, got "
                             f"{self.over_long!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 (or unset for an open loop), got "
                             f"{self.max_concurrency}")
        if self.rate_profile is not None:
            self.profile()  # its own checks, with the reason in the message
        if self.is_synthetic:
            self._check_synthetic()
        else:
            self._check_trace()

    def _check_trace(self) -> None:
        if not self.trace:
            raise ValueError('trace must be a file path, embedded:<name> or "synthetic", got ""')
        unused = [
            name
            for name in ("rate_per_s", "num_requests", "prompt_tokens", "output_tokens",
                         "lengths")
            if getattr(self, name) is not None
        ]
        unused += [
            name
            for name, default in (("arrival", "poisson"), ("cv", 1.0))
            if getattr(self, name) != default
        ]
        if unused:
            raise ValueError(
                f"{', '.join(unused)} {'is' if len(unused) == 1 else 'are'} only used by "
                f"synthetic workloads, but trace = {self.trace!r}; remove "
                f'{"it" if len(unused) == 1 else "them"} or set trace = "synthetic"'
            )

    def _check_synthetic(self) -> None:
        at_once = self.arrival == "at_once"
        if self.lengths is not None:
            both = [n for n in ("prompt_tokens", "output_tokens") if getattr(self, n) is not None]
            if both:
                raise ValueError(f"lengths draws prompt and output together; remove "
                                 f"{' and '.join(both)} or remove lengths")
        needed = ("rate_per_s",) if self.lengths else ("rate_per_s", "prompt_tokens",
                                                        "output_tokens")
        missing = [
            name
            for name in needed
            if getattr(self, name) is None and not (at_once and name == "rate_per_s")
        ]
        if missing:
            raise ValueError(
                f'a synthetic workload (trace = "synthetic") needs {", ".join(missing)}'
            )
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("a synthetic workload needs num_requests or duration_s (or both)")
        if self.num_requests is None and self.duration_s is not None and self.rate_per_s:
            expected = self.rate_per_s * self._swung_s(self.start_s + self.duration_s) \
                * self.rate_scale
            if expected > MAX_REQUESTS:
                raise ValueError(
                    f"rate_per_s x (start_s + duration_s) asks for ~{expected:.3g} requests, "
                    f"more than the {MAX_REQUESTS:,} a run may hold; shorten duration_s or "
                    f"set num_requests")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if self.arrival not in ARRIVALS:
            raise ValueError(f"arrival must be one of {', '.join(ARRIVALS)}, got {self.arrival!r}")
        if at_once:
            if self.num_requests is None:
                raise ValueError("arrival = 'at_once' needs num_requests")
            if self.rate_per_s is not None:
                raise ValueError("arrival = 'at_once' sends every request at 0 s; remove "
                                 "rate_per_s or pick another arrival process")
        if self.arrival != "gamma" and self.cv != 1.0:
            raise ValueError(
                f"cv is only used with arrival = 'gamma' (arrival is {self.arrival!r}); "
                f"remove cv or set arrival = 'gamma'"
            )
        if not at_once:
            self.arrival_process()  # runs the process's own checks on rate_per_s and cv

    def profile(self) -> RateProfile | None:
        """The rate profile, or None."""
        if self.rate_profile is None:
            return None
        try:
            return RateProfile.from_points(self.rate_profile)
        except ValueError as err:
            raise ValueError(f"rate_profile: {err}") from None

    def _swung_s(self, end_s: float) -> float:
        """Seconds of the unswung process that real time [0, end_s] holds."""
        profile = self.profile()
        return end_s if profile is None else float(profile.cumulative(end_s))

    def arrival_process(self) -> ArrivalProcess:
        """The synthetic arrival process (before rate_scale)."""
        rate = float(self.rate_per_s)  # type: ignore[arg-type]
        if self.arrival == "gamma":
            return Gamma(rate_per_s=rate, cv=self.cv)
        if self.arrival == "constant":
            return Constant(rate_per_s=rate)
        return Poisson(rate_per_s=rate)


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator,
                   given: Workload | None = None) -> Workload:
    """The requests of one run: load or generate, then ``rate_scale``, slice, ``max_requests``.

    ``given``: a workload built by the caller, which stands in for the trace or generator
    ``cfg`` names (its scaling and slicing still apply, as to a trace file holding it).
    ``rng`` is only drawn from for synthetic workloads. Raises ``FleetsimInputError`` for bad
    trace files and when no request is left after slicing.
    """
    if given is not None:
        workload = given
    elif cfg.is_synthetic:
        until_s = None
        if cfg.duration_s is not None:  # generate up to the window's end, in unscaled time
            until_s = cfg._swung_s(cfg.start_s + cfg.duration_s) * cfg.rate_scale
        lengths = _lengths(cfg)
        if cfg.arrival == "at_once":
            workload = synthesize(
                arrival=AtOnce(), **lengths, rng=rng,
                num_requests=cfg.num_requests, name="synthetic, all at 0 s")
        else:
            workload = synthesize(
                arrival=cfg.arrival_process(),
                **lengths,
                rng=rng,
                num_requests=cfg.num_requests,
                until_s=until_s,
                name=f"synthetic {cfg.arrival} {cfg.rate_per_s:g}/s",
            )
    else:
        assert cfg.trace is not None  # is_synthetic covers None
        workload = load_trace(cfg.trace, cfg.format, hash_block_tokens=cfg.hash_block_tokens)
    workload = scale_rate(workload, cfg.rate_scale)
    workload = swing(workload, cfg.profile())
    workload = time_slice(workload, cfg.start_s, cfg.duration_s)
    workload = head(workload, cfg.max_requests)
    if len(workload) and workload.arrival_s[-1] > MAX_TIME_S:
        field = "rate_per_s" if cfg.is_synthetic else "rate_scale"
        raise FleetsimInputError(
            f"workload.{field}", getattr(cfg, field),
            f"the last request would arrive at {workload.arrival_s[-1]:.3g} s, beyond the "
            f"{MAX_TIME_S:.0e} s a run may span; raise the rate or set duration_s")
    if len(workload) == 0:
        raise FleetsimInputError(
            "workload.start_s",
            cfg.start_s,
            f"no request arrives in the window (start_s={cfg.start_s:g}, "
            f"duration_s={cfg.duration_s}); lower start_s or widen duration_s",
        )
    return workload


def _lengths(cfg: WorkloadConfig) -> dict[str, Any]:
    """synthesize()'s length arguments: paired rows, or one distribution per side."""
    if cfg.lengths is not None:
        try:
            return {"lengths": cfg.lengths.distribution()}
        except FleetsimInputError as err:
            if err.where == "workload.lengths":
                raise
            raise FleetsimInputError(f"workload.lengths.path: {err.where}", err.value,
                                     err.fix) from None
    prompt, output = cfg.prompt_tokens, cfg.output_tokens
    assert prompt is not None  # checked by WorkloadConfig
    assert output is not None
    return {"prompt_tokens": _distribution(prompt, "workload.prompt_tokens"),
            "output_tokens": _distribution(output, "workload.output_tokens")}


def _distribution(cfg: LengthConfig, where: str) -> LengthDistribution:
    try:
        return cfg.distribution()
    except FleetsimInputError as err:  # empirical file problems: say which table pointed there
        raise FleetsimInputError(f"{where}.path: {err.where}", err.value, err.fix) from None
