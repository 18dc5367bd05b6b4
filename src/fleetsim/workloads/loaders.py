"""Trace loaders: Azure LLM 2023 CSV, Mooncake JSONL and a generic CSV/JSONL format -> Workload.

Every loader returns arrivals in seconds relative to the first request (which arrives at 0) and
rejects bad input with a one-line ``FleetsimInputError`` naming the file, the line and column,
the value and the fix. Parsing is the stdlib ``csv``/``json`` modules plus numpy conversions:
the 19,366-row Azure conversation trace loads in a few tens of milliseconds.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_text
from fleetsim.workloads.parsing import (
    EMBEDDED_PREFIX,
    CsvTable,
    check_sorted,
    check_span,
    float_column,
    hash_lists,
    int_column,
    is_datetime,
    json_field,
    json_objects,
    short_name,
    token_column,
)
from fleetsim.workloads.workload import Workload

EMBEDDED_TRACES: dict[str, tuple[str, str]] = {
    "azure_conv_2023": ("azure_conv_2023_slice.csv", "azure"),
    "azure_conv_2023_hour": ("azure_conv_2023_hour.csv", "azure"),
    "azure_code_2023_hour": ("azure_code_2023_hour.csv", "azure"),
    "sharegpt_lengths": ("sharegpt_lengths.csv", "lengths"),
    "sharegpt_first_turn_opt": ("sharegpt_first_turn_opt.csv", "lengths"),
    "mooncake_conversation_10min": ("mooncake_conversation_10min.jsonl", "mooncake"),
}
"""Embedded data name -> (file in ``fleetsim/data``, format). Format ``lengths``: token
counts only (an empirical length source, not a trace)."""
FORMATS = ("auto", "azure", "mooncake", "generic")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_HASH_BLOCK_TOKENS = 512
"""``WorkloadConfig.hash_block_tokens``'s default, which a trace's own value replaces."""
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


# ---------------------------------------------------------------------------------------------
# Public loaders


def load_trace(
    source: str | os.PathLike[str], format: str = "auto", *, hash_block_tokens: int = 512
) -> Workload:
    """Load a trace file or an embedded trace (``"embedded:azure_conv_2023"``) as a Workload.

    ``format`` is ``"azure"``, ``"mooncake"``, ``"generic"`` or ``"auto"``: by extension
    (``.jsonl``/``.json`` are JSON Lines, anything else CSV), then by the CSV header or the first
    JSON object's keys. ``hash_block_tokens`` applies to generic traces with ``hash_ids``.
    """
    if format not in FORMATS:
        raise FleetsimInputError("trace format", format, f"use one of {', '.join(FORMATS)}")
    label, text, embedded_format = read_source(source)
    if embedded_format == "lengths":
        raise FleetsimInputError(
            "workload.trace", label, "it holds request lengths only, no arrival times: use it "
            "as an empirical length source ({kind = \"empirical\", path = \"" + label
            + "\", column = \"num_prefill_tokens\"}) with an arrival process")
    if format == "auto":
        format = embedded_format or _detect_format(label, text)
    if format == "azure":
        return _parse_azure(label, text)
    if format == "mooncake":
        if hash_block_tokens != MOONCAKE_BLOCK_TOKENS:
            raise FleetsimInputError(
                f"{label}: hash_block_tokens",
                hash_block_tokens,
                "Mooncake hash_ids always cover 512 tokens; leave hash_block_tokens at 512",
            )
        return _parse_mooncake(label, text)
    return _parse_generic(label, text, hash_block_tokens)


def load_azure_csv(path: str | os.PathLike[str]) -> Workload:
    """Azure LLM inference trace 2023 CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens``."""
    label, text, _ = read_source(path)
    return _parse_azure(label, text)


def load_mooncake_jsonl(path: str | os.PathLike[str]) -> Workload:
    """Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
    ``hash_ids`` (one id per 512-token prompt block)."""
    label, text, _ = read_source(path)
    return _parse_mooncake(label, text)


def load_generic(path: str | os.PathLike[str], *, hash_block_tokens: int = 512) -> Workload:
    """Generic CSV or JSONL: ``arrival_s, prompt_tokens, output_tokens[, hash_ids][, priority]``.

    In CSV, ``hash_ids`` holds space- or semicolon-separated integers (may be empty); in JSONL
    it is a list. ``priority`` is an integer, lower runs first.
    """
    label, text, _ = read_source(path)
    return _parse_generic(label, text, hash_block_tokens)


def save_generic_csv(workload: Workload, path: str | os.PathLike[str]) -> None:
    """Write ``workload`` as a generic CSV that ``load_generic`` reads back exactly.

    Arrival times are written with ``repr`` (shortest exact float); ``hash_ids`` (space-separated)
    and ``priority`` columns appear only when the workload has them.
    """
    header = list(GENERIC_COLUMNS)
    columns: list[Sequence[Any]] = [
        [repr(float(t)) for t in workload.arrival_s],
        workload.num_prompt_tokens.tolist(),
        workload.num_output_tokens.tolist(),
    ]
    if workload.hash_ids is not None:
        header.append("hash_ids")
        columns.append([" ".join(map(str, ids)) for ids in workload.hash_ids])
    if workload.priority is not None:
        header.append("priority")
        columns.append(workload.priority.tolist())
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(zip(*columns, strict=True))


def read_source(source: str | os.PathLike[str]) -> tuple[str, str, str | None]:
    """(label for messages, text, format if embedded) of a path or ``embedded:<name>``."""
    spec = os.fspath(source)
    if spec.startswith(EMBEDDED_PREFIX):
        name = spec[len(EMBEDDED_PREFIX) :]
        if name not in EMBEDDED_TRACES:
            raise FleetsimInputError(
                "embedded trace",
                spec,
                f"known embedded traces: {', '.join(EMBEDDED_PREFIX + k for k in EMBEDDED_TRACES)}",
            )
        file_name, fmt = EMBEDDED_TRACES[name]
        text = resources.files("fleetsim").joinpath("data", file_name).read_text("utf-8-sig")
        return spec, text, fmt
    if not os.path.exists(spec):
        raise FleetsimInputError(
            "trace file",
            spec,
            "no such file; give the path of a trace file (relative paths start at the current "
            "directory) or an embedded trace such as 'embedded:azure_conv_2023'",
        )
    text = read_text(spec, "trace")
    if not text.strip():
        raise FleetsimInputError(
            spec, "<empty file>", "the trace has no header and no requests; give a non-empty trace"
        )
    return spec, text, None


# Embedded files ship inside the package and never change, so each column is parsed once per
# process: a reproduction builds the same ShareGPT lengths for each of its runs (18 in
# FastServe's quick slice), and parsing 30k CSV rows cost ~0.3 s each time.
_EMBEDDED_COLUMNS: dict[tuple[str, str], NDArray[np.int64]] = {}


def read_column(source: str | os.PathLike[str], column: str) -> NDArray[np.int64]:
    """One token-count column of a CSV (by header name) or JSONL (by key) file, values >= 1."""
    if isinstance(source, str) and source.startswith(EMBEDDED_PREFIX):
        key = (source, column)
        cached = _EMBEDDED_COLUMNS.get(key)
        if cached is None:
            cached = _EMBEDDED_COLUMNS[key] = _read_column(source, column)
        return cached.copy()  # callers own their array, as with a file read
    return _read_column(source, column)


def _read_column(source: str | os.PathLike[str], column: str) -> NDArray[np.int64]:
    label, text, _ = read_source(source)
    if _looks_like_jsonl(label, text):
        lines, objs = json_objects(label, text)
        values = json_field(label, lines, objs, column)
        return token_column(values, label, lines, column)
    table = CsvTable(label, text)
    return token_column(table.column(column), label, table.lines, column)


# ---------------------------------------------------------------------------------------------
# Format detection


def _looks_like_jsonl(label: str, text: str) -> bool:
    if label.lower().endswith(_JSONL_SUFFIXES):
        return True
    if label.lower().endswith(".csv"):
        return False
    return text.lstrip().startswith("{")


def _detect_format(label: str, text: str) -> str:
    if _looks_like_jsonl(label, text):
        first = next(line for line in text.splitlines() if line.strip())
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            keys = set()
        if {"input_length", "output_length"} <= keys:
            return "mooncake"
        if set(GENERIC_COLUMNS) <= keys:
            return "generic"
        raise FleetsimInputError(
            f"{label}, line 1",
            sorted(keys) or first[:60],
            "unknown trace format: expected Mooncake keys (timestamp, input_length, "
            "output_length, hash_ids) or generic keys (arrival_s, prompt_tokens, output_tokens); "
            "or set format to azure, mooncake or generic",
        )
    header = CsvTable.header_of(text)
    if set(AZURE_COLUMNS) <= set(header):
        return "azure"
    if "arrival_s" in header:
        return "generic"
    raise FleetsimInputError(
        f"{label}, line 1 (header)",
        ",".join(header)[:80],
        "unknown trace format: expected Azure columns (TIMESTAMP,ContextTokens,GeneratedTokens) "
        "or generic columns (arrival_s,prompt_tokens,output_tokens); or set format to azure, "
        "mooncake or generic",
    )


# ---------------------------------------------------------------------------------------------
# Parsers (label = file name or embedded name used in messages)


def _parse_azure(label: str, text: str) -> Workload:
    table = CsvTable(label, text)
    stamps = table.column("TIMESTAMP")
    try:
        ts = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        bad = next(i for i, s in enumerate(stamps) if not is_datetime(s))
        raise FleetsimInputError(
            f"{label}, line {table.lines[bad]}, column 'TIMESTAMP'",
            stamps[bad],
            "timestamps must look like 2023-11-16 18:15:46.6805900",
        ) from None
    ns = ts.astype(np.int64)
    arrival_s = (ns - ns[0]) / 1e9
    check_sorted(arrival_s, stamps, label, table.lines, "TIMESTAMP")
    check_span(arrival_s, stamps, label, table.lines, "TIMESTAMP")
    return Workload(
        arrival_s=arrival_s,
        num_prompt_tokens=token_column(
            table.column("ContextTokens"), label, table.lines, "ContextTokens"
        ),
        num_output_tokens=token_column(
            table.column("GeneratedTokens"), label, table.lines, "GeneratedTokens"
        ),
        name=short_name(label),
    )


def _parse_mooncake(label: str, text: str) -> Workload:
    lines, objs = json_objects(label, text)
    stamps = json_field(label, lines, objs, "timestamp")
    prompt = token_column(
        json_field(label, lines, objs, "input_length"), label, lines, "input_length"
    )
    output = token_column(
        json_field(label, lines, objs, "output_length"), label, lines, "output_length"
    )
    ms = float_column(stamps, label, lines, "timestamp")
    check_sorted(ms, stamps, label, lines, "timestamp")
    check_span((ms - ms[0]) / 1e3, stamps, label, lines, "timestamp")
    hash_ids = None
    if "hash_ids" in objs[0]:
        raw = json_field(label, lines, objs, "hash_ids")
        hash_ids = hash_lists(raw, label, lines, prompt, MOONCAKE_BLOCK_TOKENS)
    return Workload(
        arrival_s=(ms - ms[0]) / 1e3,
        num_prompt_tokens=prompt,
        num_output_tokens=output,
        hash_ids=hash_ids,
        hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
        name=short_name(label),
    )


def _parse_generic(label: str, text: str, hash_block_tokens: int) -> Workload:
    if hash_block_tokens < 1:
        raise FleetsimInputError(
            f"{label}: hash_block_tokens", hash_block_tokens, "must be an integer >= 1"
        )
    num_unserved = 0
    if _looks_like_jsonl(label, text):
        lines, objs = json_objects(label, text)
        lines, objs, num_unserved = _served_rows(label, lines, objs)
        hash_block_tokens = _own_hash_block_tokens(label, lines, objs, hash_block_tokens)
        has = set(objs[0])

        def get(name: str) -> list[Any]:
            return json_field(label, lines, objs, name)
    else:
        table = CsvTable(label, text)
        lines, has, get = table.lines, set(table.header), table.column
    raw_arrival = get("arrival_s")
    arrival = float_column(raw_arrival, label, lines, "arrival_s")
    check_sorted(arrival, raw_arrival, label, lines, "arrival_s")
    check_span(arrival - arrival[0], raw_arrival, label, lines, "arrival_s")
    prompt = token_column(get("prompt_tokens"), label, lines, "prompt_tokens")
    output = token_column(get("output_tokens"), label, lines, "output_tokens")
    hash_ids = None
    if "hash_ids" in has:
        hash_ids = hash_lists(get("hash_ids"), label, lines, prompt, hash_block_tokens)
    priority = None
    if "priority" in has:
        priority = int_column(get("priority"), label, lines, "priority")
    return Workload(
        arrival_s=arrival - arrival[0],
        num_prompt_tokens=prompt,
        num_output_tokens=output,
        hash_ids=hash_ids,
        hash_block_tokens=hash_block_tokens,
        priority=priority,
        name=short_name(label),
        num_unserved_skipped=num_unserved,
    )


def _served_rows(label: str, lines: list[int], objs: list[dict[str, Any]]
                 ) -> tuple[list[int], list[dict[str, Any]], int]:
    """The rows a server served: a live recording (``fleetsim gateway --record``, ``load
    --out``) marks requests that produced nothing (rejected, failed) ``served: false``."""
    keep = [k for k, obj in enumerate(objs) if obj.get("served", True) is not False]
    if len(keep) == len(objs):
        return lines, objs, 0
    if not keep:
        raise FleetsimInputError(label, f"{len(objs)} rows", "no row was served (every one "
                                 "has served: false); record traffic that a server answered")
    return [lines[k] for k in keep], [objs[k] for k in keep], len(objs) - len(keep)


def _own_hash_block_tokens(label: str, lines: list[int], objs: list[dict[str, Any]],
                           asked: int) -> int:
    """The ``hash_block_tokens`` a trace's rows carry (live recordings do), else ``asked``.
    The trace knows its own block size: it wins over the default (512); a different value
    set on purpose is an error."""
    values = {obj.get("hash_block_tokens") for obj in objs}
    if values == {None}:
        return asked
    own = next(iter(values))
    if len(values) > 1 or isinstance(own, bool) or not isinstance(own, int) or own < 1:
        bad = next(k for k, obj in enumerate(objs) if obj.get("hash_block_tokens") != own
                   or not isinstance(own, int) or isinstance(own, bool) or own < 1)
        raise FleetsimInputError(f"{label}, line {lines[bad]}: hash_block_tokens",
                                 objs[bad].get("hash_block_tokens"), "every row must carry the "
                                 "same integer >= 1 (or none)")
    if asked not in (own, DEFAULT_HASH_BLOCK_TOKENS):
        raise FleetsimInputError("workload.hash_block_tokens", asked, f"the trace {label} says "
                                 f"its hash_ids cover {own} tokens; leave it unset or set {own}")
    return own
