"""Column readers shared by the trace loaders: CSV tables, JSON lines, typed columns and
their one-line errors (file, line, column, value, fix)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import MAX_TIME_S, MAX_TOKENS

EMBEDDED_PREFIX = "embedded:"
TOKENS_FIX = f"token counts must be whole numbers >= 1 (at most {MAX_TOKENS:,})"
MAX_EXACT_INT = 2**53  # integers beyond this are not exact in the float64 columns


class CsvTable:
    """A CSV file as header + rows, remembering each row's 1-based line number."""

    __slots__ = ("header", "label", "lines", "rows")

    def __init__(self, label: str, text: str) -> None:
        self.label = label
        numbered = [(i, row) for i, row in enumerate(csv.reader(text.splitlines()), 1) if row]
        if not numbered:
            raise FleetsimInputError(label, "<empty file>", "the trace has no header; add one")
        self.header = [h.strip() for h in numbered[0][1]]
        dup = next((h for k, h in enumerate(self.header) if h in self.header[:k]), None)
        if dup is not None:
            raise FleetsimInputError(f"{label}, line {numbered[0][0]} (header)",
                                     ",".join(self.header), f"column {dup!r} appears twice; "
                                     f"name each column once")
        self.lines = [i for i, _ in numbered[1:]]
        self.rows = [row for _, row in numbered[1:]]
        if not self.rows:
            raise FleetsimInputError(
                label, "<header only>", "the trace has a header but no requests; add rows"
            )
        width = len(self.header)
        short = next((k for k, row in enumerate(self.rows) if len(row) != width), None)
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


def json_objects(label: str, text: str) -> tuple[list[int], list[dict[str, Any]]]:
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


def json_field(label: str, lines: list[int], objs: list[dict[str, Any]], key: str) -> list[Any]:
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


def float_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.float64]:
    # JSON true/false would become 1/0 below: a boolean is not a number
    flag = next((k for k, v in enumerate(values) if v is True or v is False), None)
    if flag is not None:
        raise FleetsimInputError(
            f"{label}, line {lines[flag]}, column {column!r}", values[flag], "expected a number"
        )
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.ndim != 1:
        bad = next(k for k, v in enumerate(values) if not is_number(v))
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


def int_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.int64]:
    arr = float_column(values, label, lines, column)
    huge = np.abs(arr) > MAX_EXACT_INT
    if huge.any():
        bad = int(np.argmax(huge))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad],
            f"expected an integer of magnitude at most {MAX_EXACT_INT:,}")
    whole = arr == np.floor(arr)
    if not whole.all():
        bad = int(np.argmin(whole))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad], "expected an integer"
        )
    return arr.astype(np.int64)


def token_column(
    values: Sequence[Any], label: str, lines: list[int], column: str
) -> NDArray[np.int64]:
    try:
        arr = int_column(values, label, lines, column)
    except FleetsimInputError as err:
        raise FleetsimInputError(err.where, err.value, TOKENS_FIX) from None
    ok = (arr >= 1) & (arr <= MAX_TOKENS)
    if not ok.all():
        bad = int(np.argmin(ok))
        raise FleetsimInputError(
            f"{label}, line {lines[bad]}, column {column!r}", values[bad], TOKENS_FIX
        )
    return arr


def check_sorted(
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


def check_span(
    arrival_s: NDArray[np.float64], raw: Sequence[Any], label: str, lines: list[int], column: str
) -> None:
    """Arrivals (seconds from the first) must stay within ``MAX_TIME_S``."""
    late = arrival_s > MAX_TIME_S
    if late.any():
        k = int(np.argmax(late))
        raise FleetsimInputError(
            f"{label}, line {lines[k]}, column {column!r}", raw[k],
            f"arrives {arrival_s[k]:.3g} s after the first request, beyond the "
            f"{MAX_TIME_S:.0e} s a run may span; fix the time or its unit")


def hash_lists(
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
            if any(not -(2**63) <= x < 2**63 for x in ids):  # the engine keys blocks by int64
                raise ValueError
        except (TypeError, ValueError):
            raise FleetsimInputError(
                f"{label}, line {lines[k]}, column 'hash_ids'",
                item,
                "expected 64-bit integers (a JSON list, or space- or semicolon-separated in CSV)",
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


def is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def is_datetime(text: str) -> bool:
    try:
        np.datetime64(text, "ns")
    except ValueError:
        return False
    return True


def short_name(label: str) -> str:
    return label if label.startswith(EMBEDDED_PREFIX) else Path(label).name
