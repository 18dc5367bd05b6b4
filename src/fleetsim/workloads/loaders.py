"""Trace loaders: Azure LLM 2023 CSV, Mooncake JSONL and a generic CSV/JSONL format -> Workload.

Every loader returns arrivals in seconds relative to the first request (which arrives at 0) and
rejects bad input with a one-line ``FleetsimInputError`` naming the file, the line and column,
the value and the fix. Parsing is the stdlib ``csv``/``json`` modules plus numpy conversions:
the 19,366-row Azure conversation trace loads in a few tens of milliseconds.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.workloads.workload import Workload

EMBEDDED_PREFIX = "embedded:"
EMBEDDED_TRACES: dict[str, tuple[str, str]] = {
    "azure_conv_2023": ("azure_conv_2023_slice.csv", "azure"),
}
"""Embedded trace name -> (file in ``fleetsim/data``, format)."""
FORMATS = ("auto", "azure", "mooncake", "generic")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_BLOCK_TOKENS = 512
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
_TOKENS_FIX = "token counts must be whole numbers >= 1"


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
    path = Path(spec)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "no such file"
        raise FleetsimInputError(
            "trace file",
            spec,
            f"{what}; give the path of a trace file (relative paths start at the current "
            f"directory) or an embedded trace such as 'embedded:azure_conv_2023'",
        )
    try:
        text = path.read_text("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FleetsimInputError(
            f"{spec}, byte {err.start}",
            err.object[err.start : err.start + 8],
            "the trace is not UTF-8 text; give a CSV or JSONL file (decompress it first)",
        ) from None
    if not text.strip():
        raise FleetsimInputError(
            spec, "<empty file>", "the trace has no header and no requests; give a non-empty trace"
        )
    return spec, text, None


def read_column(source: str | os.PathLike[str], column: str) -> NDArray[np.int64]:
    """One token-count column of a CSV (by header name) or JSONL (by key) file, values >= 1."""
    label, text, _ = read_source(source)
    if _looks_like_jsonl(label, text):
        lines, objs = _json_objects(label, text)
        values = _json_field(label, lines, objs, column)
        return _token_column(values, label, lines, column)
    table = _CsvTable(label, text)
    return _token_column(table.column(column), label, table.lines, column)


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
    header = _CsvTable.header_of(text)
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
    table = _CsvTable(label, text)
    stamps = table.column("TIMESTAMP")
    try:
        ts = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        bad = next(i for i, s in enumerate(stamps) if not _is_datetime(s))
        raise FleetsimInputError(
            f"{label}, line {table.lines[bad]}, column 'TIMESTAMP'",
            stamps[bad],
            "timestamps must look like 2023-11-16 18:15:46.6805900",
        ) from None
    ns = ts.astype(np.int64)
    arrival_s = (ns - ns[0]) / 1e9
    _check_sorted(arrival_s, stamps, label, table.lines, "TIMESTAMP")
    return Workload(
        arrival_s=arrival_s,
        num_prompt_tokens=_token_column(
            table.column("ContextTokens"), label, table.lines, "ContextTokens"
        ),
        num_output_tokens=_token_column(
            table.column("GeneratedTokens"), label, table.lines, "GeneratedTokens"
        ),
        name=_short_name(label),
    )


def _parse_mooncake(label: str, text: str) -> Workload:
    lines, objs = _json_objects(label, text)
    stamps = _json_field(label, lines, objs, "timestamp")
    prompt = _token_column(
        _json_field(label, lines, objs, "input_length"), label, lines, "input_length"
    )
    output = _token_column(
        _json_field(label, lines, objs, "output_length"), label, lines, "output_length"
    )
    ms = _float_column(stamps, label, lines, "timestamp")
    _check_sorted(ms, stamps, label, lines, "timestamp")
    hash_ids = None
    if "hash_ids" in objs[0]:
        raw = _json_field(label, lines, objs, "hash_ids")
        hash_ids = _hash_lists(raw, label, lines, prompt, MOONCAKE_BLOCK_TOKENS)
    return Workload(
        arrival_s=(ms - ms[0]) / 1e3,
        num_prompt_tokens=prompt,
        num_output_tokens=output,
        hash_ids=hash_ids,
        hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
        name=_short_name(label),
    )


def _parse_generic(label: str, text: str, hash_block_tokens: int) -> Workload:
    if hash_block_tokens < 1:
        raise FleetsimInputError(
            f"{label}: hash_block_tokens", hash_block_tokens, "must be an integer >= 1"
        )
    if _looks_like_jsonl(label, text):
        lines, objs = _json_objects(label, text)
        has = set(objs[0])

        def get(name: str) -> list[Any]:
            return _json_field(label, lines, objs, name)
    else:
        table = _CsvTable(label, text)
        lines, has, get = table.lines, set(table.header), table.column
    raw_arrival = get("arrival_s")
    arrival = _float_column(raw_arrival, label, lines, "arrival_s")
    _check_sorted(arrival, raw_arrival, label, lines, "arrival_s")
    prompt = _token_column(get("prompt_tokens"), label, lines, "prompt_tokens")
    output = _token_column(get("output_tokens"), label, lines, "output_tokens")
    hash_ids = None
    if "hash_ids" in has:
        hash_ids = _hash_lists(get("hash_ids"), label, lines, prompt, hash_block_tokens)
    priority = None
    if "priority" in has:
        priority = _int_column(get("priority"), label, lines, "priority")
    return Workload(
        arrival_s=arrival - arrival[0],
        num_prompt_tokens=prompt,
        num_output_tokens=output,
        hash_ids=hash_ids,
        hash_block_tokens=hash_block_tokens,
        priority=priority,
        name=_short_name(label),
    )


# ---------------------------------------------------------------------------------------------
# Table readers


class _CsvTable:
    """A CSV file as header + rows, remembering each row's 1-based line number."""

    __slots__ = ("header", "label", "lines", "rows")

    def __init__(self, label: str, text: str) -> None:
        self.label = label
        numbered = [(i, row) for i, row in enumerate(csv.reader(text.splitlines()), 1) if row]
        if not numbered:
            raise FleetsimInputError(label, "<empty file>", "the trace has no header; add one")
        self.header = [h.strip() for h in numbered[0][1]]
        self.lines = [i for i, _ in numbered[1:]]
        self.rows = [row for _, row in numbered[1:]]
        if not self.rows:
            raise FleetsimInputError(
                label, "<header only>", "the trace has a header but no requests; add rows"
            )
        width = len(self.header)
        short = next((k for k, row in enumerate(self.rows) if len(row) < width), None)
        if short is not None:
            raise FleetsimInputError(
                f"{label}, line {self.lines[short]}",
                ",".join(self.rows[short]),
                f"expected {width} fields like the header ({','.join(self.header)})",
            )

    @staticmethod
    def header_of(text: str) -> list[str]:
        first = next((line for line in text.splitlines() if line.strip()), "")
        return [h.strip() for h in next(csv.reader([first]))]

    def column(self, name: str) -> list[str]:
        if name not in self.header:
            raise FleetsimInputError(
                f"{self.label}, line 1 (header)",
                ",".join(self.header),
                f"missing column {name!r}; the header must name it",
            )
        j = self.header.index(name)
        return [row[j] for row in self.rows]


def _json_objects(label: str, text: str) -> tuple[list[int], list[dict[str, Any]]]:
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    try:  # fast path: one parse of the whole file; on any problem redo line by line for the row
        objs = json.loads("[" + ",".join(line for _, line in numbered) + "]")
        if len(objs) == len(numbered) and all(type(obj) is dict for obj in objs):
            return [i for i, _ in numbered], objs
    except json.JSONDecodeError:
        pass
    lines: list[int] = []
    objs = []
    loads = json.loads
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads(line)
        except json.JSONDecodeError as err:
            raise FleetsimInputError(
                f"{label}, line {i}",
                line[:60],
                f"malformed JSON ({err.msg}); each line must be one JSON object",
            ) from None
        if not isinstance(obj, dict):
            raise FleetsimInputError(
                f"{label}, line {i}", line[:60], "each line must be one JSON object {...}"
            )
        lines.append(i)
        objs.append(obj)
    return lines, objs


def _json_field(label: str, lines: list[int], objs: list[dict[str, Any]], key: str) -> list[Any]:
    try:
        return [obj[key] for obj in objs]
    except KeyError:
        bad = next(k for k, obj in enumerate(objs) if key not in obj)
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}",
            sorted(objs[bad]),
            f"missing key {key!r}; every line needs it",
        ) from None


# ---------------------------------------------------------------------------------------------
# Column conversions with row-precise errors


def _float_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.float64]:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.ndim != 1:
        bad = next(k for k, v in enumerate(values) if not _is_number(v))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad], "expected a number"
        )
    finite = np.isfinite(arr)
    if not finite.all():
        bad = int(np.argmin(finite))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}",
            values[bad],
            "expected a finite number",
        )
    return arr


def _int_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.int64]:
    arr = _float_column(values, label, lines, column)
    whole = arr == np.floor(arr)
    if not whole.all():
        bad = int(np.argmin(whole))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad], "expected an integer"
        )
    return arr.astype(np.int64)


def _token_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.int64]:
    try:
        arr = _int_column(values, label, lines, column)
    except FleetsimInputError as err:
        raise FleetsimInputError(err.where, err.value, _TOKENS_FIX) from None
    ok = arr >= 1
    if not ok.all():
        bad = int(np.argmin(ok))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad], _TOKENS_FIX
        )
    return arr


def _check_sorted(
    times: NDArray[np.float64], raw: Sequence[Any], label: str, lines: list[int], column: str
) -> None:
    back = np.diff(times) < 0
    if back.any():
        k = int(np.argmax(back)) + 1
        raise FleetsimInputError(
            f"{label}, line {lines[k]}, column {column!r}",
            raw[k],
            f"earlier than the previous row ({raw[k - 1]!r} on line {lines[k - 1]}); "
            f"sort the rows by {column}",
        )


def _hash_lists(
    raw: Sequence[Any], label: str, lines: list[int], prompt: NDArray[np.int64], block_tokens: int
) -> tuple[tuple[int, ...], ...]:
    out: list[tuple[int, ...]] = []
    for k, item in enumerate(raw):
        try:
            if isinstance(item, str):
                ids = tuple(int(x) for x in item.replace(";", " ").split())
            elif isinstance(item, list) and all(type(x) is int for x in item):
                ids = tuple(item)
            else:
                raise TypeError
        except (TypeError, ValueError):
            raise FleetsimInputError(
                f"{label}, line {lines[k]}, column 'hash_ids'",
                item,
                "expected integers (a JSON list, or space- or semicolon-separated in CSV)",
            ) from None
        out.append(ids)
    lens = np.fromiter((len(ids) for ids in out), dtype=np.int64, count=len(out))
    too_long = lens > -(-prompt // block_tokens)
    if too_long.any():
        k = int(np.argmax(too_long))
        raise FleetsimInputError(
            f"{label}, line {lines[k]}, column 'hash_ids'",
            len(out[k]),
            f"more hash ids than the {int(prompt[k])}-token prompt has {block_tokens}-token "
            f"blocks ({math.ceil(int(prompt[k]) / block_tokens)}); fix the row or the block size",
        )
    return tuple(out)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _is_datetime(text: str) -> bool:
    try:
        np.datetime64(text, "ns")
    except ValueError:
        return False
    return True


def _short_name(label: str) -> str:
    return label if label.startswith(EMBEDDED_PREFIX) else Path(label).name
