"""One self-contained HTML page: figures as base64 PNG data URIs, tables, no external links.

A header (model, hardware, trace, SLO, fleetsim versions, dates), then sections: summary
tables, latency CDFs, SLO attainment vs offered load, queue length and batch size over
time, Pareto front. A section with nothing to draw says why instead of a figure.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterable
from html import escape
from typing import Any

from matplotlib.figure import Figure

from fleetsim import __version__
from fleetsim.formatting import hardware_label
from fleetsim.report import figures as F
from fleetsim.report.layout import Layout, fit, layout, workload_mix
from fleetsim.report.load import ReportInputs, RunData

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif;
       margin: 2em auto; max-width: 1500px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em;
     margin-top: 1.8em; }
p.src { color: #666; margin-top: 0; }
p.note { color: #777; font-style: italic; }
p.warn { color: #8a4b00; background: #fff6e5; padding: 0.5em 0.8em;
         border-left: 4px solid #e69500; }
table.meta { font-size: 0.95em; } table.meta th { width: 9em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
div.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.8em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
tr.failed td { background: #fff0f0; }
tr.overloaded td { background: #fff6e5; }
"""

DPI = 110


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


def img(fig: Figure, alt: str, caption: str = "") -> str:
    data = base64.b64encode(figure_png(fig)).decode("ascii")
    cap = f"<figcaption>{escape(caption)}</figcaption>" if caption else ""
    return (f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{data}">'
            f"{cap}</figure>")


NUM_SECTIONS = 5
"""Sections ``render`` draws, one ``progress`` call each."""


def render(inputs: ReportInputs, made_on: str | None = None,
           progress: Callable[[str], None] | None = None) -> str:
    """The whole page for what ``load_inputs`` found; ``made_on`` (a date the caller read
    from the clock) goes in the header; ``progress`` (optional) is called with each
    section's title once it is drawn."""
    done = progress or (lambda title: None)
    parts = [f"<h1>fleetsim report</h1><p class=src>{escape(str(inputs.path))}: "
             f"{escape(describe(inputs))}</p>", header(inputs, made_on)]
    parts.append(section("Summary", summary_tables(inputs)))
    done("Summary")
    parts.append(section(F.TITLE_CDF, list(_per_source(inputs, F.latency_cdfs, F.TITLE_CDF)),
                         "no requests.csv with TTFT/TPOT/E2E columns found"))
    done(F.TITLE_CDF)
    parts.append(section(F.TITLE_SLO, list(_slo_figures(inputs)),
                         "needs a sweep over workload.rate_scale or workload.rate_per_s, or a "
                         "goodput search"))
    done(F.TITLE_SLO)
    parts.append(section(F.TITLE_QUEUE,
                         list(_per_source(inputs, F.queue_over_time, F.TITLE_QUEUE)),
                         "no timeline with queue columns (mean_waiting, mean_running) in the "
                         "summaries"))
    done(F.TITLE_QUEUE)
    parts.append(section(F.TITLE_PARETO, list(pareto_figures(inputs)),
                         "needs a capacity plan (plan.json), or sweep points or several runs "
                         "whose summaries report cost"))
    done(F.TITLE_PARETO)
    body = "\n".join(parts)
    return (f"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>fleetsim report: {escape(inputs.path.name or str(inputs.path))}</title>"
            f"<style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


def header(inputs: ReportInputs, made_on: str | None) -> str:
    """What the figures are of: model, hardware, trace, SLO, the fleetsim that produced the
    results and the one that drew them, and when."""
    runs = inputs.all_runs()

    def distinct(values: Iterable[Any]) -> str:
        seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "")))
        if not seen:
            return "not recorded"
        more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
        return ", ".join(seen[:4]) + more

    slos = [r.summary.get("slo") or {} for r in runs]
    rows = [
        ("model", distinct(r.summary.get("model") or (r.config or {}).get("model")
                           for r in runs)),
        ("hardware", distinct(_hardware(r) for r in runs)),
        ("trace", distinct(r.summary.get("workload") for r in runs)),
        ("SLO", distinct(f"TTFT ≤ {s['ttft_s']:g} s, TPOT ≤ {s['tpot_s']:g} s"
                         for s in slos if "ttft_s" in s and "tpot_s" in s)),
        ("results by", distinct(f"fleetsim {r.summary['engine_build']}" for r in runs
                                if r.summary.get("engine_build"))),
        ("results written", distinct([_written_on(inputs)])),
        ("report by", f"fleetsim {__version__}" + (f", {made_on}" if made_on else "")),
    ]
    cells = "".join(f"<tr><th class=l>{escape(k)}</th><td class=l>{escape(v)}</td></tr>"
                    for k, v in rows)
    return f"<table class=meta>{cells}</table>"


def _hardware(run: RunData) -> str | None:
    s = run.summary
    if not s.get("gpu"):
        return None
    return hardware_label(s)


def _written_on(inputs: ReportInputs) -> str | None:
    """The newest results file's modification date (UTC): when the results were made."""
    from datetime import UTC, datetime

    files = ([r.path / "summary.json" for r in inputs.all_runs()]
             + [s.path / "sweep.json" for s in inputs.sweeps]
             + [p.path for p in inputs.plans] + [s.path for s in inputs.searches])
    stamps = [f.stat().st_mtime for f in files if f.is_file()]
    if not stamps:
        return None
    return datetime.fromtimestamp(max(stamps), UTC).strftime("%Y-%m-%d %H:%M UTC")


def describe(inputs: ReportInputs) -> str:
    bits = []
    if inputs.runs:
        bits.append(f"{len(inputs.runs)} run{'s' * (len(inputs.runs) > 1)}")
    for s in inputs.sweeps:
        failed = sum(r.get("status") != "ok" for r in s.rows)
        bits.append(f"sweep of {len(s.rows)} points over {' × '.join(s.keys) or 'no grid'}"
                    f" ({len(s.rows) - failed} ok, {failed} failed)")
    bits += [f"capacity plan {p.path.name} ({len(p.points)} feasible shapes)"
             for p in inputs.plans]
    bits += [f"goodput search {s.path.name} ({len(s.probes)} probes)" for s in inputs.searches]
    return "; ".join(bits)


def section(title: str, items: list[str], missing: str = "") -> str:
    content = "\n".join(items) if items else f"<p class=note>Not shown: {escape(missing)}.</p>"
    return f"<section><h2>{escape(title)}</h2>\n{content}\n</section>"


def sources(inputs: ReportInputs) -> list[tuple[str, list[RunData], tuple[str, ...]]]:
    """(name, runs, grid keys): the plain runs together, then each sweep on its own (a
    sweep's points share a grid; plain runs are told apart by their labels)."""
    out: list[tuple[str, list[RunData], tuple[str, ...]]] = (
        [("runs", inputs.runs, ())] if inputs.runs else [])
    out += [(f"sweep {s.path.name}", s.runs, s.keys) for s in inputs.sweeps if s.runs]
    return out


def _per_source(inputs: ReportInputs, draw: Callable[[Layout], Figure | None],
                title: str) -> Iterable[str]:
    many = len(sources(inputs)) > 1
    for name, runs, keys in sources(inputs):
        lay, note = fit(layout(runs, keys), F.MAX_FACETS, F.MAX_CURVES)
        fig = draw(lay)
        if fig:
            yield img(fig, title, " ".join(
                b for b in ((f"{name}." if many else ""), _layout_caption(lay), note) if b))


def _layout_caption(lay: Layout) -> str:
    if lay.colour_key is None:
        return ""
    panels = {f.split("=", 1)[0] for label, _ in lay.facets for f in label.split(", ") if f}
    split = f"; panels by {', '.join(sorted(panels))}" if panels else ""
    return f"Colour: {lay.colour_key}{split}."


def _slo_figures(inputs: ReportInputs) -> Iterable[str]:
    for sweep in inputs.sweeps:
        key = F.rate_key(sweep)
        if key is None:
            continue
        lay, note = fit(layout(sweep.runs, sweep.keys, x_key=key), F.MAX_FACETS, F.MAX_CURVES)
        fig = F.slo_vs_rate_sweep(sweep, lay)
        if fig:
            x = ("x: offered load, arrivals over their span (the sweep's "
                 f"{key} sets it); dashed line: the {100 * F.DEFAULT_TARGET:g}% attainment "
                 "target that fleetsim goodput and plan use by default.")
            yield img(fig, F.TITLE_SLO, " ".join(b for b in (x, _layout_caption(lay), note)
                                                  if b))
    for search in inputs.searches:
        fig = F.slo_vs_rate_search(search)
        if fig:
            yield img(fig, F.TITLE_SLO, f"from {search.path.name}")


MEASURED_GOODPUT = ("SLO-meeting rate as measured at the load each run was given, not "
                    "searched for; fleetsim plan searches each shape's highest rate that "
                    "meets the SLO.")


def pareto_figures(inputs: ReportInputs) -> Iterable[str]:
    for plan in inputs.plans:
        fig = F.pareto_of_plan(plan)
        if fig:
            yield img(fig, F.TITLE_PARETO)
    for sweep in inputs.sweeps:
        key = F.rate_key(sweep)
        mixed = workload_mix(sweep.runs, ignore=[key] if key else [])
        if mixed:
            yield _refusal(f"sweep {sweep.path.name}", mixed)
            continue
        note = (f"each configuration at its best SLO-meeting rate over the swept {key}" if key
                else "each point's SLO-meeting rate at the load it was given")
        fig = F.pareto(F.pareto_points(sweep.runs, key), f"sweep {sweep.path.name}: {note}")
        if fig:
            yield img(fig, F.TITLE_PARETO, MEASURED_GOODPUT)
    if len(inputs.runs) > 1:
        mixed = workload_mix(inputs.runs)
        if mixed:
            yield _refusal(f"{len(inputs.runs)} runs", mixed)
            return
        fig = F.pareto(F.pareto_points(inputs.runs), f"{len(inputs.runs)} runs")
        if fig:
            yield img(fig, F.TITLE_PARETO, MEASURED_GOODPUT)


def _refusal(what: str, why: str) -> str:
    return (f"<p class=warn>No Pareto front for {escape(what)}: {escape(why)}. Compare "
            "configurations on one workload and SLO (sweep the configuration with the "
            "workload fixed).</p>")


# ---- tables ---------------------------------------------------------------------------
RUN_COLUMNS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("finished", ("num_finished",), "int"),
    ("unfinished", ("num_unfinished",), "int"),
    ("TTFT p50 (s)", ("ttft_s", "p50"), "num"),
    ("TTFT p99 (s)", ("ttft_s", "p99"), "num"),
    ("TPOT p50 (s)", ("tpot_s", "p50"), "num"),
    ("TPOT p99 (s)", ("tpot_s", "p99"), "num"),
    ("E2E p50 (s)", ("e2e_s", "p50"), "num"),
    ("E2E p99 (s)", ("e2e_s", "p99"), "num"),
    ("throughput (req/s)", ("throughput", "requests_per_s"), "num"),
    ("output tok/s", ("throughput", "output_tokens_per_s"), "num"),
    ("SLO attainment", ("slo", "attainment"), "pct"),
    ("goodput (req/s)", ("slo", "goodput_requests_per_s"), "num"),
    ("GPU busy", ("gpu_busy_fraction",), "pct"),
    ("KV used (mean)", ("kv_cache", "mean_used_fraction"), "pct"),
    ("$/hour", ("cost", "usd_per_hour"), "num"),
    ("$/M tokens", ("cost", "usd_per_million_tokens"), "num"),
)


def overload_warnings(inputs: ReportInputs) -> list[str]:
    """One warning paragraph per run or sweep point whose summary says it was overloaded
    (``summary["overload"]["warning"]``): its latencies are a growing queue's, not the
    service's."""
    named = [(r.label, r) for r in inputs.runs]
    for sweep in inputs.sweeps:
        values = {str(row.get("index")): row for row in sweep.rows}
        for r in sweep.runs:
            row = values.get(str(r.path.name), {})
            grid = ", ".join(f"{k}={row.get(k)}" for k in sweep.keys)
            named.append((f"sweep {sweep.path.name} point {r.path.name}"
                          + (f" ({grid})" if grid else ""), r))
    return [f"<p class=warn>{escape(label)}: {escape(str(warning))}</p>"
            for label, r in named if (warning := _overload_warning(r))]


def _overload_warning(run: RunData) -> str | None:
    overload = run.summary.get("overload")
    return overload.get("warning") if isinstance(overload, dict) else None


def summary_tables(inputs: ReportInputs) -> list[str]:
    out = overload_warnings(inputs)
    if inputs.runs:
        out.append(_runs_table(inputs.runs, [r.label for r in inputs.runs], "run"))
    for sweep in inputs.sweeps:
        out.append(f"<h3>sweep {escape(str(sweep.path))}</h3>")
        out.append(_sweep_table(sweep))
    runs = inputs.all_runs()
    pools = [(r.label, p) for r in runs for p in r.summary.get("pools") or []
             if isinstance(p, dict)]
    if pools:
        out.append("<h3>pools</h3>" + _pools_table(pools))
    out.extend(f"<h3>capacity plan {escape(p.path.name)}</h3>" + _plan_table(p)
               for p in inputs.plans)
    out.extend(f"<h3>goodput search {escape(s.path.name)}</h3>" + _search_table(s)
               for s in inputs.searches)
    return out


def _runs_table(runs: list[RunData], labels: list[str], first: str) -> str:
    cols = [c for c in RUN_COLUMNS if any(_get(r.summary, c[1]) is not None for r in runs)]
    head = f"<tr><th class=l>{escape(first)}</th>" + "".join(
        f"<th>{escape(c[0])}</th>" for c in cols) + "</tr>"
    rows = [f"<tr><td class=l>{escape(label)}</td>" + "".join(
        f"<td>{_cell(_get(r.summary, path), kind)}</td>" for _, path, kind in cols) + "</tr>"
        for r, label in zip(runs, labels, strict=True)]
    return "<div class=scroll><table>" + head + "".join(rows) + "</table></div>"


def _sweep_table(sweep: Any) -> str:
    by_index = {str(r.path.name): r for r in sweep.runs}
    cols = [c for c in RUN_COLUMNS if any(_get(r.summary, c[1]) is not None for r in sweep.runs)]
    head = ("<tr><th>#</th>" + "".join(f"<th class=l>{escape(k)}</th>" for k in sweep.keys)
            + "<th class=l>status</th>" + "".join(f"<th>{escape(c[0])}</th>" for c in cols)
            + "</tr>")
    rows = []
    for row in sweep.rows:
        keys = "".join(f"<td class=l>{escape(str(row.get(k)))}</td>" for k in sweep.keys)
        run = by_index.get(str(row.get("index")))
        if row.get("status") != "ok" or run is None:
            msg = escape(str(row.get("error") or "no results"))
            rows.append(f"<tr class=failed><td>{row.get('index')}</td>{keys}"
                        f"<td class=l colspan={len(cols) + 1}>failed: {msg}</td></tr>")
            continue
        cells = "".join(f"<td>{_cell(_get(run.summary, path), kind)}</td>"
                        for _, path, kind in cols)
        warning = _overload_warning(run)
        status = (f"<tr class=overloaded><td>{row.get('index')}</td>{keys}"
                  f"<td class=l title=\"{escape(warning)}\">overloaded</td>" if warning
                  else f"<tr><td>{row.get('index')}</td>{keys}<td class=l>ok</td>")
        rows.append(f"{status}{cells}</tr>")
    return "<div class=scroll><table>" + head + "".join(rows) + "</table></div>"


def _pools_table(pools: list[tuple[str, dict[str, Any]]]) -> str:
    head = ("<tr><th class=l>run</th><th class=l>pool</th><th class=l>GPU</th>"
            "<th class=l>role</th><th>replicas</th><th>TP</th><th>GPU busy</th>"
            "<th>KV used</th></tr>")
    rows = [f"<tr><td class=l>{escape(label)}</td><td class=l>{escape(str(p.get('name', '')))}"
            f"</td><td class=l>{escape(str(p.get('gpu', '')))}</td>"
            f"<td class=l>{escape(str(p.get('role', '')))}</td>"
            f"<td>{_cell(p.get('num_replicas'), 'int')}</td><td>{_cell(p.get('tp'), 'int')}</td>"
            f"<td>{_cell(p.get('busy_fraction'), 'pct')}</td>"
            f"<td>{_cell(p.get('kv_used_fraction'), 'pct')}</td></tr>" for label, p in pools]
    return "<div class=scroll><table>" + head + "".join(rows) + "</table></div>"


def _plan_table(plan: Any) -> str:
    """The plan's shapes by cost; with ``verified`` picks (``search.plan.verify_picks``), the
    attainment each reached on the whole workload at its goodput."""
    verified = any(isinstance(p.get("verified"), dict) for p in plan.points)
    head = ("<tr><th class=l>shape</th><th>GPUs</th><th>$/hour</th><th>goodput (req/s)</th>"
            "<th>$/M tokens</th><th class=l>Pareto front</th>"
            + ("<th>SLO met on the whole workload</th>" if verified else "") + "</tr>")
    points = sorted(plan.points, key=lambda p: p["usd_per_hour"])
    rows = []
    for p in points:
        v = p.get("verified") if isinstance(p.get("verified"), dict) else None
        check = "" if not verified else (
            "<td>–</td>" if v is None else
            f"<td>{_cell(v.get('attainment'), 'pct')}"
            f"{'' if v.get('met') else ' (under the target: the goodput is overstated)'}</td>")
        rows.append(f"<tr><td class=l>{escape(p['label'])}</td>"
                    f"<td>{_cell(p.get('num_gpus'), 'int')}</td>"
                    f"<td>{_cell(p['usd_per_hour'], 'num')}</td>"
                    f"<td>{_cell(p['goodput_requests_per_s'], 'num')}</td>"
                    f"<td>{_cell(p.get('usd_per_million_tokens'), 'num')}</td>"
                    f"<td class=l>{'yes' if p['on_front'] else ''}</td>{check}</tr>")
    return "<div class=scroll><table>" + head + "".join(rows) + "</table></div>"


def _search_table(search: Any) -> str:
    head = ("<tr><th>rate (req/s)</th><th>SLO attainment</th><th class=l>met target</th></tr>")
    rows = [f"<tr><td>{_cell(p['rate_per_s'], 'num')}</td><td>{_cell(p['attainment'], 'pct')}"
            f"</td><td class=l>{'yes' if p.get('passed') else 'no'}</td></tr>"
            for p in search.probes]
    answer = (f"<p>goodput: {_cell(search.goodput_requests_per_s, 'num')} req/s"
              f"{f' at target {100 * search.target:g}%' if search.target is not None else ''}"
              f"</p>")
    return answer + "<table>" + head + "".join(rows) + "</table>"


def _get(d: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def _cell(v: Any, kind: str) -> str:
    if v is None or isinstance(v, bool) or not isinstance(v, int | float):
        return "–" if v is None else escape(str(v))
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "int":
        return f"{int(v):,}"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
