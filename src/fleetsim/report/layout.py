"""How a set of runs is laid out in a figure: which grid axis gets the colours, which ones
split the panels, and whether the runs may be compared at all (same workload and SLO).

A sweep over rate x GPU x batch size is twelve curves; one colour ramp over all twelve
reads as noise. So one grid axis is the colour (the swept rate when there is one, an
ordered ramp for numbers, distinct hues for names) and the other axes become panels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fleetsim.report.load import RunData, point_label

RATE_KEYS = ("workload.rate_per_s", "workload.rate_scale")
"""Grid keys that set the offered load, in order of preference."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Runs split into panels (facets), coloured by one grid key."""

    colour_key: str | None
    """The grid key whose values get the colours; None: one colour per run (no grid)."""
    colour_values: tuple[Any, ...]
    """Its distinct values, in grid order (or the run labels when ``colour_key`` is None)."""
    facets: tuple[tuple[str, tuple[RunData, ...]], ...]
    """(panel label, its runs) per combination of the remaining grid keys."""

    def value_of(self, run: RunData) -> Any:
        return run.label if self.colour_key is None else run.values.get(self.colour_key)

    def colour(self, run: RunData) -> Any:
        return palette(self.colour_values)[self.colour_values.index(self.value_of(run))]

    def legend_title(self) -> str:
        return "run" if self.colour_key is None else short_key(self.colour_key)


def layout(runs: Sequence[RunData], keys: Sequence[str], x_key: str | None = None) -> Layout:
    """Colour by the rate key if swept (unless it is the x axis), else by the grid key with
    the most values; every other grid key (not ``x_key``) splits the runs into panels."""
    keys = [k for k in keys if k != x_key and len(_distinct(runs, k)) > 1]
    if not keys:
        return Layout(colour_key=None, colour_values=tuple(r.label for r in runs),
                      facets=(("", tuple(runs)),) if runs else ())
    rate = next((k for k in RATE_KEYS if k in keys), None)
    colour_key = rate or max(keys, key=lambda k: len(_distinct(runs, k)))  # first on ties
    others = [k for k in keys if k != colour_key]
    facets: dict[str, list[RunData]] = {}
    for run in runs:
        label = point_label({k: run.values.get(k) for k in others})
        facets.setdefault(label, []).append(run)
    return Layout(colour_key=colour_key, colour_values=tuple(_distinct(runs, colour_key)),
                  facets=tuple((label, tuple(rs)) for label, rs in facets.items()))


def palette(values: Sequence[Any]) -> list[Any]:
    """Colours for ``values``: an ordered ramp (viridis, by rank so that log-spaced rates
    spread evenly) when they are all numbers, distinct hues (tab10) for up to ten names."""
    import matplotlib

    n = len(values)
    numeric = n > 1 and all(isinstance(v, int | float) and not isinstance(v, bool)
                            for v in values)
    if not numeric and n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    ramp = matplotlib.colormaps["viridis"]
    if not numeric:
        return [ramp(x) for x in np.linspace(0.0, 0.9, n)]
    ranks = np.argsort(np.argsort(np.asarray(values, dtype=float), kind="stable"), kind="stable")
    return [ramp(0.9 * r / max(n - 1, 1)) for r in ranks]


def short_key(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _distinct(runs: Sequence[RunData], key: str) -> list[Any]:
    seen: list[Any] = []
    for run in runs:
        v = run.values.get(key)
        if v not in seen:
            seen.append(v)
    return seen


# ---- may these runs be compared? -------------------------------------------------------
def workload_mix(runs: Sequence[RunData], ignore: Sequence[str] = ()) -> str | None:
    """Why ``runs`` are not on one workload and SLO (goodput is only comparable then), or
    None when they are. Compares the workload and SLO tables of each run's config (the
    summary's workload name and SLO when a run has no config.json); ``ignore`` names dotted
    keys allowed to differ (the swept rate, when each configuration is taken at its best)."""
    if len(runs) < 2:
        return None
    flat = [_workload_fields(r) for r in runs]
    keys = sorted({k for f in flat for k in f} - set(ignore))
    differing = []
    for k in keys:
        values = list(dict.fromkeys(repr(f.get(k)) for f in flat))
        if len(values) > 1:
            differing.append(f"{k}: {' vs '.join(values[:3])}{' ...' if len(values) > 3 else ''}")
    if not differing:
        return None
    return ("the runs differ in workload or SLO (" + "; ".join(differing[:3])
            + ("; ..." if len(differing) > 3 else "")
            + "), and goodput on different workloads is not comparable")


def _workload_fields(run: RunData) -> dict[str, Any]:
    config = run.config or {}
    out: dict[str, Any] = {}
    if isinstance(config.get("workload"), dict):
        _flatten("workload", config["workload"], out)
    else:
        out["workload"] = run.summary.get("workload")
    slo = config.get("slo") if isinstance(config.get("slo"), dict) else {
        k: v for k, v in (run.summary.get("slo") or {}).items() if k in ("ttft_s", "tpot_s")}
    _flatten("slo", slo, out)
    return out


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def fit(lay: Layout, max_facets: int, max_colours: int) -> tuple[Layout, str]:
    """At most ``max_facets`` panels and ``max_colours`` colours (evenly spaced, first and
    last kept), and a sentence saying what was left out ("" when nothing was)."""
    facets = thin(lay.facets, max_facets)
    values = thin(lay.colour_values, max_colours)
    kept = set(map(repr, values))
    facets = [(label, tuple(r for r in rs if repr(lay.value_of(r)) in kept))
              for label, rs in facets]
    notes = []
    if len(facets) < len(lay.facets):
        notes.append(f"{len(facets)} of {len(lay.facets)} panels")
    if len(values) < len(lay.colour_values):
        what = "runs" if lay.colour_key is None else f"{short_key(lay.colour_key)} values"
        notes.append(f"{len(values)} of {len(lay.colour_values)} {what}")
    note = f"Showing {' and '.join(notes)}, evenly spaced." if notes else ""
    return Layout(colour_key=lay.colour_key, colour_values=tuple(values),
                  facets=tuple(facets)), note


def thin(items: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` items, evenly spaced, first and last kept."""
    if len(items) <= limit:
        return list(items)
    idx = np.unique(np.linspace(0, len(items) - 1, limit).round().astype(int))
    return [items[i] for i in idx]
