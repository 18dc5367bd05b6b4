"""The report's figures (matplotlib, no pyplot state): latency CDFs, SLO attainment vs offered
load, queue length and batch size over time, and the cost-vs-goodput Pareto front.

Each function returns a ``Figure`` whose suptitle is the section title of the page, or
None when its inputs hold nothing to draw. Runs are laid out by ``report.layout``: one grid
axis is the colour, the others split the panels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from fleetsim.report.layout import RATE_KEYS, Layout, short_key
from fleetsim.report.load import (
    LATENCY_COLUMNS,
    PlanData,
    RunData,
    SearchData,
    SweepData,
    point_label,
)

MAX_CURVES = 12
"""More colours than this in one panel are thinned to evenly spaced ones."""
MAX_FACETS = 4
"""Panels (combinations of the grid axes that are not the colour) per figure."""
DEFAULT_TARGET = 0.9
"""The attainment target drawn on sweeps: ``fleetsim goodput`` and ``plan``'s default."""
RATE_LABELS = {"workload.rate_per_s": "arrival rate (requests/s)",
               "workload.rate_scale": "rate scale (× the trace's arrival rate)"}
LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}

TITLE_CDF = "Latency CDFs"
TITLE_SLO = "SLO attainment vs offered load"
TITLE_QUEUE = "Queue length and batch size over time"
TITLE_PARETO = "Pareto front: cost vs goodput"


def latency_cdfs(lay: Layout) -> Figure | None:
    """One row of panels (TTFT, TPOT, E2E) per facet, one empirical CDF per run coloured by
    the layout's colour key, SLO targets marked."""
    facets = [(label, [r for r in runs if r.latencies is not None])
              for label, runs in lay.facets]
    facets = [(label, runs) for label, runs in facets if runs]
    if not facets:
        return None
    fig = Figure(figsize=(13, 0.8 + 3.3 * len(facets)), layout="constrained")
    grid = fig.subplots(len(facets), 3, squeeze=False)
    for row, (facet, runs) in zip(grid, facets, strict=True):
        for ax, col in zip(row, LATENCY_COLUMNS, strict=True):
            _cdf_panel(ax, lay, runs, col)
            ax.set_title(f"{LATENCY_NAMES[col]}{f' ({facet})' if facet else ''}", fontsize=10)
    _legend(fig, lay, [r for _, runs in facets for r in runs])
    fig.suptitle(TITLE_CDF)
    return fig


def _cdf_panel(ax: Any, lay: Layout, runs: Sequence[RunData], col: str) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lows, highs = [], []
    for run in runs:
        v = run.latencies[col]  # type: ignore[index]
        v = np.sort(v[np.isfinite(v) & (v > 0)])
        if v.size:
            ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=lay.colour(run),
                    linewidth=1.4)
            lows.append(v[0])
            highs.append(v[-1])
    for t in sorted({r.summary.get("slo", {}).get(col) for r in runs} - {None}):
        ax.axvline(t, color="black", linestyle="--", linewidth=0.9)
        ax.text(t, 0.03, f" SLO {t:g} s", rotation=90, fontsize=8, va="bottom")
        highs.append(t)
    # Log scale only when the values span more than a decade and a half; below that a
    # linear axis is easier to read and log ticks crowd.
    use_log = bool(lows) and max(highs) / min(lows) > 30
    if use_log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(f"{LATENCY_NAMES[col]} (s{', log scale' if use_log else ''})")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3, which="both")


def _legend(fig: Figure, lay: Layout, runs: Sequence[RunData]) -> None:
    """One legend for the figure: a line per colour value present, in grid order."""
    from matplotlib.lines import Line2D

    present = {repr(lay.value_of(r)) for r in runs}
    values = [v for v in lay.colour_values if repr(v) in present]
    colours = {repr(lay.value_of(r)): lay.colour(r) for r in runs}
    handles = [Line2D([], [], color=colours[repr(v)], linewidth=2) for v in values]
    fig.legend(handles, [str(v) for v in values], loc="outside right center", fontsize=8,
               title=lay.legend_title())


def rate_key(sweep: SweepData) -> str | None:
    return next((k for k in RATE_KEYS if k in sweep.keys), None)


def offered_rate(run: RunData) -> float | None:
    """Requests per second offered (arrivals over their span), from the summary; older
    summaries give it as offered/capacity times the completion rate (the same quantity)."""
    overload = run.summary.get("overload") or {}
    rate = _number(overload.get("offered_requests_per_s"))
    ratio = _number(overload.get("offered_over_capacity"))
    done = _number((run.summary.get("throughput") or {}).get("requests_per_s"))
    if rate is None and ratio is not None and done is not None:
        rate = ratio * done
    if rate is None and "workload.rate_per_s" in run.values:
        rate = _number(run.values["workload.rate_per_s"])
    return rate


def slo_vs_rate_sweep(sweep: SweepData, lay: Layout) -> Figure | None:
    """Per facet, attainment (with the target line) and goodput against the offered load in
    requests/s, one curve per value of the colour key. ``lay`` is laid out with the swept
    rate as the x axis."""
    key = rate_key(sweep)
    if key is None or not sweep.runs:
        return None
    in_req_s = all(offered_rate(r) is not None for r in sweep.runs)

    def x_of(run: RunData) -> float:
        return offered_rate(run) if in_req_s else float(run.values[key])  # type: ignore[return-value]

    xlabel = "offered load (requests/s)" if in_req_s else RATE_LABELS[key]
    fig = Figure(figsize=(13, 0.9 + 3.6 * len(lay.facets)), layout="constrained")
    grid = fig.subplots(len(lay.facets), 2, squeeze=False)
    for (ax_att, ax_good), (facet, runs) in zip(grid, lay.facets, strict=True):
        curves: dict[str, list[RunData]] = {}
        for run in runs:
            curves.setdefault(repr(lay.value_of(run)), []).append(run)
        for group in curves.values():
            group = sorted(group, key=x_of)
            colour, name = lay.colour(group[0]), _curve_name(lay, group[0])
            x = [x_of(r) for r in group]
            slo = [r.summary.get("slo", {}) for r in group]
            ax_att.plot(x, [100 * s.get("attainment", np.nan) for s in slo], "o-",
                        color=colour, label=name)
            if len(curves) == 1:  # the TTFT and TPOT parts, when they fit on one plot
                ax_att.plot(x, [100 * s.get("ttft_attainment", np.nan) for s in slo], "^--",
                            color="tab:orange", label="TTFT only", linewidth=1)
                ax_att.plot(x, [100 * s.get("tpot_attainment", np.nan) for s in slo], "v--",
                            color="tab:green", label="TPOT only", linewidth=1)
            ax_good.plot(x, [s.get("goodput_requests_per_s", np.nan) for s in slo], "o-",
                         color=colour, label=f"SLO-meeting {name}")
            ax_good.plot(x, [r.summary.get("throughput", {}).get("requests_per_s", np.nan)
                             for r in group], "s:", color=colour, linewidth=1,
                         label=f"throughput {name}")
        ax_att.axhline(100 * DEFAULT_TARGET, color="black", linestyle="--", linewidth=0.9,
                       label=f"target {100 * DEFAULT_TARGET:g}%")
        if in_req_s:  # the ideal: every offered request served
            top = max(x_of(r) for r in runs)
            ax_good.plot([0, top], [0, top], color="0.6", linewidth=0.8, label="offered load")
        _rate_axes(ax_att, ax_good, xlabel, facet)
    slo = sweep.runs[0].summary.get("slo", {})
    fig.suptitle(f"{TITLE_SLO} (sweep over {key}; SLO: TTFT ≤ {slo.get('ttft_s', '?')} s, "
                 f"TPOT ≤ {slo.get('tpot_s', '?')} s)")
    return fig


def _curve_name(lay: Layout, run: RunData) -> str:
    if lay.colour_key is None:
        return ""
    return f"{short_key(lay.colour_key)}={lay.value_of(run)}"


def slo_vs_rate_search(search: SearchData) -> Figure | None:
    """The probes of a goodput search: attainment per probed rate, target and answer marked."""
    probes = search.probes
    if not probes:
        return None
    fig = Figure(figsize=(13, 4.4), layout="constrained")
    ax_att, ax_good = fig.subplots(1, 2)
    x = [p["rate_per_s"] for p in probes]
    ax_att.plot(x, [100 * p["attainment"] for p in probes], "-", color="tab:blue", zorder=1)
    for passed, marker, label in ((True, "o", "probe met target"), (False, "X", "probe missed")):
        pts = [p for p in probes if bool(p.get("passed", True)) == passed]
        if pts:
            ax_att.scatter([p["rate_per_s"] for p in pts], [100 * p["attainment"] for p in pts],
                           marker=marker, s=45, label=label, zorder=2,
                           color="tab:blue" if passed else "tab:red")
    for part, style, color in (("ttft_attainment", "^--", "tab:orange"),
                               ("tpot_attainment", "v--", "tab:green")):
        if all(part in p for p in probes):
            ax_att.plot(x, [100 * p[part] for p in probes], style, color=color, linewidth=1,
                        label=f"{LATENCY_NAMES[part.split('_')[0] + '_s']} only")
    if search.target is not None:
        ax_att.axhline(100 * search.target, color="black", linestyle="--", linewidth=0.9,
                       label=f"target {100 * search.target:g}%")
    if search.goodput_requests_per_s:
        for ax in (ax_att, ax_good):
            ax.axvline(search.goodput_requests_per_s, color="tab:purple", linewidth=1,
                       label=f"goodput {search.goodput_requests_per_s:.3g} req/s")
    if all("goodput_requests_per_s" in p for p in probes):
        ax_good.plot(x, [p["goodput_requests_per_s"] for p in probes], "o-",
                     label="SLO-meeting rate")
    ax_good.plot(x, [p["attainment"] * p["rate_per_s"] for p in probes], "s:", linewidth=1,
                 color="0.4", label="rate × attainment")
    _rate_axes(ax_att, ax_good, "offered load (requests/s)", "")
    ax_good.set_title("requests meeting the SLO per second of offered load")
    fig.suptitle(f"{TITLE_SLO} (goodput search, {len(probes)} probes)")
    return fig


def _rate_axes(ax_att: Any, ax_good: Any, xlabel: str, facet: str) -> None:
    suffix = f" ({facet})" if facet else ""
    ax_att.set_xlabel(xlabel)
    ax_att.set_ylabel("SLO attainment (% of requests)")
    ax_att.set_ylim(-2, 102)
    ax_att.set_title("SLO attainment" + suffix, fontsize=10)
    ax_good.set_xlabel(xlabel)
    ax_good.set_ylabel("requests/s")
    ax_good.set_title("SLO-meeting rate and throughput" + suffix, fontsize=10)
    for ax in (ax_att, ax_good):
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


QUEUE_ROWS = (
    ("waiting", "queue length\n(requests waiting)"),
    ("running", "batch size\n(requests per step)"),
    ("kv", "KV cache used (%)"),
)


def queue_over_time(lay: Layout) -> Figure | None:
    """Per facet (a column): waiting requests in the whole cluster, requests per step (the
    batch, over busy time), and KV-cache use, against simulated time; one curve per run,
    coloured by the layout's colour key."""
    facets = [(label, [r for r in runs if queue_series(r) is not None])
              for label, runs in lay.facets]
    facets = [(label, runs) for label, runs in facets if runs]
    if not facets:
        return None
    ncols = len(facets)
    fig = Figure(figsize=(max(7.0, 4.4 * ncols + 1.8), 8.4), layout="constrained")
    grid = fig.subplots(len(QUEUE_ROWS), ncols, squeeze=False, sharex="col")
    for j, (facet, runs) in enumerate(facets):
        for run in runs:
            series = queue_series(run)
            assert series is not None
            for i, (name, _) in enumerate(QUEUE_ROWS):
                grid[i][j].plot(series["t"], series[name], color=lay.colour(run),
                                linewidth=1.3)
        grid[0][j].set_title(facet or "whole cluster", fontsize=10)
        grid[-1][j].set_xlabel("simulated time (s)")
    for i, (_, label) in enumerate(QUEUE_ROWS):
        grid[i][0].set_ylabel(label)
        for ax in grid[i]:
            ax.grid(alpha=0.3)
            # At least 0..1: an empty queue reads as zero, not as ticks of 0.01.
            ax.set_ylim(0, max(1.0, ax.get_ylim()[1]))
    _legend(fig, lay, [r for _, runs in facets for r in runs])
    fig.suptitle(TITLE_QUEUE)
    return fig


def queue_series(run: RunData) -> dict[str, Any] | None:
    """The run's cluster timeline as plot series (bin centres), or None if the summary has
    no queue columns. The summary's running and waiting are averages over busy time per
    replica: times the busy share and the replica count, waiting is the time-average
    queue of the whole cluster; running stays per busy replica (the batch), blank when idle."""
    tl = run.summary.get("timeline")
    cols = ("bin_start_s", "busy_fraction", "mean_running", "mean_waiting")
    if not isinstance(tl, dict) or not all(isinstance(tl.get(c), list) for c in cols):
        return None
    start = np.asarray(tl["bin_start_s"], dtype=float)
    if start.size < 2 or any(len(tl[c]) != start.size for c in cols):
        return None
    busy = np.asarray(tl["busy_fraction"], dtype=float)
    num_replicas = _number(run.summary.get("num_replicas")) or 1.0
    kv = np.asarray(tl.get("kv_used_fraction") or [math.nan] * start.size, dtype=float)
    return {"t": start + (start[1] - start[0]) / 2,
            "waiting": np.asarray(tl["mean_waiting"], dtype=float) * busy * num_replicas,
            "running": np.where(busy > 0, np.asarray(tl["mean_running"], dtype=float), np.nan),
            "kv": 100 * kv}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def pareto_points(runs: Sequence[RunData], rate: str | None = None) -> list[dict[str, Any]]:
    """Runs with a cost ($/hour) and a goodput, the front marked (cheapest for its goodput).
    With ``rate`` (a swept rate key), each configuration (the other grid values) counts once,
    with the best goodput it reached over the swept rates."""
    best: dict[str, dict[str, Any]] = {}
    for run in runs:
        cost = run.summary.get("cost", {})
        usd = cost.get("usd_per_hour") if isinstance(cost, dict) else None
        goodput = run.summary.get("slo", {}).get("goodput_requests_per_s")
        if usd is None or goodput is None:
            continue
        group = point_label({k: v for k, v in run.values.items() if k != rate}) or run.label
        label = group
        if rate is not None:
            label += f" (best at {rate.rsplit('.', 1)[-1]}={run.values.get(rate)})"
        if group not in best or goodput > best[group]["goodput_requests_per_s"]:
            best[group] = {"label": label, "usd_per_hour": float(usd),
                           "goodput_requests_per_s": float(goodput)}
    points = list(best.values())
    for i in pareto_front([(p["usd_per_hour"], p["goodput_requests_per_s"]) for p in points]):
        points[i]["on_front"] = True
    return points


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, goodput) points no other point beats: cheaper-or-equal and
    strictly more goodput, or strictly cheaper and equal goodput. Sorted by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -np.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def pareto(points: Sequence[dict[str, Any]], subtitle: str, target: float | None = None
           ) -> Figure | None:
    """Cost against goodput; every point grey, the front red and labelled."""
    if not points:
        return None
    fig = Figure(figsize=(9, 5.4), layout="constrained")
    ax = fig.subplots()
    ax.scatter([p["usd_per_hour"] for p in points], [p["goodput_requests_per_s"] for p in points],
               color="0.6", label="configurations", zorder=2)
    front = sorted((p for p in points if p.get("on_front")), key=lambda p: p["usd_per_hour"])
    if front:
        fx = [p["usd_per_hour"] for p in front]
        fy = [p["goodput_requests_per_s"] for p in front]
        ax.step(fx, fy, where="post", color="tab:red", zorder=3)
        ax.scatter(fx, fy, color="tab:red", zorder=4, label="Pareto front")
        for p in front:
            ax.annotate(p["label"], (p["usd_per_hour"], p["goodput_requests_per_s"]),
                        textcoords="offset points", xytext=(5, -11), fontsize=7)
    # From zero: cost and goodput ratios read true; the slack on the right holds the labels.
    ax.set_xlim(0, 1.35 * max(p["usd_per_hour"] for p in points))
    ax.set_ylim(0, 1.12 * max(p["goodput_requests_per_s"] for p in points) or 1.0)
    ax.set_xlabel("cluster cost ($/hour)")
    at = f" at {100 * target:g}% SLO attainment" if target is not None else " meeting the SLO"
    ax.set_ylabel(f"goodput (requests/s{at})")
    ax.set_title(subtitle, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.suptitle(TITLE_PARETO)
    return fig


def pareto_of_plan(plan: PlanData) -> Figure | None:
    return pareto(plan.points, f"capacity plan {plan.path.name}: {len(plan.points)} feasible "
                  f"shapes, {plan.num_infeasible} infeasible", plan.target)
