"""The one validation layer for user input: files, numbers and their physical bounds.

Every entry point (config TOML and ``--set``, Hugging Face config.json, GPU catalogs, traces,
sweep specs, report inputs, CLI flags) reads files through ``read_text``/``read_toml``/
``read_json`` and checks numbers through ``check_number``, so any bad input becomes one
``FleetsimInputError`` line naming the field, the value and the fix. Stdlib only.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from fleetsim.errors import FleetsimInputError

MAX_TIME_S = 1e9
"""Longest simulated time, s (~32 years); float64 still resolves 0.1 us steps there."""
MAX_TOKENS = 2**24
"""Most tokens in one prompt, output, step budget or context (16.8 M, above the longest
published context windows)."""
MAX_REQUESTS = 100_000_000
"""Most requests in one run (each costs ~100 bytes of columns)."""
MAX_FILE_BYTES = 16 * 2**30
"""Largest input file read (16 GiB)."""
MAX_MAGNITUDE = 1e18
"""Any other number: |x| at most this (above every FLOP/s, byte and count we model)."""

# Config field name -> inclusive (low, high). Lower bounds that need a message of their own
# (> 0, >= 1) stay in each dataclass's __post_init__; these catch the absurdly large.
FIELD_LIMITS: dict[str, tuple[float, float]] = {
    "seed": (0, 2**63 - 1),
    "tp": (1, 1024),
    "num_replicas": (1, 100_000),
    "num_gpus_per_node": (1, 1024),
    "block_size": (1, 4096),
    "max_batched_tokens": (1, MAX_TOKENS),
    "max_running": (1, 10_000_000),
    "num_kv_blocks": (1, 10**10),
    "long_prefill_token_threshold": (1, MAX_TOKENS),
    "hash_block_tokens": (1, MAX_TOKENS),
    "rate_scale": (1e-6, 1e6),
    "rate_per_s": (1e-6, 1e7),
    "num_requests": (1, MAX_REQUESTS),
    "max_requests": (1, MAX_REQUESTS),
    "cv": (1e-3, 100.0),
    "value": (1, MAX_TOKENS),
    "low": (1, MAX_TOKENS),
    "high": (1, MAX_TOKENS),
    "mean": (1, MAX_TOKENS),
    "latency_s": (0.0, 60.0),
    "ttft_s": (0.0, 1e6),
    "tpot_s": (0.0, 1e6),
    "gpu_memory_utilization": (0.0, 1.0),
    "price_per_hour_usd": (0.0, 1e6),
}
# Unit suffix -> bounds, for fields not named above (STYLE.md: quantities carry their unit).
SUFFIX_LIMITS: tuple[tuple[str, tuple[float, float]], ...] = (
    # 1e30 is the documented "ideal link"; below 1 MB/s (slower than any link or memory we
    # model) moving one long context's KV outlasts MAX_TIME_S and time overflows to inf.
    ("_bytes_per_s", (1e6, 1e30)),
    ("_flops", (0.0, MAX_MAGNITUDE)),
    ("_bytes", (0.0, 1e15)),
    ("_usd", (0.0, 1e6)),
    ("_tokens", (0, MAX_TOKENS)),
    ("_s", (0.0, MAX_TIME_S)),
)


def limits_of(name: str) -> tuple[float, float]:
    """The inclusive bounds of a config number called ``name``."""
    if name in FIELD_LIMITS:
        return FIELD_LIMITS[name]
    for suffix, bounds in SUFFIX_LIMITS:
        if name.endswith(suffix):
            return bounds
    return (-MAX_MAGNITUDE, MAX_MAGNITUDE)


def check_number(value: Any, where: str, *, lo: float | None = None, hi: float | None = None,
                 integer: bool = False, name: str | None = None) -> Any:
    """``value`` if it is a finite number (an integer when ``integer``) within [lo, hi].

    Booleans are not numbers. Without ``lo``/``hi`` the bounds are ``limits_of(name)`` (name
    defaults to the last dotted part of ``where``). Returns the value unchanged.
    """
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FleetsimInputError(where, value, f"expected {kind}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FleetsimInputError(where, value, "expected a finite number")
        if integer and not value.is_integer():
            raise FleetsimInputError(where, value, "expected an integer")
    if lo is None or hi is None:
        field = name or where.rsplit(".", 1)[-1].split("[", 1)[0]
        default_lo, default_hi = limits_of(field)
        lo = default_lo if lo is None else lo
        hi = default_hi if hi is None else hi
    if not lo <= value <= hi:
        raise FleetsimInputError(where, value, f"must be between {_bound(lo)} and {_bound(hi)}")
    return value


def _bound(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e19 else f"{x:g}"


# ---- files --------------------------------------------------------------------------------
def read_bytes(path: str | os.PathLike[str], what: str) -> bytes:
    """The bytes of a regular file; folders, devices, pipes, unreadable and huge files fail."""
    p = Path(path)
    where = f"{what} {p}"
    try:
        st = os.stat(p)
    except (FileNotFoundError, NotADirectoryError):
        raise FleetsimInputError(where, "no such file", f"check the {what} path") from None
    except OSError as err:
        raise FleetsimInputError(where, err.strerror or str(err),
                                 f"cannot read the {what}; check its path and permissions"
                                 ) from None
    if stat.S_ISDIR(st.st_mode):
        raise FleetsimInputError(where, "a folder", f"give the path of a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise FleetsimInputError(where, "not a regular file (a device or pipe)",
                                 f"give the path of a {what} file")
    if st.st_size > MAX_FILE_BYTES:
        raise FleetsimInputError(where, f"{st.st_size:,} bytes",
                                 f"larger than {MAX_FILE_BYTES // 2**30} GiB; split or filter it")
    try:
        with open(p, "rb") as f:
            return _read_bounded(f, st.st_size, where)
    except OSError as err:
        raise FleetsimInputError(where, err.strerror or str(err),
                                 f"cannot read the {what}; check its permissions") from None


def _read_bounded(f: Any, size: int, where: str) -> bytes:
    # read(n) allocates n bytes before reading: ask for the file's size (one byte more to see
    # growth), never for the 16 GiB limit, so a small file reads under an address-space cap.
    data = f.read(size + 1)
    if len(data) <= size:
        return data
    buf = bytearray(data)  # the file grew since stat(): read on in 1 MiB chunks, bounded
    while chunk := f.read(2**20):
        buf += chunk
        if len(buf) > MAX_FILE_BYTES:
            raise FleetsimInputError(where, f"more than {MAX_FILE_BYTES:,} bytes",
                                     f"larger than {MAX_FILE_BYTES // 2**30} GiB; split or "
                                     f"filter it")
    return bytes(buf)


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The text of a UTF-8 file (a leading BOM is dropped); binary files fail with the byte."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FleetsimInputError(
            f"{what} {path}, byte {err.start}", data[err.start:err.start + 8],
            f"not UTF-8 text; give a text {what} (decompress or convert it first)") from None


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A TOML file as plain data; syntax errors name the file, line and column."""
    text = read_text(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise FleetsimInputError(f"{what} {path}", str(err), "fix the TOML syntax") from None


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """A JSON file as plain data. NaN and Infinity literals load as floats, so the check of
    the field that holds one (``check_number``) names it."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise FleetsimInputError(f"{what} {path}", f"line {err.lineno}",
                                 f"invalid JSON ({err.msg}); fix the file") from None


def non_finite_path(data: Any, path: str = "") -> str | None:
    """The dotted path of the first NaN or infinite float in plain data, or None."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (path or "<value>")
    if isinstance(data, dict):
        for k, v in data.items():
            found = non_finite_path(v, f"{path}.{k}" if path else str(k))
            if found is not None:
                return found
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            found = non_finite_path(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def to_json(data: Any) -> str:
    """``data`` as indented JSON; a NaN or infinity anywhere is an error naming its path
    (strict JSON has neither, and a non-finite result means a bug, not a number)."""
    try:
        return json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        raise ValueError(f"non-finite number at {non_finite_path(data)} in JSON output"
                         ) from None
