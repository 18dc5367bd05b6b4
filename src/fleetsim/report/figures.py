"""The report's figures (matplotlib, no pyplot state): latency CDFs, SLO attainment vs rate,
utilization over time, and the cost-vs-goodput Pareto front.

Each function returns a ``Figure`` whose suptitle is the section title of the page, or
None when its inputs hold nothing to draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from fleetsim.report.load import (
    LATENCY_COLUMNS,
    PlanData,
    RunData,
    SearchData,
    SweepData,
    point_label,
)

MAX_CURVES = 12
"""More curves than this in one panel are thinned to evenly spaced ones (legend stays legible)."""
MAX_PANELS = 9
RATE_KEYS = ("workload.rate_per_s", "workload.rate_scale")
"""Grid keys that set the offered load, in order of preference."""
RATE_LABELS = {"workload.rate_per_s": "arrival rate (requests/s)",
               "workload.rate_scale": "rate scale (× the trace's arrival rate)"}
LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}

TITLE_CDF = "Latency CDFs"
TITLE_SLO = "SLO attainment vs rate"
TITLE_UTIL = "Utilization over time"
TITLE_PARETO = "Pareto front: cost vs goodput"


def thin(items: Sequence[Any], limit: int) -> list[Any]:
    """At most ``limit`` items, evenly spaced, first and last kept."""
    if len(items) <= limit:
        return list(items)
    idx = np.unique(np.linspace(0, len(items) - 1, limit).round().astype(int))
    return [items[i] for i in idx]


def colors(n: int) -> list[Any]:
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    return [matplotlib.colormaps["viridis"](x) for x in np.linspace(0.0, 0.92, n)]


def latency_cdfs(runs: Sequence[RunData]) -> Figure | None:
    """One panel per latency (TTFT, TPOT, E2E), one empirical CDF per run, SLO marked."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    runs = thin([r for r in runs if r.latencies is not None], MAX_CURVES)
    if not runs:
        return None
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3)
    run_colors = colors(len(runs))
    for ax, col in zip(axes, LATENCY_COLUMNS, strict=True):
        name = LATENCY_NAMES[col]
        lows, highs = [], []
        for color, run in zip(run_colors, runs, strict=True):
            v = run.latencies[col]  # type: ignore[index]
            v = np.sort(v[np.isfinite(v) & (v > 0)])
            if v.size:
                ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", color=color,
                        label=run.label, linewidth=1.4)
                lows.append(v[0])
                highs.append(v[-1])
        targets = {r.summary.get("slo", {}).get(col) for r in runs} - {None}
        for t in sorted(targets):
            ax.axvline(t, color="black", linestyle="--", linewidth=0.9)
            ax.text(t, 0.03, f" SLO {t:g} s", rotation=90, fontsize=8, va="bottom")
            highs.append(t)
        # Log scale only when the values span more than a decade and a half; below that
        # a linear axis is easier to read and log ticks crowd.
        use_log = bool(lows) and max(highs) / min(lows) > 30
        if use_log:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{name} (s{', log scale' if use_log else ''})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(name)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8, title="run")
    fig.suptitle(TITLE_CDF)
    return fig


def rate_key(sweep: SweepData) -> str | None:
    return next((k for k in RATE_KEYS if k in sweep.keys), None)


def slo_vs_rate_sweep(sweep: SweepData) -> Figure | None:
    """Attainment (with its TTFT and TPOT parts) and goodput against the swept rate, one
    curve per combination of the other grid values."""
    key = rate_key(sweep)
    if key is None:
        return None
    others = [k for k in sweep.keys if k != key]
    groups: dict[str, list[RunData]] = {}
    for run in sweep.runs:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={run.values.get(k)}" for k in others)
        groups.setdefault(label or "attainment", []).append(run)
    groups = dict(thin(list(groups.items()), MAX_CURVES))
    if not groups:
        return None
    fig = Figure(figsize=(13, 4.4), layout="constrained")
    ax_att, ax_good = fig.subplots(1, 2)
    for color, (label, runs) in zip(colors(len(groups)), groups.items(), strict=True):
        runs = sorted(runs, key=lambda r: float(r.values[key]))
        x = [float(r.values[key]) for r in runs]
        slo = [r.summary.get("slo", {}) for r in runs]
        ax_att.plot(x, [100 * s.get("attainment", np.nan) for s in slo], "o-", color=color,
                    label=label)
        if len(groups) == 1:  # the TTFT and TPOT parts, when they fit on one plot
            ax_att.plot(x, [100 * s.get("ttft_attainment", np.nan) for s in slo], "^--",
                        color="tab:orange", label="TTFT only", linewidth=1)
            ax_att.plot(x, [100 * s.get("tpot_attainment", np.nan) for s in slo], "v--",
                        color="tab:green", label="TPOT only", linewidth=1)
        ax_good.plot(x, [s.get("goodput_requests_per_s", np.nan) for s in slo], "o-",
                     color=color, label=f"goodput {label}" if len(groups) > 1 else "goodput")
        ax_good.plot(x, [r.summary.get("throughput", {}).get("requests_per_s", np.nan)
                         for r in runs], "s:", color=color, linewidth=1,
                     label=f"throughput {label}" if len(groups) > 1 else "throughput")
    _rate_axes(ax_att, ax_good, RATE_LABELS[key])
    slo = sweep.runs[0].summary.get("slo", {})
    fig.suptitle(f"{TITLE_SLO} (sweep over {key}; SLO: TTFT ≤ {slo.get('ttft_s', '?')} s, "
                 f"TPOT ≤ {slo.get('tpot_s', '?')} s)")
    return fig


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
        ax_good.plot(x, [p["goodput_requests_per_s"] for p in probes], "o-", label="goodput")
    ax_good.plot(x, [p["attainment"] * p["rate_per_s"] for p in probes], "s:", linewidth=1,
                 color="0.4", label="rate × attainment")
    _rate_axes(ax_att, ax_good, "arrival rate (requests/s)")
    ax_good.set_title("requests meeting the SLO per second of offered load")
    fig.suptitle(f"{TITLE_SLO} (goodput search, {len(probes)} probes)")
    return fig


def _rate_axes(ax_att: Any, ax_good: Any, xlabel: str) -> None:
    ax_att.set_xlabel(xlabel)
    ax_att.set_ylabel("SLO attainment (% of requests)")
    ax_att.set_ylim(-2, 102)
    ax_att.set_title("SLO attainment")
    ax_good.set_xlabel(xlabel)
    ax_good.set_ylabel("requests/s")
    ax_good.set_title("goodput (requests meeting the SLO) and throughput")
    for ax in (ax_att, ax_good):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)


def utilization(runs: Sequence[RunData]) -> Figure | None:
    """One panel per run: GPU busy share (solid) and KV-cache use (dashed) per pool over
    simulated time; the whole cluster when the summary has no per-pool timelines."""
    runs = thin([r for r in runs if _timelines(r)], MAX_PANELS)
    if not runs:
        return None
    ncols = min(3, len(runs))
    nrows = -(-len(runs) // ncols)
    fig = Figure(figsize=(4.6 * ncols + 0.6, 3.8 * nrows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    for ax, run in zip(axes, runs, strict=False):
        series = _timelines(run)
        for color, (name, tl) in zip(colors(len(series)), series, strict=True):
            t = tl["bin_start_s"]
            prefix = f"{name}: " if len(series) > 1 else ""
            ax.plot(t, [100 * v for v in tl["busy_fraction"]], "-", color=color,
                    label=f"{prefix}GPU busy", linewidth=1.3)
            if tl.get("kv_used_fraction"):
                ax.plot(t, [100 * v for v in tl["kv_used_fraction"]], "--", color=color,
                        label=f"{prefix}KV cache used", linewidth=1.3)
        ax.set_title(run.label, fontsize=9)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("use (%)")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
        # Below the panel: busy and KV lines fill the whole height, any inside spot hides one.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2,
                  frameon=False)
    for ax in axes[len(runs):]:
        ax.set_visible(False)
    fig.suptitle(TITLE_UTIL + (" (per pool)" if any(r.summary.get("pools") for r in runs)
                               else " (whole cluster)"))
    return fig


def _timelines(run: RunData) -> list[tuple[str, dict[str, Any]]]:
    """(pool name, timeline) pairs with data; the cluster timeline when there are no pools."""
    pools = run.summary.get("pools")
    out = []
    if isinstance(pools, list):
        for i, p in enumerate(pools):
            tl = p.get("timeline") if isinstance(p, dict) else None
            if _has_bins(tl):
                label = str(p.get("name", f"pool {i}"))
                if p.get("gpu"):
                    label += f" ({p.get('num_replicas', '?')}x {p['gpu']}"
                    label += f", {p['role']})" if p.get("role") else ")"
                out.append((label, tl))
    if not out and _has_bins(run.summary.get("timeline")):
        out.append(("cluster", run.summary["timeline"]))
    return out


def _has_bins(tl: Any) -> bool:
    return (isinstance(tl, dict) and bool(tl.get("bin_start_s"))
            and len(tl.get("busy_fraction", ())) == len(tl["bin_start_s"]))


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
