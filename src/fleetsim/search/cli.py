"""``fleetsim goodput``, ``fleetsim slo-scale`` and ``fleetsim plan``.

The main CLI calls ``add_parser(subparsers)``; each command builds a config the way
``fleetsim run`` does (TOML file plus ``--set`` overrides) and prints a table or JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.errors import FleetsimInputError
from fleetsim.formatting import fmt_number as _fmt
from fleetsim.output import print_table, progress_bar
from fleetsim.results import add_force_flag

DEFAULT_PLAN_GPUS = "h100,a100,h200"
EXIT_NOTHING_FEASIBLE = 1
PLOT_SUFFIXES = (".png", ".pdf", ".svg")
MAX_PLAN_GPUS = 256


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (optional)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set workload.max_requests=1000")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _search_flags(p: argparse.ArgumentParser, tol: float, max_runs: int) -> None:
    p.add_argument("--target", type=float, default=0.9,
                   help="share of requests that must meet the SLO (default 0.9)")
    p.add_argument("--tol", type=float, default=tol,
                   help=f"relative tolerance of the rate (default {tol:g})")
    p.add_argument("--max-runs", type=int, default=max_runs,
                   help=f"most simulations per search (default {max_runs})")


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``goodput``, ``slo-scale`` and ``plan``."""
    p = subparsers.add_parser(
        "goodput", help="highest arrival rate at which --target of requests meet the SLO")
    _common(p)
    _search_flags(p, tol=0.05, max_runs=20)
    p.add_argument("--min-rate", type=float, default=None, help="lowest rate to try (req/s)")
    p.add_argument("--max-rate", type=float, default=None, help="highest rate to try (req/s)")
    p.set_defaults(handler=cmd_goodput)

    p = subparsers.add_parser(
        "slo-scale", help="ReqX SLO scale: latency / standalone latency at percentile X")
    _common(p)
    p.add_argument("--pct", type=float, nargs="+", action="extend", default=None,
                   help="percentiles X, as --pct 95 99 or --pct 95 --pct 99 (default 90 95 99)")
    p.set_defaults(handler=cmd_slo_scale)

    p = subparsers.add_parser(
        "plan", help="cost-vs-goodput Pareto front over cluster shapes")
    _common(p)
    _search_flags(p, tol=0.1, max_runs=8)
    p.add_argument("--gpus", default=DEFAULT_PLAN_GPUS,
                   help=f"comma-separated GPU types (default {DEFAULT_PLAN_GPUS})")
    p.add_argument("--max-gpus", type=int, default=None,
                   help="most GPUs per shape (default 4, or --total-gpus)")
    p.add_argument("--total-gpus", type=int, default=None,
                   help="GPU budget (AIConfigurator's --total_gpus): shapes up to it, and how "
                        "many copies of each it holds")
    p.add_argument("--target-rate", type=float, default=None, metavar="REQ_PER_S",
                   help="request rate to serve: GPUs each shape needs for it")
    p.add_argument("--tp", default="1", help="comma-separated TP degrees (default 1)")
    p.add_argument("--pp", default="1", help="comma-separated pipeline-parallel degrees, e.g. "
                   "1,2 (default 1): a replica is tp x pp GPUs, across nodes past one")
    p.add_argument("--quantization", default=None, metavar="MODE[,MODE...]",
                   help="the quantization axis: each shape once per mode, e.g. bf16,fp8 "
                        "(bf16: the checkpoint's own dtype; fp8, fp8_block, int4_wo, nvfp4, "
                        "...); modes a GPU lacks are skipped with a note (default: the "
                        "config's quantization)")
    p.add_argument("--dp-attention", default=None, metavar="N[,N...]",
                   help="the wide-EP axis (MoE models): replicas of N attention ranks of tp "
                        "GPUs with the experts over all N x tp, e.g. 1,8,16 (1: the plain "
                        "layouts; default: the config's dp_attention); layouts run would "
                        "refuse are skipped with a note")
    p.add_argument("--pd", action="store_true",
                   help="also try prefill/decode pools (1P1D, 1P2D, 2P1D, across GPU types)")
    p.add_argument("--speculative", nargs="?", const="config", default=None,
                   metavar="METHOD:K[,...]",
                   help="the speculative on/off axis: each shape without speculation and with "
                        "each METHOD:K (eagle3:3, mtp:1, ...; acceptance defaults per method, "
                        "docs/engine.md), or, with no value, with the config's "
                        "engine.speculative")
    p.add_argument("--requests-per-gpu", type=int, default=1000,
                   help="cut the workload to N x GPUs requests per probe when the config "
                        "sets neither max_requests nor duration_s (default 1000; 0: no cut)")
    p.add_argument("--plot", metavar="PATH", default=None, help="write a cost-vs-goodput PNG")
    p.add_argument("--out", metavar="DIR", default=None, help="write DIR/plan.json")
    add_force_flag(p)
    p.set_defaults(handler=cmd_plan)


# ---- goodput ------------------------------------------------------------------------------
def cmd_goodput(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config
    from fleetsim.search.goodput import (
        check_search_args,
        check_slo_reachable,
        goodput_search,
        goodput_to_dict,
    )

    check_search_args(args.target, args.min_rate, args.max_rate, args.tol, args.max_runs)
    config = load_config(args.config, args.overrides)
    check_slo_reachable(config, args.target)
    err_console = Console(stderr=True)

    def on_probe(rate_per_s: float, attainment: float) -> None:
        if err_console.is_terminal and not args.json:
            err_console.print(f"  {rate_per_s:.3f} req/s: {100 * attainment:.1f}% met")

    result = goodput_to_dict(goodput_search(
        config, target=args.target, min_rate_per_s=args.min_rate,
        max_rate_per_s=args.max_rate, rel_tol=args.tol, max_runs=args.max_runs,
        on_probe=on_probe))
    if args.json:
        print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
        return 0
    table = Table(title=f"goodput search: {100 * args.target:g}% within TTFT<="
                  f"{config.slo.ttft_s:g}s, TPOT<={config.slo.tpot_s:g}s")
    for col in ("#", "rate (req/s)", "attainment", "TTFT ok", "TPOT ok", "met"):
        table.add_column(col, justify="right")
    for i, p in enumerate(result["probes"], 1):
        table.add_row(str(i), f"{p['rate_per_s']:.3f}", f"{100 * p['attainment']:.1f}%",
                      f"{100 * p['ttft_attainment']:.1f}%", f"{100 * p['tpot_attainment']:.1f}%",
                      "yes" if p["passed"] else "no")
    print_table(table)
    for line in goodput_lines(result):
        print(line)
    return 0


def goodput_lines(r: dict[str, Any]) -> list[str]:
    """The answer in words, with the caveats the search found."""
    rate = r["goodput_requests_per_s"]
    if rate is None:
        lines = ["goodput: no probed rate met the target"]
    else:
        fail = r["lowest_failing_rate_per_s"]
        fail_text = ("no rate failed" if fail is None
                     else f"lowest failing rate {_fmt(fail)} req/s")
        met = 100 * r["attainment_at_goodput"]
        lines = [f"goodput: {rate:.3f} req/s, the highest rate at which --target of requests "
                 f"meet the SLO, by search over rates (attainment {met:.1f}%"
                 f"; {fail_text}; {r['num_runs']} runs)"]
        lines.append(f"cost: ${r['usd_per_hour']:.2f}/hour for {r['num_gpus']} GPU(s), "
                     f"${_fmt(r['usd_per_million_tokens'])}/M tokens, "
                     f"${_fmt(r['usd_per_million_output_tokens'])}/M output tokens at that rate")
    notes = {
        "max_runs": "stopped at --max-runs before reaching --tol; raise --max-runs",
        "below_min_rate": "fails even at --min-rate",
        "at_max_rate": "meets the target at --max-rate: goodput is at least that",
    }
    if r["status"] in notes:
        lines.append(f"note: {notes[r['status']]}")
    if not r["monotone"]:
        pairs = ", ".join(f"{v['failing_rate_per_s']:.3f} failed below "
                          f"{v['passing_rate_per_s']:.3f}" for v in r["monotonicity_violations"])
        lines.append(f"note: attainment is not monotone in the rate ({pairs}); goodput is "
                     f"the highest passing rate below the lowest failing one")
    return lines


# ---- slo-scale ----------------------------------------------------------------------------
def cmd_slo_scale(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config
    from fleetsim.search.slo_scale import slo_scales

    pcts = tuple(dict.fromkeys(args.pct or (90.0, 95.0, 99.0)))
    for pct in pcts:
        if not 0 < pct <= 100:
            raise FleetsimInputError("--pct", pct, "must be a percentile in (0, 100], e.g. 95")
    config = load_config(args.config, args.overrides)
    result = slo_scales(config, pcts)
    if args.json:
        print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
        return 0
    table = Table(title=f"ReqX SLO scale — {result['model']}, {result['workload']}")
    table.add_column("X")
    table.add_column("scale (latency / standalone)", justify="right")
    for key, value in result["slo_scale"].items():
        table.add_row(key.replace("req", "Req"), "inf (unfinished)" if value is None
                      else f"{value:.3f}")
    table.caption = (f"{result['num_finished']:,} of {result['num_requests']:,} requests "
                     f"finished; median E2E {_fmt(result['e2e_p50_s'])} s vs standalone "
                     f"{_fmt(result['standalone_e2e_p50_s'])} s")
    print_table(table)
    return 0


# ---- plan ---------------------------------------------------------------------------------
def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise FleetsimInputError(flag, text, "give comma-separated integers, e.g. 1,2,4") from None
    if not values or min(values) < 1:
        raise FleetsimInputError(flag, text, "give comma-separated integers >= 1, e.g. 1,2,4")
    return sorted(set(values))


def _speculative_axis(text: str | None, config: Any) -> list[Any]:
    """``--speculative``'s settings to try: none given, the config's own; otherwise off plus
    the config's engine.speculative (no value) or each METHOD:K."""
    from fleetsim.models.speculative import SpeculativeConfig

    own = config.engine.speculative
    if text is None:
        return [own]
    if text == "config":
        if own is None:
            raise FleetsimInputError("--speculative", "(no value)", "the config sets no "
                                     "engine.speculative; give METHOD:K, e.g. eagle3:3")
        return [None, own]
    axis: list[Any] = [None]
    for item in (t.strip() for t in text.split(",") if t.strip()):
        method, sep, k = item.partition(":")
        if not sep or not k.strip().isdigit():
            raise FleetsimInputError("--speculative", item, "write METHOD:K, e.g. eagle3:3")
        method = method.strip()
        # the config's draft checkpoint serves the same method at any k
        draft = own.draft_model if own is not None and own.method == method else None
        try:
            axis.append(SpeculativeConfig(method=method, num_speculative_tokens=int(k),
                                          draft_model=draft))
        except ValueError as err:
            raise FleetsimInputError("--speculative", item, str(err)) from None
    return axis


def _quantization_axis(text: str | None, shapes: list[Any], config: Any
                       ) -> tuple[list[Any], list[str]]:
    """``--quantization``: every shape once per mode its GPUs run, and the skip notes; none
    given, the shapes as they are (each with the config's own quantization)."""
    if text is None:
        return shapes, []
    from fleetsim.models import get_model
    from fleetsim.search.quant_axis import parse_quantization_axis, with_quantization

    model = get_model(config.model)
    modes = parse_quantization_axis(text, model)
    out, skipped = with_quantization(shapes, modes, model, config.hardware.catalog)
    if not out:
        raise FleetsimInputError("--quantization", text, "no GPU of --gpus runs "
                                 f"{'/'.join(modes)} ({'; '.join(skipped)}); add bf16 or "
                                 "a GPU that does (fleetsim gpus lists each GPU's modes)")
    return out, skipped


def _smallest_replica(tps: list[int], pps: list[int], dps: list[int]) -> int:
    """GPUs of the smallest replica the axes allow (wide EP runs with pp = 1 only)."""
    plain = tps[0] * pps[0] if 1 in dps else None
    wide = tps[0] * min((d for d in dps if d > 1), default=0) or None
    return min(x for x in (plain, wide) if x is not None)


def cmd_plan(args: argparse.Namespace) -> int:
    from fleetsim.config import load_config
    from fleetsim.results import StagedFolder, check_out_dir, check_out_file
    from fleetsim.search.dp_axis import parse_dp_attention_axis, servable_wide_ep
    from fleetsim.search.goodput import check_search_args
    from fleetsim.search.plan import enumerate_shapes, plan, plan_to_dict, verify_picks

    check_search_args(args.target, None, None, args.tol, args.max_runs)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if not gpus:
        raise FleetsimInputError("--gpus", args.gpus, "name at least one GPU, e.g. h100,a100")
    tps = _int_list("--tp", args.tp)
    pps = _int_list("--pp", args.pp)
    if args.total_gpus is not None and not 1 <= args.total_gpus <= MAX_PLAN_GPUS:
        raise FleetsimInputError("--total-gpus", args.total_gpus,
                                 f"must be in [1, {MAX_PLAN_GPUS}]")
    if args.target_rate is not None and not (math.isfinite(args.target_rate)
                                             and args.target_rate > 0):
        raise FleetsimInputError("--target-rate", args.target_rate, "requests per second > 0")
    if args.max_gpus is None:
        args.max_gpus = args.total_gpus or 4
    elif args.total_gpus is not None and args.max_gpus > args.total_gpus:
        raise FleetsimInputError("--max-gpus", args.max_gpus, f"exceeds --total-gpus "
                                 f"{args.total_gpus}; lower it or drop it")
    if args.max_gpus < 1:
        raise FleetsimInputError("--max-gpus", args.max_gpus, "must be >= 1")
    if args.max_gpus > MAX_PLAN_GPUS:
        raise FleetsimInputError("--max-gpus", args.max_gpus, f"plan shapes of at most "
                                 f"{MAX_PLAN_GPUS} GPUs (every shape is a goodput search)")
    if args.requests_per_gpu < 0:
        raise FleetsimInputError("--requests-per-gpu", args.requests_per_gpu, "must be >= 0")
    out = Path(args.out) if args.out else None
    if out is not None:
        check_out_dir(out, force=args.force)
    if args.plot:
        if Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
            raise FleetsimInputError("--plot", args.plot, "give a .png, .pdf or .svg path")
        check_out_file(Path(args.plot), "--plot")
    config = load_config(args.config, args.overrides)
    dps = parse_dp_attention_axis(args.dp_attention, config)
    dp_flag = "--dp-attention" if args.dp_attention is not None else "dp_attention"
    spec_axis = _speculative_axis(args.speculative, config)
    if 1 not in dps and None not in spec_axis:
        # wide-EP shapes run without speculation (not priced together): nothing would be left
        raise FleetsimInputError(dp_flag, dps[0], "wide-EP shapes run without speculative "
                                 "decoding; unset engine.speculative, or add --speculative "
                                 "to try shapes without it")
    try:
        shapes = enumerate_shapes(gpus, tps, args.max_gpus, pd=args.pd,
                                  catalog=config.hardware.catalog, pps=pps,
                                  speculative=spec_axis, dp_attention=dps)
    except FleetsimInputError as err:
        raise FleetsimInputError("--gpus", err.value, err.fix) from None
    if not shapes:
        raise FleetsimInputError("--max-gpus", args.max_gpus,
                                 f"no shape fits: the smallest replica (--tp x --pp, or x "
                                 f"--dp-attention) is {_smallest_replica(tps, pps, dps)} "
                                 f"GPUs; raise --max-gpus to at least that")
    shapes, skipped = _quantization_axis(args.quantization, shapes, config)
    shapes, wide_skipped = servable_wide_ep(shapes, config)
    skipped += wide_skipped
    if not shapes:
        raise FleetsimInputError(dp_flag, args.dp_attention or dps[0], "no wide-EP "
                                 f"layout runs ({'; '.join(wide_skipped)}); add 1 or other "
                                 "values, --tp or --gpus")
    err_console = Console(stderr=True)
    show = err_console.is_terminal and not args.json
    bar = progress_bar(err_console, "plan") if show else None
    task = bar.add_task("plan", total=len(shapes), note="") if bar is not None else None
    done = [0]

    def on_point(point: Any) -> None:
        done[0] += 1
        if bar is not None:
            rate = point.goodput_rate_per_s
            bar.console.print(f"  [{done[0]}/{len(shapes)}] {point.shape.name}: " + (
                "infeasible" if point.goodput is None else f"{_fmt(rate)} req/s"))
            bar.update(task, advance=1, note=point.shape.name)

    if show:
        err_console.print(f"planning {len(shapes)} cluster shapes (one goodput search each)")
    with bar if bar is not None else contextlib.nullcontext():
        points = plan(config, shapes, target=args.target, rel_tol=args.tol,
                      max_runs=args.max_runs, requests_per_gpu=args.requests_per_gpu or None,
                      on_point=on_point)
    result = plan_to_dict(points, target=args.target,
                          requests_per_gpu=args.requests_per_gpu or None, config=config,
                          total_gpus=args.total_gpus, target_rate_per_s=args.target_rate)
    if skipped:
        result["skipped"] = skipped

    def on_verified(row: dict[str, Any]) -> None:
        if show:
            v = row["verified"]
            err_console.print(f"  verified {row['shape']} at {_fmt(v['rate_per_s'])} req/s on "
                              f"{v['num_requests']:,} requests: {100 * v['attainment']:.1f}% "
                              f"met")

    verify_picks(config, points, result, args.requests_per_gpu or None, on_verified)
    if not result["front"]:  # nothing to plan with: say so, and keep earlier results
        if args.json:
            print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
        else:
            _print_plan(result, config)
        print("fleetsim: no shape meets the target at any rate tried (see above); nothing "
              "written. Try other --gpus, a larger --max-gpus or --tp, or a looser SLO",
              file=sys.stderr)
        return EXIT_NOTHING_FEASIBLE
    if out is not None:
        with StagedFolder(out) as tmp:
            (tmp / "plan.json").write_text(
                json.dumps(_json_safe(result), indent=2, allow_nan=False) + "\n")
    if args.plot:
        from fleetsim.search.plot import plot_plan

        plot_plan(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(_json_safe(result), indent=2, allow_nan=False))
        for line in plan_caveats(result) + result.get("skipped", []):
            print(f"fleetsim: {line}", file=sys.stderr)
    else:
        _print_plan(result, config)
    return 0


def _print_plan(result: dict[str, Any], config: Any) -> None:
    rows = result["points"]
    table = Table(title=f"Pareto front: goodput ({100 * result['target']:g}% within TTFT<="
                  f"{config.slo.ttft_s:g}s, TPOT<={config.slo.tpot_s:g}s) per $/hour")
    table.add_column("shape", no_wrap=True)
    verified = any("verified" in rows[i] for i in result["front"])
    cols = ("GPUs", "goodput (req/s)", "$/hour", "$/M tokens", "$/M output tok")
    for col in cols + (("SLO met on the whole workload",) if verified else ()):
        table.add_column(col, justify="right")
    for i in result["front"]:
        r = rows[i]
        cells = [r["shape"], str(r["num_gpus"]), _fmt(r["goodput_requests_per_s"]),
                 f"{r['usd_per_hour']:.2f}", _fmt(r["usd_per_million_tokens"]),
                 _fmt(r["usd_per_million_output_tokens"])]
        if verified:
            v = r.get("verified")
            cells.append("-" if v is None else f"{100 * v['attainment']:.1f}%"
                         + ("" if v["met"] else " (caveat below)"))
        table.add_row(*cells)
    num_feasible = sum(1 for r in rows if "infeasible" not in r)
    table.caption = (f"{num_feasible} feasible shape(s) searched, "
                     f"{len(result['front'])} on the front")
    print_table(table)
    _print_per_user_front(result)
    for line in plan_caveats(result) + result.get("skipped", []):
        print(line)
    for r in rows:
        if "infeasible" in r:
            print(f"infeasible: {r['shape']}: {r['infeasible']}")
        elif r["goodput_requests_per_s"] is None:
            print(f"no goodput: {r['shape']} misses the SLO at every rate tried")


def plan_caveats(result: dict[str, Any]) -> list[str]:
    """One line per pick whose goodput, searched on a cut workload, missed the target when
    run at that rate on the whole workload (``verified``)."""
    out = []
    for r in result["points"]:
        v = r.get("verified")
        if v is None or v["met"]:
            continue
        out.append(
            f"caveat: {r['shape']}: {_fmt(r['goodput_requests_per_s'])} req/s was searched on "
            f"{result['requests_per_gpu']:,} requests per GPU; run at that rate on the whole "
            f"workload ({v['num_requests']:,} requests) {100 * v['attainment']:.1f}% meet the "
            f"SLO, under the {100 * result['target']:g}% target: a short slice overstates "
            f"goodput (raise --requests-per-gpu, 0 for the whole workload, or check with "
            f"fleetsim goodput)")
    drafts = sorted({r["speculative"]["method"] for r in result["points"]
                     if r.get("speculative", {}).get("method") in ("eagle", "eagle3")
                     and '"model"' not in " ".join(r.get("vllm_serve", ()))})
    if drafts:
        out.append(f"caveat: vLLM's {'/'.join(drafts)} needs the draft checkpoint in "
                   f"--speculative-config (\"model\": ...); set engine.speculative.draft_model "
                   f"to print it")
    return out


def _print_per_user_front(result: dict[str, Any]) -> None:
    """AIConfigurator's view: tokens/s per GPU against tokens/s per user, with the budget,
    the target rate and the vllm serve lines."""
    rows, front = result["points"], result["per_user_front"]
    if not front:
        return
    total, rate = result["total_gpus"], result["target_rate_per_s"]
    table = Table(title="tokens/s per GPU vs tokens/s per user at goodput (AIConfigurator's "
                  "Pareto front)")
    cols = ["shape", "GPUs", "output tok/s/GPU", "tok/s/user", "goodput (req/s)"]
    if total is not None:
        cols += [f"copies in {total} GPUs", "total req/s"]
    if rate is not None:
        cols += [f"GPUs for {_fmt(rate)} req/s"]
    for i, col in enumerate(cols):
        table.add_column(col, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for i in front:
        r = rows[i]
        cells = [r["shape"], str(r["num_gpus"]), _fmt(r["output_tokens_per_s_per_gpu"]),
                 _fmt(r["tokens_per_s_per_user"]), _fmt(r["goodput_requests_per_s"])]
        if total is not None:
            cells += [str(r["copies_in_total_gpus"]), _fmt(r["total_goodput_requests_per_s"])]
        if rate is not None:
            need = r["gpus_for_target_rate"]
            fits = r.get("target_rate_fits_total_gpus")
            cells += [("-" if need is None else str(need)) + (" (over budget)" if fits is False
                                                               else "")]
        table.add_row(*cells)
    print_table(table)
    for i in front:
        print(f"{rows[i]['shape']}:")
        for line in rows[i].get("vllm_serve", []):
            print(f"  {line}")


def _json_safe(obj: Any) -> Any:
    """Non-finite floats become null (JSON has no inf or nan)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    return obj
