"""How commands print: tables never cut a name or a number; ``--format table|csv|json``.

A terminal gets rich's boxed table, as wide as its widest row (the terminal wraps a line it
cannot hold, but no cell is cut); a pipe or file gets the same table in a plain layout
without box characters, again as wide as it needs. ``csv`` and ``json`` print the command's
data itself (raw numbers, not the table's formatted cells).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported where a table is printed: it costs start-up
    from rich.console import Console
    from rich.table import Table

FORMATS = ("table", "csv", "json")


def add_format_flag(p: argparse.ArgumentParser) -> None:
    """``--format table|csv|json`` and its shorthand ``--json``."""
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="table (default), csv or json on stdout")
    p.add_argument("--json", action="store_true", help="the same as --format json")


def output_format(args: argparse.Namespace) -> str:
    fmt = getattr(args, "format", None)
    if getattr(args, "json", False):
        return "json"
    return fmt or "table"


def print_table(table: Table, file: Any = None) -> None:
    """``table`` in full: boxed on a terminal, plain when piped, never truncated."""
    from rich import box
    from rich.console import Console

    out = file if file is not None else sys.stdout
    probe = Console(file=out)
    terminal = probe.is_terminal
    if not terminal:
        table.box = box.SIMPLE_HEAD
        table.safe_box = True
    for col in table.columns:
        col.no_wrap = True
        col.overflow = "ignore"
    wide = Console(file=io.StringIO(), width=100_000)
    width = wide.measure(table).maximum
    if table.title is not None:
        width = max(width, len(str(table.title)))
    if table.caption is not None:
        width = max(width, min(len(str(table.caption)), 160))
    console = Console(file=out, width=max(width, 20), soft_wrap=False,
                      force_terminal=terminal, no_color=not terminal,
                      highlight=terminal)
    console.print(table)


def flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (lists are kept as they are)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, Mapping):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def print_csv(data: Any, file: Any = None) -> None:
    """A list of records as one CSV row each (dotted columns for nested fields, union of
    keys in first-seen order); one record as ``key,value`` rows. Lists become JSON text."""
    import json

    out = file if file is not None else sys.stdout
    w = csv.writer(out, lineterminator="\n")

    def cell(v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, list | tuple | dict):
            return json.dumps(v)
        return v

    if isinstance(data, Mapping):
        w.writerow(("key", "value"))
        for k, v in flat(data).items():
            w.writerow((k, cell(v)))
        return
    rows = [flat(r) if isinstance(r, Mapping) else {"value": r} for r in data]
    columns: dict[str, None] = {}
    for r in rows:
        columns.update(dict.fromkeys(r))
    w.writerow(list(columns))
    for r in rows:
        w.writerow([cell(r.get(c)) for c in columns])


def emit(fmt: str, data: Any, table: Callable[[], Table | Sequence[Table]]) -> None:
    """Print ``data`` as JSON or CSV, or the table(s) ``table()`` builds."""
    if fmt == "json":
        from fleetsim.inputs import to_json

        print(to_json(data))
    elif fmt == "csv":
        print_csv(data)
    else:
        from rich.table import Table

        tables = table()
        for t in ([tables] if isinstance(tables, Table) else tables):
            print_table(t)


def progress_bar(console: Console, label: str) -> Any:
    """The progress bar of a command made of N similar jobs (sweep points, reproduction runs,
    plan shapes, report sections): done out of N, a note (``task.fields["note"]``), time
    elapsed and the estimated time left, on ``console`` (stderr), cleared when done. Add
    the task with ``note=""``."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=console, transient=True)
