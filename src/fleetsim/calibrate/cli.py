"""``fleetsim calibrate RESULTS...``: fit the per-step overhead and kernel speed of a
deployment to its own ``vllm bench serve`` results (or a CSV of step times), report the error
on held-back runs, and write a config that later runs use with ``fleetsim run CONFIG``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.output import add_format_flag, emit, output_format

DEFAULT_OUT = "calibration.toml"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``calibrate``."""
    p = subparsers.add_parser(
        "calibrate", help="fit step overhead and kernel speed to your vllm bench serve results")
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="`vllm bench serve --save-result` JSON files (or `fleetsim run "
                        "--vllm-json` ones), or one CSV of step times")
    p.add_argument("--config", default=None,
                   help="TOML config of the deployment (GPU, tp, engine limits)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set hardware.gpu=a100")
    p.add_argument("--holdout", type=int, default=None,
                   help="results held back from the fit to measure its error, the last ones "
                        "given (default: 1 of every 3 results, none below 3)")
    p.add_argument("--fit", default=",".join(_params()),
                   help="parameters to fit, comma-separated (others keep their defaults)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"config file to write (default {DEFAULT_OUT})")
    add_format_flag(p)
    p.set_defaults(handler=cmd_calibrate)


def _params() -> tuple[str, ...]:
    from fleetsim.calibrate.fit import PARAMS

    return PARAMS


def _parse_fit(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in _params()]
    if bad or not names:
        raise FleetsimInputError("--fit", text, f"choose from {', '.join(_params())}")
    return names


def cmd_calibrate(args: argparse.Namespace) -> int:
    from fleetsim.calibrate import fit
    from fleetsim.results import check_out_file, write_file

    fmt = output_format(args)
    names = _parse_fit(args.fit)
    out = Path(args.out)
    check_out_file(out, "--out")
    if len(args.results) == 1 and fit.is_csv(args.results[0]):
        report = _calibrate_steps(args, names)
    elif any(fit.is_csv(p) for p in args.results):
        raise FleetsimInputError("RESULTS", args.results, "give result JSONs or one CSV of "
                                 "step times, not both")
    else:
        report = _calibrate_bench(args, names)
    write_file(out, report["snippet"])
    emit(fmt, {k: v for k, v in report.items() if k != "snippet"}, lambda: _table(report))
    print(f"config written to {out} (use it with: fleetsim run {out})", file=sys.stderr)
    return 0


def _calibrate_bench(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    from fleetsim.calibrate import fit

    results = [fit.load_bench_result(p) for p in args.results]
    holdout = args.holdout if args.holdout is not None else len(results) // 3
    if not 0 <= holdout < len(results):
        raise FleetsimInputError("--holdout", holdout, f"must be in [0, {len(results) - 1}]: "
                                 "at least one result is needed to fit")
    base = fit.base_config(args.config, [*fit.model_override(results), *args.overrides])
    tty = sys.stderr.isatty()
    sim = fit.Simulator(base, on_run=(lambda n: print(f"\rcalibrate: {n} simulations", end="",
                                                      file=sys.stderr, flush=True))
                        if tty else None)
    train, held = results[:len(results) - holdout], results[len(results) - holdout:]
    params = fit.fit_bench_results(sim, train, names)
    rows = []
    for group, rs in (("fit", train), ("held back", held)):
        for r in rs:
            before = sim.predict(r, fit.DEFAULTS)
            after = sim.predict(r, params)
            rows.extend({"result": r.path, "set": group, "metric": m,
                         "measured": r.measured_ms[m],
                         "default_error_pct": 100 * (before[m] / r.measured_ms[m] - 1),
                         "fitted_error_pct": 100 * (after[m] / r.measured_ms[m] - 1)}
                        for m in fit.METRICS)
    print(("\n" if tty else "") + f"calibrate: {sim.num_runs} simulations of "
          f"{len(results)} results", file=sys.stderr)
    return _report(base([]), params, names, rows, held_label=[r.path for r in held],
                   fit_label=[r.path for r in train])


def _calibrate_steps(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    from fleetsim.calibrate import fit

    if names != list(fit.PARAMS):
        raise FleetsimInputError("--fit", args.fit, "a step-time CSV fits all three at once "
                                 "(least squares); drop --fit")
    path = args.results[0]
    rows = fit.load_step_csv(path)
    config = fit.base_config(args.config, args.overrides)([])
    kernels = fit.kernel_times_s(config, rows)
    # Every 5th step held back (all steps, if --holdout 0).
    held = np.zeros(len(rows), dtype=bool)
    if args.holdout != 0:
        held[4::5] = True
    params = fit.fit_step_rows(kernels[~held], rows[~held])
    out = []
    for group, mask in (("fit", ~held), ("held back", held)):
        if not mask.any():
            continue
        measured = rows[mask, 4]
        err = fit.predict_step_rows(kernels[mask], rows[mask], params) / measured - 1
        err0 = fit.predict_step_rows(kernels[mask], rows[mask], fit.DEFAULTS) / measured - 1
        out.append({"result": path, "set": group, "metric": f"step_time ({mask.sum()} steps, "
                    "mean |error|)", "measured": float(measured.mean() * 1e3),
                    "default_error_pct": float(100 * np.abs(err0).mean()),
                    "fitted_error_pct": float(100 * np.abs(err).mean())})
    return _report(config, params, list(fit.PARAMS), out,
                   held_label=[f"{path}: every 5th step"] if held.any() else [],
                   fit_label=[path])


def _report(config: Any, params: dict[str, float], names: list[str], rows: list[dict],
            held_label: list[str], fit_label: list[str]) -> dict[str, Any]:
    from fleetsim.calibrate.fit import snippet_toml

    held = [r for r in rows if r["set"] == "held back"]
    summary = (", ".join(f"{r['metric']} {r['fitted_error_pct']:+.1f}% (defaults "
                         f"{r['default_error_pct']:+.1f}%)" for r in held)
               if held else "none held back; errors are on the fitted results")
    notes = [f"fleetsim calibrate: fitted {', '.join(names)} to {', '.join(fit_label)}",
             f"held back: {', '.join(held_label) or 'none'}",
             f"error on held back: {summary}"]
    return {"model": config.model, "gpu": config.pools[0].gpu, "tp": config.pools[0].tp,
            "fitted": names, "params": params, "rows": rows,
            "snippet": snippet_toml(config, params, notes)}


def _table(report: dict[str, Any]) -> list[Table]:
    units = {"step_overhead_s": (1e3, "ms"), "step_overhead_per_seq_s": (1e6, "us"),
             "kernel_time_scale": (1.0, "x")}
    t1 = Table(title=f"calibrated: {report['model']} on {report['gpu']} (TP {report['tp']})")
    for col in ("parameter", "value", "fitted"):
        t1.add_column(col)
    for k, v in report["params"].items():
        scale, unit = units[k]
        t1.add_row(k, f"{v * scale:.4g} {unit}", "yes" if k in report["fitted"] else "default")
    t2 = Table(title="mean latency: measured vs predicted (default -> fitted parameters)")
    for col in ("result", "set", "metric", "measured ms", "default error", "fitted error"):
        t2.add_column(col)
    for r in report["rows"]:
        t2.add_row(r["result"], r["set"], r["metric"], f"{r['measured']:.4g}",
                   f"{r['default_error_pct']:+.1f}%", f"{r['fitted_error_pct']:+.1f}%")
    return [t1, t2]
