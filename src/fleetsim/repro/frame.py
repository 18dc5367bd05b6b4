"""The frame every reproduction uses: a record of the paper, a run that goes through the same
``run()`` every user calls, and results in one schema.

A reproduction is data plus a short function (STYLE.md section 9). Its ``Reproduction``
record holds the paper (title, id), the headline as published, the metric and its direction,
the system and the baselines, and the published ratio (system over baseline, in the better
direction). Its ``compare(ctx)`` function builds one config per (policy, load level), runs
each through ``ctx.run`` and returns a ``Comparison``: the metric per policy and load, and
fleetsim's ratio computed by the paper's own definition, whether it is a bound, and the
ablations' ratios (``attribution``). The record also holds the published value for the
setting fleetsim runs (``paper_ratio``, with its source) apart from the paper's best "up to"
figure (``paper_best``). ``run_reproduction`` does the rest:
progress, timing and the JSON document (``to_document``), which has the same keys for every
entry (docs/reproductions.md).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fleetsim.config import SimConfig, config_from_dict
from fleetsim.configutil import apply_overrides, from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.registry import make_registry
from fleetsim.repro.pool import SubRuns
from fleetsim.results import RequestRows, RunFiles
from fleetsim.run import RunResult, run
from fleetsim.workloads import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Paper:
    title: str
    id: str
    """arXiv id or venue (e.g. ``"arXiv:2305.05920"``)."""
    venue: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Metric:
    name: str
    unit: str
    direction: str
    """``"lower"`` or ``"higher"`` is better."""

    def __post_init__(self) -> None:
        if self.direction not in ("lower", "higher"):
            raise ValueError(f"metric direction must be lower or higher, got {self.direction}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Loads:
    """The load levels a comparison sweeps (the x axis of the paper's key figure)."""

    name: str
    unit: str
    values: tuple[float, ...]
    quick_values: tuple[float, ...]
    labels: tuple[str, ...] = ()
    """Names of the levels when they are categories (e.g. phase and hardware), not numbers:
    the table's columns and the figure's x ticks; ``values`` are then their positions."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Reproduction:
    """One paper's headline comparison, as published, and how fleetsim reruns it."""

    key: str
    paper: Paper
    claim: str
    """The headline as the paper states it."""
    setup: str
    """Model, GPUs, workload and load levels, as fleetsim runs them (with sources)."""
    system: str
    baselines: tuple[str, ...]
    baseline: str
    """The baseline the headline ratio is against."""
    metric: Metric
    ratio_definition: str
    paper_ratio: float | None
    """The published value for the setting fleetsim runs (the figure or table, model and
    dataset of ``setup``), in the form of ``ratio_definition``: system over baseline in the
    better direction. None where that panel's value is not recoverable from the paper or its
    artifact (``paper_ratio_source`` says why)."""
    paper_ratio_source: str
    """Where ``paper_ratio`` comes from (figure, table or artifact file), or why it is None."""
    paper_best: float | None
    """The paper's best ("up to") figure over all its settings, system over baseline; None
    where the paper states none (e.g. only an average)."""
    loads: Loads
    compare: Callable[[ReproContext], Comparison]
    extra_figures: Callable[[ReproContext, Path], None] | None = None
    """Figures beside the key one (e.g. a timeline), drawn from the runs into the output
    folder by ``fleetsim repro NAME`` (needs matplotlib)."""
    headline_metric: Metric | None = None
    """The quantity the headline ratio compares, when it is not ``metric`` at one load (e.g.
    throughput within a latency SLO, derived from the sweep); ``Comparison.headline`` holds
    it per policy."""


@dataclass(slots=True)
class Comparison:
    """What a reproduction's ``compare`` returns."""

    results: dict[str, dict[str, float | None]]
    """policy -> load label -> metric value (None: not measured there, e.g. the run did not
    finish every job)."""
    ratio: float | None
    headline: dict[str, float | None] = field(default_factory=dict)
    """policy -> the headline quantity (``Reproduction.headline_metric``), when there is one."""
    notes: list[str] = field(default_factory=list)
    reference: tuple[str, float] | None = None
    """A level of ``metric`` drawn across the key figure (e.g. ``("SLO", 0.3)``)."""
    attribution: dict[str, float | None] = field(default_factory=dict)
    """ablation -> its ratio against ``Reproduction.baseline``, in the form of ``ratio``. An
    ablation is the system with one of its mechanisms removed, on the same engine (e.g.
    FastServe's engine with FCFS instead of its MLFQ); the mechanism carries the gain the
    ablation loses. Empty where the entry runs no ablation (a note says so)."""
    attribution_reference: float | None = None
    """The system's own ratio in the attribution's form, where that is not ``ratio``'s (e.g.
    on one model where ``ratio`` is the best over models); the note compares with it."""
    ratio_is_bound: bool = False
    """True where ``ratio`` is a bound, not a measurement: the sweep did not bracket a
    crossing it is computed from (a policy still within its SLO at the highest load)."""


_Setup = TypeVar("_Setup")


def setup_from(ctx: ReproContext, cls: type[_Setup], quick: Mapping[str, Any],
               name: str) -> _Setup:
    """A reproduction's own setup dataclass ``cls``: ``quick``'s settings under ``--quick``,
    then the user's ``--set key=value`` overrides (errors name ``name.key``)."""
    data: dict[str, Any] = copy.deepcopy(dict(quick)) if ctx.quick else {}
    apply_overrides(data, ctx.overrides)
    return from_dict(cls, data, name)


def run_files(item: tuple[Mapping[str, Any], Workload | None]) -> RunFiles:
    """Simulate the config of ``item`` (overrides already applied; with its in-memory
    requests, if any) and keep what is written of it: a sub-simulation that runs in a helper
    process (``ReproContext.run_many``)."""
    data, workload = item
    result = run(config_from_dict(dict(data)), workload=workload)
    return RunFiles(result.summary, result.config, RequestRows(dict(result.records.requests)))


class ReproContext:
    """Given to ``compare``: whether the run is ``quick``, the user's ``--set`` overrides, and
    ``run`` (every simulation goes through it: overrides applied, progress reported, the run
    kept for writing). ``subruns``: where independent simulations given together
    (``run_many``) may run; one after another here unless it says otherwise."""

    def __init__(self, *, quick: bool, overrides: Sequence[str],
                 progress: Callable[[str], None] | None = None,
                 subruns: SubRuns | None = None) -> None:
        self.quick = quick
        self.overrides = tuple(overrides)
        self.progress = progress
        self.subruns = subruns or SubRuns()
        # (policy, load label) -> run
        self.runs: dict[tuple[str, str], RunResult | RunFiles] = {}

    def config(self, base: Mapping[str, Any]) -> SimConfig:
        """``base`` with the user's ``--set key=value`` overrides on top."""
        data: dict[str, Any] = copy.deepcopy(dict(base))
        apply_overrides(data, self.overrides)
        return config_from_dict(data)

    def run(self, policy: str, load: str, base: Mapping[str, Any], *,
            workload: Workload | None = None) -> RunResult:
        """Simulate one (policy, load level) and keep it (``workload``: requests built in
        memory, standing in for ``base``'s trace, as ``fleetsim.run.run`` takes them)."""
        if self.progress is not None:
            self.progress(f"{policy} @ {load}")
        result = run(self.config(base), workload=workload)
        self.runs[(policy, load)] = result
        return result

    def keep(self, policy: str, load: str, summary: dict[str, Any], config: dict[str, Any],
             requests: Mapping[str, Any] | None = None) -> None:
        """Keep a run that did not go through ``run`` (an RL rollout, an MoE pass model, a
        SoC run) as the run of (``policy``, ``load``), written like one: its summary, config
        and, given ``requests`` (columns), ``requests.csv``."""
        self.runs[(policy, load)] = RunFiles(
            summary, config, None if requests is None else RequestRows(requests))

    def run_many(self, runs: Sequence[tuple[str, str, Mapping[str, Any]]], *,
                 workloads: Sequence[Workload | None] | None = None
                 ) -> list[RunResult | RunFiles]:
        """``[self.run(policy, load, base, workload=w) for ...]`` over ``runs`` and
        ``workloads`` (one per run, default none), the runs spread over ``subruns`` (each
        config is checked here first, so bad input fails as in ``run``). Kept and reported
        in ``runs``' order; a run that went to a helper process comes back as ``RunFiles``
        (its summary, config and request rows)."""
        wls = [None] * len(runs) if workloads is None else list(workloads)
        if not self.subruns.parallel:
            return [self.run(policy, load, base, workload=wl)
                    for (policy, load, base), wl in zip(runs, wls, strict=True)]
        datas = []
        for _, _, base in runs:
            data: dict[str, Any] = copy.deepcopy(dict(base))
            apply_overrides(data, self.overrides)
            config_from_dict(copy.deepcopy(data))  # bad input fails here, before any run
            datas.append(data)
        results = self.subruns.map(run_files, list(zip(datas, wls, strict=True)))
        for (policy, load, _), result in zip(runs, results, strict=True):
            if self.progress is not None:
                self.progress(f"{policy} @ {load}")
            self.runs[(policy, load)] = result
        return list(results)


REPRODUCTIONS, register_reproduction = make_registry("reproduction")


def get_reproduction(name: str) -> Reproduction:
    repro = REPRODUCTIONS.get(name)
    if repro is None:
        known = ", ".join(sorted(REPRODUCTIONS))
        raise FleetsimInputError("repro", name, f"known reproductions: {known} "
                                 f"(fleetsim repro list)")
    return repro  # type: ignore[no-any-return]


def add(repro: Reproduction) -> Reproduction:
    """Register ``repro`` under its key."""
    register_reproduction(repro.key)(repro)
    return repro


def run_reproduction(repro: Reproduction, *, quick: bool = False,
                     overrides: Sequence[str] = (),
                     progress: Callable[[str], None] | None = None,
                     subruns: SubRuns | None = None) -> tuple[Comparison, ReproContext]:
    """Run ``repro``'s comparison; returns it and the context holding every run."""
    ctx = ReproContext(quick=quick, overrides=overrides, progress=progress, subruns=subruns)
    comparison = repro.compare(ctx)
    comparison.notes.append(attribution_note(repro, comparison))
    return comparison, ctx


def attribution_note(repro: Reproduction, comparison: Comparison) -> str:
    """The note that reads ``comparison.attribution``: each ablation's ratio next to the
    system's and the share of the system's gain the removed mechanism carries, 1 -
    log(ablation) / log(system) (a ratio's share on a log scale: 2x of a 4x gain is half of
    it), or that no ablation runs."""
    if not comparison.attribution:
        return (f"attribution: none measured; this entry runs no ablation of {repro.system} "
                f"(its mechanisms removed one at a time) yet, so which mechanism carries the "
                f"ratio is not shown")
    ratio = (comparison.ratio if comparison.attribution_reference is None
             else comparison.attribution_reference)
    parts = []
    for name, value in comparison.attribution.items():
        share = (None if value is None or ratio is None or ratio <= 1.0 or value <= 0.0
                 else 1.0 - math.log(value) / math.log(ratio))
        parts.append(f"{name} {fmt(value, 'x')}"
                     + ("" if share is None else f" (the removed mechanism carries {share:.0%})"))
    return (f"attribution, ablations against {repro.baseline} in the ratio's form "
            f"({repro.system}: {fmt(ratio, 'x')}): " + ", ".join(parts))


def is_bound(top: float, *crossings: float | None) -> bool:
    """Whether a ratio of ``crossings`` (loads where a curve crosses its SLO) is a bound: one
    of them never crossed within a sweep whose highest load is ``top``."""
    return any(c is not None and c >= top for c in crossings)


def to_document(repro: Reproduction, comparison: Comparison, *, quick: bool,
                overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The ``--json`` document and ``repro.json``: the same keys for every reproduction.

    ``overrides`` (the user's ``--set`` items) are recorded, and any of them makes
    ``paper_setting`` false: the runs are no longer the paper's, so ``ratio`` is fleetsim's
    measurement under them, not the paper's comparison."""
    loads = repro.loads
    return {
        "overrides": list(overrides),
        "paper_setting": not overrides,
        "name": repro.key,
        "paper": {"title": repro.paper.title, "id": repro.paper.id, "venue": repro.paper.venue},
        "claim": repro.claim,
        "setup": repro.setup,
        "system": repro.system,
        "baselines": list(repro.baselines),
        "baseline": repro.baseline,
        "metric": {"name": repro.metric.name, "unit": repro.metric.unit,
                   "direction": repro.metric.direction},
        "headline_metric": (None if repro.headline_metric is None else {
            "name": repro.headline_metric.name, "unit": repro.headline_metric.unit,
            "direction": repro.headline_metric.direction}),
        "headline": comparison.headline,
        "ratio_definition": repro.ratio_definition,
        "paper_ratio": repro.paper_ratio,
        "paper_ratio_source": repro.paper_ratio_source,
        "paper_best": repro.paper_best,
        "ratio": comparison.ratio,
        "ratio_is_bound": comparison.ratio_is_bound,
        "attribution": comparison.attribution,
        "loads": {"name": loads.name, "unit": loads.unit,
                  "values": list(loads.quick_values if quick else loads.values),
                  "labels": list(loads.labels)},
        "results": comparison.results,
        "quick": quick,
        "notes": comparison.notes,
    }


def fmt(value: float | None, suffix: str = "", digits: int = 2) -> str:
    """A figure for a note: ``"n/a"`` where it was not measured."""
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def fmt_ratios(ratios: Sequence[float | None], digits: int = 2) -> str:
    """Ratios per load for a note, e.g. ``"1.31x, 1.28x, n/a"``."""
    return ", ".join(fmt(r, "x", digits) for r in ratios)


def better_ratio(system: float | None, baseline: float | None, direction: str) -> float | None:
    """System over baseline in the better direction (> 1: the system is better)."""
    if system is None or baseline is None or not math.isfinite(system) or not math.isfinite(
            baseline) or system <= 0 or baseline <= 0:
        return None
    return system / baseline if direction == "higher" else baseline / system
