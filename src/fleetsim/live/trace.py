"""Live traffic as a trace: fleetsim's generic JSONL (``arrival_s``, ``prompt_tokens``,
``output_tokens``, ``hash_ids``) plus what was measured (``ttft_s``, ``tpot_s``, ``e2e_s``,
``status``, ``backend``), so ``fleetsim run`` replays it and ``fleetsim compare`` holds the
measurements against the prediction.

Rows are written in arrival order (the loader requires it) as soon as every earlier arrival
has finished; ``hash_ids`` are chained hashes of ``hash_block_tokens``-token blocks, and each
row says its ``hash_block_tokens`` (16 by default), which the loader reads. ``request_id`` is
the ``X-Request-Id`` the request carried (``compare --engine`` matches rows by it), ``lag_s``
the worst event-loop lag of the writer while the request was in flight (``lag.py``).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_text

LATENCIES = ("ttft_s", "tpot_s", "e2e_s")


class TraceWriter:
    """Rows of one trace file, written in arrival order (``seq`` 0, 1, 2, ... as requests
    arrive; each arrival must be reported by ``write`` or ``skip``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self._file: IO[str] | None = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
        except OSError as err:
            raise FleetsimInputError("--record", str(path),
                                     f"cannot write it ({err.strerror})") from None
        self._next = 0
        self._pending: dict[int, dict[str, Any] | None] = {}  # seq -> row (None: skipped)
        self.num_rows = 0

    def write(self, seq: int, row: dict[str, Any]) -> None:
        self._pending[seq] = row
        self._flush()

    def skip(self, seq: int) -> None:
        """Arrival ``seq`` leaves no row (refused before it was served)."""
        self._pending[seq] = None
        self._flush()

    def _flush(self) -> None:
        f = self._file
        if f is None:
            return
        wrote = False
        while self._next in self._pending:
            row = self._pending.pop(self._next)
            self._next += 1
            if row is not None:
                f.write(json.dumps(_finite(row), separators=(",", ":")) + "\n")
                self.num_rows += 1
                wrote = True
        if wrote:
            f.flush()

    def close(self) -> None:
        """Write what is pending (arrivals never reported are left out) and close."""
        if self._file is None:
            return
        for seq in sorted(self._pending):
            self._next = seq
            self._flush()
        self._file.close()
        self._file = None


def trace_row(*, arrival_s: float, num_prompt_tokens: int, num_output_tokens: int,
              hash_ids: Iterable[int], ttft_s: float | None, tpot_s: float | None,
              e2e_s: float | None, status: str = "ok", hash_block_tokens: int,
              **extra: Any) -> dict[str, Any]:
    """One row: ``num_output_tokens`` are the tokens actually produced. A request that
    produced none (rejected by its backend, failed before its first token) is written with
    ``served: false``, which ``fleetsim run`` skips (with a count): its asked ``max_tokens``
    says nothing of what a server did. ``hash_block_tokens`` travels with every row, so a
    replay needs no flag to read ``hash_ids``."""
    served = num_output_tokens > 0
    return {"arrival_s": arrival_s, "prompt_tokens": num_prompt_tokens,
            "output_tokens": num_output_tokens, "hash_ids": list(hash_ids),
            "hash_block_tokens": hash_block_tokens, "ttft_s": ttft_s, "tpot_s": tpot_s,
            "e2e_s": e2e_s, "status": status, "served": served, **extra}


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()}


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a live trace (one JSON object per line)."""
    text = read_text(path, "live trace")
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise FleetsimInputError(f"{path}, line {i}", line[:60],
                                     "expected one JSON object per line") from None
        if not isinstance(row, dict):
            raise FleetsimInputError(f"{path}, line {i}", line[:60], "expected a JSON object")
        rows.append(row)
    return rows


def measured(row: dict[str, Any], key: str) -> float | None:
    """The finite number ``row[key]`` of a successful row, else None."""
    v = row.get(key)
    if row.get("status", "ok") != "ok" or isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def read_latencies(path: str | os.PathLike[str]) -> dict[str, list[float]]:
    """The measured latencies of a live trace's successful rows: name -> values (s)."""
    rows = read_rows(path)
    out: dict[str, list[float]] = {k: [] for k in LATENCIES}
    for row in rows:
        for k in LATENCIES:
            v = measured(row, k)
            if v is not None:
                out[k].append(v)
    if not out["ttft_s"]:
        raise FleetsimInputError(str(path), f"{len(rows)} rows", "no successful row with "
                                 "ttft_s: record it with fleetsim gateway --record or fleetsim "
                                 "load --out")
    return out
