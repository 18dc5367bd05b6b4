"""Columnar recording of finished requests and of steps, converted to arrays once at the end.

The engine's sink (``metrics.summary`` reads its ``Records``). ``OnlineMetrics`` is the view
of what has finished so far that controllers read during a run.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.serving.request import Request, itl_stats

REQUEST_COLUMNS = (
    "request_id", "replica_id", "arrival_s", "num_prompt_tokens", "num_output_tokens",
    "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "num_prefix_hit_tokens", "num_computed_tokens", "num_recomputed_tokens",
    "prefill_replica_id", "kv_transfer_s", "num_swaps", "last_token_s", "itl_p99_s",
    "itl_max_s",
)


@dataclass(frozen=True, slots=True)
class AbortedRequest:
    """A request ended before it finished (``Replica.abort``)."""

    request_id: int
    replica_id: int
    arrival_s: float
    abort_s: float
    num_output_tokens: int
    """Output tokens emitted before the abort."""
    num_computed_tokens: int
    """Tokens computed for it, over all its admissions (as the requests' column)."""
    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class Records:
    """Everything a run recorded, as arrays."""

    requests: dict[str, NDArray]  # column -> one value per finished request, by finish time
    # (ties by request id)
    timeline: dict[str, NDArray]  # column -> one value per step, or per stretch of a
    # fast-forward window with a fixed batch (a window's stretches lie in one timeline bin)
    num_steps: int
    busy_s_by_replica: dict[int, float]
    kv_block_seconds_by_replica: dict[int, float]
    timeline_origin_s: float = 0.0  # timeline bins: [origin + m * bin_s, origin + (m+1) * bin_s)
    timeline_bin_s: float = 0.0  # 0: not binned (windows ran past bin edges)
    itl_gaps_s: NDArray | None = None  # every gap between output tokens, as distinct values
    itl_counts: NDArray | None = None  # ... with how many times each occurred
    aborted: tuple[AbortedRequest, ...] = ()  # requests ended early, in abort order


class OnlineMetrics:
    """What has finished so far, per pool: counts and latency sums (read during a run)."""

    __slots__ = ("num_finished_by_pool", "sum_e2e_s_by_pool", "sum_ttft_s_by_pool")

    def __init__(self) -> None:
        self.num_finished_by_pool: dict[str, int] = {}
        self.sum_ttft_s_by_pool: dict[str, float] = {}
        self.sum_e2e_s_by_pool: dict[str, float] = {}

    @property
    def num_finished(self) -> int:
        return sum(self.num_finished_by_pool.values())

    def mean_ttft_s(self, pool: str) -> float:
        n = self.num_finished_by_pool.get(pool, 0)
        return self.sum_ttft_s_by_pool.get(pool, 0.0) / n if n else float("nan")

    def mean_e2e_s(self, pool: str) -> float:
        n = self.num_finished_by_pool.get(pool, 0)
        return self.sum_e2e_s_by_pool.get(pool, 0.0) / n if n else float("nan")


class _ReplicaSums:
    """One replica's busy seconds and KV block-seconds, summed over its steps."""

    __slots__ = ("busy_s", "kv_block_s")

    def __init__(self) -> None:
        self.busy_s = 0.0
        self.kv_block_s = 0.0


class Recorder:
    """Receives ``on_finish``/``on_step`` from replicas (cheap appends only)."""

    def __init__(self, timeline_origin_s: float = 0.0, timeline_bin_s: float = 0.0,
                 pool_of: list[str] | None = None) -> None:
        self._requests = Columns(REQUEST_COLUMNS, REQUEST_INT_COLUMNS)
        self._timeline = Columns(TIMELINE_COLUMNS, TIMELINE_INT_COLUMNS)
        self.num_steps = 0
        # Busy and KV block-seconds summed per replica, indexed by replica id (None until
        # it steps; a dict's lookups cost more per step), and the ids in the order first
        # recorded: the order of the dicts that ``busy_s_by_replica`` and ``records()`` give
        # (sums over them add in that order). Objects rather than lists of floats: a
        # compiled ``floats[i] += x`` is a generic add of two boxed floats.
        self._sums: list[_ReplicaSums | None] = []
        self._replica_order: list[int] = []
        self.timeline_origin_s = timeline_origin_s
        self.timeline_bin_s = timeline_bin_s
        # Online metrics are kept only when asked for (a controller reads them).
        self.online: OnlineMetrics | None = None
        self.pool_of: list[str] = pool_of if pool_of is not None else []  # replica -> pool
        # Inter-token gaps (serving/itl.py): (gap, count) pairs, and windows' end times
        # (one row per window: offset into _win_ends, steps, decoders) with the steps at
        # which decoders left them (window index, step).
        # Lists for the small records (an ``array`` parses every value it is given, which
        # costs more than the list); window end times packed as doubles (8 bytes each).
        self._itl_pairs: list[float] = []
        self._win_ends = bytearray()
        self._num_win_ends = 0
        self._win_rows: list[int] = []
        self._win_finishes: list[int] = []
        self.aborted: list[AbortedRequest] = []

    def keep_online_metrics(self) -> OnlineMetrics:
        if self.online is None:
            self.online = OnlineMetrics()
        return self.online

    def itl_gap(self, gap_s: float, count: int) -> None:
        self._itl_pairs.extend((gap_s, count))

    def itl_window(self, ends: list[float], num_steps: int, num_decoders: int,
                   finishes: list[int]) -> None:
        """Steps 1 .. num_steps - 1 of a window: gap ends[j] - ends[j - 1] for each decoder
        still in it (decoders leave after their step ``finishes[i]`` - 1)."""
        w = len(self._win_rows) // 3
        self._win_rows.extend((self._num_win_ends, num_steps, num_decoders))
        self._win_ends += _packer(num_steps).pack(*ends[:num_steps])
        self._num_win_ends += num_steps
        for f in finishes:
            self._win_finishes.extend((w, f))

    def on_finish(self, replica_id: int, req: Request) -> None:
        itl_p99, itl_max = itl_stats(req)
        table = self._requests
        table.pack_into(
            table.buf, table.num_pending * table.row_bytes,
            req.id, replica_id, req.arrival_s, req.num_prompt_tokens, req.num_output_tokens,
            req.first_scheduled_s, req.first_token_s, req.finish_s, req.num_preemptions,
            req.num_prefix_hit_tokens, req.num_computed_tokens_total, req.num_recomputed_tokens,
            replica_id if req.prefill_replica_id is None else req.prefill_replica_id,
            req.kv_transfer_s, req.num_swaps, req.last_token_s, itl_p99, itl_max)
        table.num_pending += 1
        if table.num_pending >= table.chunk_rows:
            table.flush()
        online = self.online
        if online is not None:
            pool = self.pool_of[replica_id] if replica_id < len(self.pool_of) else "default"
            online.num_finished_by_pool[pool] = online.num_finished_by_pool.get(pool, 0) + 1
            ttft = online.sum_ttft_s_by_pool
            ttft[pool] = ttft.get(pool, 0.0) + (req.first_token_s - req.arrival_s)
            e2e = online.sum_e2e_s_by_pool
            e2e[pool] = e2e.get(pool, 0.0) + (req.finish_s - req.arrival_s)

    @property
    def num_finished(self) -> int:
        """Requests finished so far."""
        return self._requests.num_rows

    def finished_since(self, start: int) -> list[tuple[float, float, float, int]]:
        """``(arrival_s, first_token_s, finish_s, num_output_tokens)`` of the requests that
        finished after the first ``start`` (a monitor's window)."""
        rows = self._requests.rows_from(start)
        width = len(REQUEST_COLUMNS)
        return [(rows[i + 2], rows[i + 6], rows[i + 7], int(rows[i + 4]))
                for i in range(0, len(rows), width)]

    def on_abort(self, replica_id: int, req: Request) -> None:
        assert req.abort_reason is not None
        self.aborted.append(AbortedRequest(
            req.id, replica_id, req.arrival_s, req.finish_s, req.num_output_tokens,
            req.num_computed_tokens_total, req.abort_reason))

    def on_step(
        self, replica_id: int, end_s: float, busy_s: float, kv_block_seconds: float,
        num_steps: int, num_tokens: int, num_used_blocks: int, num_running: int,
        num_waiting: int,
    ) -> None:
        self.num_steps += num_steps
        sums = self._sums[replica_id] if 0 <= replica_id < len(self._sums) else None
        if sums is None:
            sums = self._first_step(replica_id)
        sums.busy_s += busy_s
        sums.kv_block_s += kv_block_seconds
        table = self._timeline
        table.pack_into(
            table.buf, table.num_pending * table.row_bytes, end_s, replica_id, busy_s,
            num_steps, num_tokens, num_used_blocks, num_running, num_waiting, kv_block_seconds)
        table.num_pending += 1
        if table.num_pending >= table.chunk_rows:
            table.flush()

    def _first_step(self, replica_id: int) -> _ReplicaSums:
        if replica_id < 0:
            raise ValueError(f"replica id {replica_id} is negative")
        grow = replica_id + 1 - len(self._sums)
        if grow > 0:
            self._sums.extend([None] * grow)
        sums = _ReplicaSums()
        self._sums[replica_id] = sums
        self._replica_order.append(replica_id)
        return sums

    def _stepped(self, replica_id: int) -> _ReplicaSums:
        sums = self._sums[replica_id]
        assert sums is not None
        return sums

    @property
    def busy_s_by_replica(self) -> dict[int, float]:
        """Busy seconds so far per replica that has stepped (in the order they first did)."""
        return {r: self._stepped(r).busy_s for r in self._replica_order}

    @property
    def kv_block_seconds_by_replica(self) -> dict[int, float]:
        """KV block-seconds so far per replica that has stepped (as ``busy_s_by_replica``)."""
        return {r: self._stepped(r).kv_block_s for r in self._replica_order}

    def records(self) -> Records:
        requests = self._requests.columns()
        # By finish time, ties by request id: replicas may report a finish inside a
        # fast-forward window after later events elsewhere. (One column at a time: the
        # sorted copies never all coexist with the originals.)
        order = np.lexsort((requests["request_id"], requests["finish_s"]))
        for name in REQUEST_COLUMNS:
            requests[name] = requests[name][order]
        timeline = self._timeline.columns()
        gaps, counts = self._itl_arrays()
        return Records(requests, timeline, self.num_steps, self.busy_s_by_replica,
                       self.kv_block_seconds_by_replica, self.timeline_origin_s,
                       self.timeline_bin_s, gaps, counts, tuple(self.aborted))

    def _itl_arrays(self) -> tuple[NDArray, NDArray]:
        """All gaps between output tokens as (distinct gap, count), sorted by gap."""
        pairs = np.array(self._itl_pairs, dtype=np.float64).reshape(-1, 2)
        gaps, counts = [pairs[:, 0]], [pairs[:, 1]]
        rows = np.array(self._win_rows, dtype=np.int64).reshape(-1, 3)
        if rows.size:
            ends = np.frombuffer(self._win_ends, dtype=np.float64)
            offset, steps, num = rows[:, 0], rows[:, 1], rows[:, 2]
            # decoders in step j of each window: num, less those that left at steps <= j
            size = ends.size + 1
            delta = (np.bincount(offset + 1, weights=num, minlength=size)
                     - np.bincount(offset + steps, weights=num, minlength=size))
            fin = np.array(self._win_finishes, dtype=np.int64).reshape(-1, 2)
            if fin.size:
                w, f = fin[:, 0], fin[:, 1]
                delta -= np.bincount(offset[w] + f, minlength=size)
                delta += np.bincount(offset[w] + steps[w], minlength=size)
            weight = np.rint(np.cumsum(delta)[:-1]).astype(np.int64)
            inner = weight > 0
            inner[0] = False
            idx = np.flatnonzero(inner)
            gaps.append(ends[idx] - ends[idx - 1])
            counts.append(weight[idx].astype(np.float64))
        g = np.concatenate(gaps)
        c = np.concatenate(counts)
        order = np.argsort(g, kind="stable")
        g, c = g[order], c[order]
        if g.size:  # merge equal gaps
            keep = np.concatenate(([True], g[1:] != g[:-1]))
            starts = np.flatnonzero(keep)
            c = np.add.reduceat(c, starts)
            g = g[starts]
        return g, c.astype(np.int64)


TIMELINE_COLUMNS = ("end_s", "replica_id", "busy_s", "num_steps", "num_tokens",
                    "num_used_blocks", "num_running", "num_waiting", "kv_block_seconds")


TIMELINE_INT_COLUMNS = frozenset(TIMELINE_COLUMNS) - {"end_s", "busy_s", "kv_block_seconds"}
REQUEST_INT_COLUMNS = frozenset((
    "request_id", "replica_id", "num_prompt_tokens", "num_output_tokens", "num_preemptions",
    "num_prefix_hit_tokens", "num_computed_tokens", "num_recomputed_tokens",
    "prefill_replica_id", "num_swaps"))
CHUNK_ROWS = 1 << 12  # (the buffer stays in cache: 4,096 rows of 9-18 doubles)


class Columns:
    """A table of numbers filled row by row: each row is packed (int64s and doubles) into a
    preallocated buffer (``pack_into``: C-speed conversion, no Python object kept per
    number), and every ``chunk_rows`` rows the buffer is written into one array per column
    (``flush``), so a million requests' rows take 8 bytes a number. A column's array
    doubles when full (pages never written are not resident), and ``columns()`` returns
    views of it: no copy at the end, no chunks left to join.

    Writers append a row as ``t.pack_into(t.buf, t.num_pending * t.row_bytes, *row)``, then
    ``t.num_pending += 1`` and ``t.flush()`` once it reaches ``t.chunk_rows`` (written out
    at the two call sites: a method taking ``*row`` would build a tuple per row)."""

    __slots__ = ("arrays", "buf", "chunk_rows", "names", "num_flushed", "num_pending",
                 "pack_into", "row_bytes", "row_dtype")

    def __init__(self, names: tuple[str, ...], int_cols: frozenset[str],
                 chunk_rows: int = CHUNK_ROWS) -> None:
        self.names = names
        # Integer columns packed as int64 ('q'), the others as doubles: an int converted to
        # a double by ``struct`` goes through a temporary float object.
        codes = ["q" if name in int_cols else "d" for name in names]
        packer = struct.Struct("=" + "".join(codes))
        # (A value of the wrong kind, a float in an integer column, fails here, at the row
        # that holds it, not at the end of the run.)
        self.pack_into: Callable[..., None] = packer.pack_into
        self.row_bytes: int = packer.size
        self.row_dtype = np.dtype([(name, np.int64 if code == "q" else np.float64)
                                   for name, code in zip(names, codes, strict=True)])
        self.chunk_rows = chunk_rows
        self.buf = bytearray(chunk_rows * packer.size)  # rows not flushed yet
        self.num_pending = 0
        # One per column, its first ``num_flushed`` values written.
        self.arrays: list[NDArray] = [
            np.empty(chunk_rows, np.int64 if name in int_cols else np.float64) for name in names]
        self.num_flushed = 0

    @property
    def num_rows(self) -> int:
        return self.num_flushed + self.num_pending

    def _pending(self) -> NDArray:
        """The rows not flushed yet, as a structured view of the buffer."""
        return np.frombuffer(self.buf, self.row_dtype, self.num_pending)

    def flush(self) -> None:
        """Move the rows of the buffer into the columns' arrays."""
        m = self.num_pending
        if not m:
            return
        table = self._pending()
        n = self.num_flushed
        arrays = self.arrays
        if n + m > len(arrays[0]):
            capacity = max(2 * len(arrays[0]), n + m)
            for j, old in enumerate(arrays):  # one column at a time: the old one goes at once
                grown = np.empty(capacity, old.dtype)
                grown[:n] = old[:n]
                arrays[j] = grown
        for name, column in zip(self.names, arrays, strict=True):
            column[n:n + m] = table[name]  # (a copy: the buffer is written again)
        self.num_flushed = n + m
        self.num_pending = 0

    def columns(self) -> dict[str, NDArray]:
        """Every row so far, one read-only array per column (views: later rows go after
        them)."""
        self.flush()
        n = self.num_flushed
        out: dict[str, NDArray] = {}
        for name, column in zip(self.names, self.arrays, strict=True):
            view = column[:n]
            view.flags.writeable = False
            out[name] = view
        return out

    def rows_from(self, start: int) -> list[float]:
        """Rows ``start`` onwards, flat, as Python floats (an integer column's values too)."""
        n = self.num_flushed
        pending = self._pending()
        parts = [np.stack([pending[name].astype(np.float64) for name in self.names], axis=1)
                 [max(0, start - n):]]
        if start < n:
            parts.insert(0, np.stack([column[start:n].astype(np.float64)
                                      for column in self.arrays], axis=1))
        flat: list[float] = np.concatenate(parts).ravel().tolist()
        return flat


@functools.lru_cache(maxsize=4096)
def _packer(n: int) -> struct.Struct:
    """Packs ``n`` floats as native doubles (C-speed conversion, unlike ``array.extend``)."""
    return struct.Struct(f"{n}d")
