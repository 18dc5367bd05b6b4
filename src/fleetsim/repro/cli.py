"""``fleetsim repro list`` and ``fleetsim repro NAME``: rerun a paper's headline comparison."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fleetsim.formatting import fmt_number
from fleetsim.repro.pool import CoreTokens, SubRuns, idle_workers
from fleetsim.results import add_force_flag

# The scoreboard record of a source checkout (docs/scoreboard.json): its entries' wall times
# order ``repro all``'s start (longest first).
RECORD = Path(__file__).resolve().parents[3] / "docs" / "scoreboard.json"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "repro", help="rerun a research paper's headline comparison ('list' to see them)",
        description="Rerun a paper's comparison (its system and baselines, on its kind of "
                    "workload and loads) and print fleetsim's ratio next to the published one.")
    p.add_argument("name", help="a reproduction key, 'list', or 'all' (every entry: one "
                                "scoreboard)")
    p.add_argument("--quick", action="store_true",
                   help="a smaller slice: the same policies and code paths, in seconds")
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    p.add_argument("--out", help="results folder (default results/repro/NAME)")
    add_force_flag(p)
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override a config key in every run")
    p.add_argument("--workers", type=int, default=None,
                   help="processes at once (default: CPU count; 1 runs everything here): "
                        "one entry's independent simulations, or all's entries (an entry "
                        "that runs on while cores are idle spreads its simulations over "
                        "them)")
    p.add_argument("--ray", dest="ray_address", default=None, metavar="ADDRESS",
                   help="all: run entries as Ray tasks (local, auto or ray://HOST:PORT), as "
                        "fleetsim sweep does")
    p.add_argument("--record", metavar="FILE",
                   help="all: also write the scoreboard JSON to FILE (a full run only; "
                        "docs/scoreboard.json is the record the docs' table comes from)")
    p.set_defaults(handler=cmd_repro)


def cmd_repro(args: argparse.Namespace) -> int:
    from fleetsim.repro import REPRODUCTIONS, get_reproduction

    if args.name == "list":
        if args.json:
            from fleetsim.cli import print_json

            print_json([_listing(r) for _, r in sorted(REPRODUCTIONS.items())])
        else:
            _print_list(list(REPRODUCTIONS.values()))
        return 0
    if args.name == "all":
        return cmd_all(args)
    repro = get_reproduction(args.name)
    from fleetsim.results import check_out_dir, fresh_out_dir

    _check_workers(args.workers)

    out = Path(args.out) if args.out else fresh_out_dir(Path("results") / "repro" / repro.key)
    check_out_dir(out, force=args.force)
    comparison, ctx, took_s = _run(repro, args)
    from fleetsim.repro.frame import to_document

    doc = to_document(repro, comparison, quick=args.quick, overrides=args.overrides)
    doc["wall_s"] = round(took_s, 2)
    figure = _write(out, repro, comparison, ctx, doc)
    if args.json:
        from fleetsim.cli import print_json

        print_json(doc)
    else:
        console = _console()
        console.print(_result_table(repro, doc))
        console.print(_ratio_line(repro, doc))
        for note in doc["notes"]:
            console.print(f"note: {note}", soft_wrap=True)
        where = f"{out}/ (repro.json, runs/<policy>/<load>/" + (", figure.png)" if figure else ")")
        console.print(f"results written to {where} in {took_s:.1f} s", soft_wrap=True)
    return 0


def _check_workers(workers: int | None) -> None:
    from fleetsim.errors import FleetsimInputError
    from fleetsim.sweep.cli import MAX_WORKERS

    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise FleetsimInputError("--workers", workers, f"must be in [1, {MAX_WORKERS}]")


@dataclass(frozen=True, slots=True)
class EntryTask:
    """One reproduction to run in a worker; ``tokens``: the entry pool's idle cores, which
    its independent simulations may borrow (None: they run one after another)."""

    name: str
    quick: bool
    overrides: tuple[str, ...]
    tokens: CoreTokens | None = None


@dataclass(frozen=True, slots=True, eq=False)
class EntryResult:
    """What a worker sends back: the document and the comparison (for the figure), or the
    error of an entry that failed."""

    name: str
    document: dict[str, Any] | None
    comparison: Any = None
    error: str | None = None


def run_entry(task: EntryTask) -> EntryResult:
    """Run one reproduction; never raises (a failed entry carries its message)."""
    from fleetsim.errors import FleetsimInputError
    from fleetsim.repro import get_reproduction
    from fleetsim.repro.frame import run_reproduction, to_document

    try:
        repro = get_reproduction(task.name)
        start = time.perf_counter()
        subruns = SubRuns(1, task.tokens) if task.tokens is not None else None
        try:
            comparison, _ = run_reproduction(
                repro, quick=task.quick, overrides=task.overrides, subruns=subruns)
        finally:
            if subruns is not None:
                subruns.close()
        doc = to_document(repro, comparison, quick=task.quick)
        doc["wall_s"] = round(time.perf_counter() - start, 2)
    except FleetsimInputError as err:
        return EntryResult(task.name, None, error=str(err))
    except Exception as err:  # noqa: BLE001 - one failed entry never stops the others
        return EntryResult(task.name, None, error=f"{type(err).__name__}: {err}")
    return EntryResult(task.name, doc, comparison)


def _worker_died(task: EntryTask, message: str) -> EntryResult:
    return EntryResult(task.name, None, error=message)


def run_all(names: Sequence[str], *, quick: bool, overrides: Sequence[str], backend: str,
            workers: int | None, ray_address: str | None,
            on_result: Callable[[EntryResult], None] | None = None,
            wall_s: dict[str, float] | None = None) -> list[EntryResult]:
    """Run every entry in ``names`` as an independent task; results in ``names``' order.

    Entries start longest first (by ``wall_s``, the recorded full runs' seconds, where
    given): the longest last would finish alone. With local worker processes, a worker that
    finds no entry left to start lends its core (``CoreTokens``) to the entries still
    running, whose independent simulations spread over it (``ReproContext.run_many``)."""
    import contextlib
    import multiprocessing

    from fleetsim.sweep.runner import run_tasks

    order = longest_first(names, wall_s or {})
    got: dict[str, EntryResult] = {}
    with contextlib.ExitStack() as stack:
        tokens = None
        if backend == "process" and workers is not None and workers > 1:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context(
                "forkserver" if "forkserver" in methods else "spawn")
            manager = stack.enter_context(context.Manager())
            tokens = CoreTokens(manager.Semaphore(0))
        tasks = [EntryTask(n, quick, tuple(overrides), tokens) for n in order]
        results: Iterator[EntryResult] = run_tasks(
            run_entry, tasks, backend=backend, workers=workers, ray_address=ray_address,
            on_worker_failure=_worker_died, preload=("fleetsim.repro",))
        lent = 0 if workers is None else idle_workers(workers, len(tasks), 0)
        if tokens is not None:
            tokens.give(lent)  # more workers than entries
        for result in results:
            got[result.name] = result
            if tokens is not None and workers is not None:
                idle = idle_workers(workers, len(tasks), len(got))
                tokens.give(idle - lent)
                lent = max(lent, idle)
            if on_result is not None:
                on_result(result)
    return [got[n] for n in names]


def longest_first(names: Sequence[str], wall_s: dict[str, float]) -> list[str]:
    """``names`` in the order to start them: the longest recorded first, those without a
    record before all (they may be long), ties in ``names``' order."""
    return sorted(names, key=lambda n: -wall_s.get(n, math.inf))


def recorded_wall_s(path: Path) -> dict[str, float]:
    """Each entry's ``wall_s`` in the scoreboard record at ``path`` (empty when there is
    none, as in an installed package, or it cannot be read)."""
    import json

    try:
        board = json.loads(path.read_text())
        return {d["name"]: float(d["wall_s"]) for d in board["entries"] if "wall_s" in d}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def cmd_all(args: argparse.Namespace) -> int:
    """Every entry as an independent task; one scoreboard (JSON, HTML with the figures)."""
    import os

    from fleetsim.errors import FleetsimInputError
    from fleetsim.repro import REPRODUCTIONS
    from fleetsim.repro.scoreboard import scoreboard
    from fleetsim.results import check_out_dir, write_json
    _check_workers(args.workers)
    if args.record and args.quick:
        raise FleetsimInputError("--record", args.record, "records full runs only: drop "
                                 "--quick (the record is what quick slices are checked against)")
    out = Path(args.out) if args.out else Path("results") / "repro" / "all"
    check_out_dir(out)
    if args.ray_address is not None:
        backend, workers = "ray", args.workers
    else:
        workers = args.workers or os.cpu_count() or 1
        backend = "inline" if workers == 1 else "process"
    names = sorted(REPRODUCTIONS)
    console = Console(stderr=True)
    start = time.perf_counter()

    def progress(result: Any) -> None:
        state = "failed: " + result.error if result.error else (
            f"{result.document['wall_s']:.1f} s")
        console.print(f"{result.name}: {state}", soft_wrap=True, highlight=False)

    results = run_all(names, quick=args.quick, overrides=args.overrides, backend=backend,
                      workers=workers, ray_address=args.ray_address, on_result=progress,
                      wall_s=recorded_wall_s(RECORD))
    took_s = time.perf_counter() - start
    board = scoreboard([r.document for r in results])
    _write_board(out, board, results)
    failed = [r for r in results if r.error]
    if args.record and not failed:
        write_json(Path(args.record), board)
    if args.json:
        from fleetsim.cli import print_json

        print_json(board)
    else:
        from fleetsim.repro.scoreboard import table_rows

        for line in table_rows(board):
            print(line)
    where = f"Ray ({args.ray_address})" if backend == "ray" else f"{workers} worker(s)"
    console.print(f"{len(results) - len(failed)}/{len(results)} entries in {took_s:.1f} s on "
                  f"{where}; scoreboard in {out}/ (scoreboard.json, scoreboard.html, "
                  f"figures/)" + (f"; recorded to {args.record}" if args.record and not failed
                                  else ""), soft_wrap=True)
    for r in failed:
        console.print(f"{r.name} failed: {r.error}", soft_wrap=True, highlight=False)
    return 1 if failed else 0


def _write_board(out: Path, board: dict[str, Any], results: list[Any]) -> None:
    from fleetsim.repro import get_reproduction
    from fleetsim.repro.scoreboard import write_html
    from fleetsim.results import StagedFolder, write_json

    with StagedFolder(out) as tmp:
        write_json(tmp / "scoreboard.json", board)
        figures: dict[str, str] = {}
        try:
            from fleetsim.repro.plot import key_figure
        except ImportError:  # matplotlib is optional: the page without figures
            key_figure = None
        if key_figure is not None:
            (tmp / "figures").mkdir()
            for r in results:
                if r.document is not None:
                    figures[r.name] = f"figures/{_safe(r.name)}.png"
                    key_figure(get_reproduction(r.name), r.comparison, r.document,
                               tmp / figures[r.name])
        write_html(tmp / "scoreboard.html", board, figures)


def _run(repro: Any, args: argparse.Namespace) -> tuple[Any, Any, float]:
    import os

    from fleetsim.repro.frame import run_reproduction

    console = Console(stderr=True)
    loads = repro.loads.quick_values if args.quick else repro.loads.values
    total = (1 + len(repro.baselines)) * len(loads)
    start = time.perf_counter()
    with SubRuns(args.workers or os.cpu_count() or 1) as subruns:
        if not console.is_terminal:
            comparison, ctx = run_reproduction(repro, quick=args.quick,
                                               overrides=args.overrides, subruns=subruns)
            return comparison, ctx, time.perf_counter() - start
        return _run_with_progress(repro, args, console, subruns, total, start)


def _run_with_progress(repro: Any, args: argparse.Namespace, console: Console,
                       subruns: SubRuns, total: int, start: float) -> tuple[Any, Any, float]:
    from fleetsim.output import progress_bar
    from fleetsim.repro.frame import run_reproduction

    with progress_bar(console, repro.key) as bar:
        task = bar.add_task("runs", total=total, note="")

        def progress(label: str) -> None:
            bar.update(task, advance=0 if bar.tasks[0].fields["note"] == "" else 1, note=label)

        comparison, ctx = run_reproduction(repro, quick=args.quick, overrides=args.overrides,
                                           progress=progress, subruns=subruns)
    return comparison, ctx, time.perf_counter() - start


def _console() -> Console:
    """The terminal's width, or a wide plain one when piped (never cut a name or number)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _listing(repro: Any) -> dict[str, Any]:
    return {"name": repro.key, "paper": {"title": repro.paper.title, "id": repro.paper.id},
            "claim": repro.claim, "setup": repro.setup, "system": repro.system,
            "baselines": list(repro.baselines), "paper_ratio": repro.paper_ratio,
            "paper_ratio_source": repro.paper_ratio_source, "paper_best": repro.paper_best}


def _print_list(repros: list[Any]) -> None:
    console = _console()
    for repro in sorted(repros, key=lambda r: r.key):
        console.print(f"[bold]{repro.key}[/bold] — {repro.paper.title} ({repro.paper.id})",
                      soft_wrap=True)
        console.print(f"  claim: {repro.claim}", soft_wrap=True)
        console.print(f"  setup: {repro.setup}", soft_wrap=True)
        console.print(f"  {repro.system} against: {', '.join(repro.baselines)}", soft_wrap=True)


def _result_table(repro: Any, doc: dict[str, Any]) -> Table:
    metric = doc["metric"]
    loads = doc["loads"]
    title = (f"{repro.paper.title} — {metric['name']} ({metric['unit']}, "
             f"{metric['direction']} is better)")
    if not doc["paper_setting"]:
        title += f" — NOT the paper's setting ({_sets(doc)})"
    table = Table(title=title)
    table.add_column("policy", overflow="fold")
    for i, value in enumerate(loads["values"]):
        label = (loads["labels"][i] if loads.get("labels")
                 else f"{fmt_number(value)} {loads['unit']}")
        table.add_column(label, justify="right")
    for policy, by_load in doc["results"].items():
        table.add_row(policy, *(fmt_number(v) if v is not None else "—"
                                for v in by_load.values()))
    return table


def _ratio_line(repro: Any, doc: dict[str, Any]) -> str:
    ratio = doc["ratio"]
    ours = f"{ratio:.2f}x" if ratio is not None else "not measurable (see notes)"
    if ratio is not None and doc["ratio_is_bound"]:
        ours = f"at least {ours}" if ratio >= 1 else f"a bound, {ours}"
    if not doc["paper_setting"]:  # no headline ratio passed off as the paper's comparison
        return (f"{repro.system} vs {repro.baseline}: fleetsim {ours} under {_sets(doc)}, "
                f"which leaves the paper's setting: not comparable to the paper's "
                f"{repro.paper_ratio:.2f}x ({repro.ratio_definition})")
    return (f"{repro.system} vs {repro.baseline}: fleetsim {ours}, paper "
            f"{paper_figure(doc)} ({repro.ratio_definition})")


def paper_figure(doc: dict[str, Any]) -> str:
    """The published value for fleetsim's setting, and the paper's best where it differs."""
    panel, best = doc["paper_ratio"], doc["paper_best"]
    text = "n/a for this setting" if panel is None else f"{panel:.2f}x"
    if best is not None and best != panel:
        text += f" (up to {best:.2f}x)"
    return text


def _sets(doc: dict[str, Any]) -> str:
    return " ".join(f"--set {o}" for o in doc["overrides"])


def _write(out: Path, repro: Any, comparison: Any, ctx: Any, doc: dict[str, Any]) -> bool:
    """Each run's files, repro.json and the key figure, as one set; True if a figure was
    drawn (matplotlib is an optional dependency)."""
    from fleetsim.results import StagedFolder, write_json

    with StagedFolder(out) as tmp:
        write_runs(tmp / "runs", ctx.runs)
        write_json(tmp / "repro.json", doc)
        try:
            from fleetsim.repro.plot import key_figure
        except ImportError:
            return False
        key_figure(repro, comparison, doc, tmp / "figure.png")
        if repro.extra_figures is not None:
            repro.extra_figures(ctx, tmp)
    return True


def write_runs(folder: Path, runs: dict[tuple[str, str], Any]) -> None:
    """Each kept run (``ReproContext.runs``) into ``folder/policy/load``: its summary and
    config, and ``requests.csv`` where it has request rows (not an MoE pass model's)."""
    from fleetsim.results import write_json, write_run_files

    for (policy, load), result in runs.items():
        where = folder / _safe(policy) / _safe(load)
        where.mkdir(parents=True)
        if result.records is None:
            write_json(where / "summary.json", result.summary)
            write_json(where / "config.json", result.config)
        else:
            write_run_files(where, result.summary, result.config, result.records.requests)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
