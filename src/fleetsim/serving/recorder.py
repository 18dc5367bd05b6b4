"""Columnar recording of finished requests and of steps, converted to arrays once at the end.

The engine's sink (``metrics.summary`` reads its ``Records``). ``OnlineMetrics`` is the view
of what has finished so far that controllers read during a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.serving.request import Request

REQUEST_COLUMNS = (
    "request_id", "replica_id", "arrival_s", "num_prompt_tokens", "num_output_tokens",
    "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "num_prefix_hit_tokens", "num_computed_tokens", "num_recomputed_tokens",
    "prefill_replica_id", "kv_transfer_s", "num_swaps",
)


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


class Recorder:
    """Receives ``on_finish``/``on_step`` from replicas (cheap appends only)."""

    def __init__(self, timeline_origin_s: float = 0.0, timeline_bin_s: float = 0.0,
                 pool_of: list[str] | None = None) -> None:
        # Flat lists, one row after another: no tuple per row (about a third of the memory
        # a list of tuples takes), and cheaper to fill than an ``array('d')``, which parses
        # every value it is given.
        self._rows: list[float] = []
        self._timeline: list[float] = []
        self.num_steps = 0
        self.busy_s_by_replica: dict[int, float] = {}
        self.kv_block_seconds_by_replica: dict[int, float] = {}
        self.timeline_origin_s = timeline_origin_s
        self.timeline_bin_s = timeline_bin_s
        # Online metrics are kept only when asked for (a controller reads them).
        self.online: OnlineMetrics | None = None
        self.pool_of: list[str] = pool_of if pool_of is not None else []  # replica -> pool

    def keep_online_metrics(self) -> OnlineMetrics:
        if self.online is None:
            self.online = OnlineMetrics()
        return self.online

    def on_finish(self, replica_id: int, req: Request) -> None:
        self._rows.extend((
            req.id, replica_id, req.arrival_s, req.num_prompt_tokens, req.num_output_tokens,
            req.first_scheduled_s, req.first_token_s, req.finish_s, req.num_preemptions,
            req.num_prefix_hit_tokens, req.num_computed_tokens_total, req.num_recomputed_tokens,
            replica_id if req.prefill_replica_id is None else req.prefill_replica_id,
            req.kv_transfer_s, req.num_swaps,
        ))
        online = self.online
        if online is not None:
            pool = self.pool_of[replica_id] if replica_id < len(self.pool_of) else "default"
            online.num_finished_by_pool[pool] = online.num_finished_by_pool.get(pool, 0) + 1
            ttft = online.sum_ttft_s_by_pool
            ttft[pool] = ttft.get(pool, 0.0) + (req.first_token_s - req.arrival_s)
            e2e = online.sum_e2e_s_by_pool
            e2e[pool] = e2e.get(pool, 0.0) + (req.finish_s - req.arrival_s)

    def on_step(
        self, replica_id: int, end_s: float, busy_s: float, kv_block_seconds: float,
        num_steps: int, num_tokens: int, num_used_blocks: int, num_running: int,
        num_waiting: int,
    ) -> None:
        self.num_steps += num_steps
        busy = self.busy_s_by_replica
        busy[replica_id] = busy.get(replica_id, 0.0) + busy_s
        kvs = self.kv_block_seconds_by_replica
        kvs[replica_id] = kvs.get(replica_id, 0.0) + kv_block_seconds
        self._timeline.extend(
            (end_s, replica_id, busy_s, num_steps, num_tokens, num_used_blocks, num_running,
             num_waiting, kv_block_seconds))

    def records(self) -> Records:
        int_cols = {"request_id", "replica_id", "num_prompt_tokens", "num_output_tokens",
                    "num_preemptions", "num_prefix_hit_tokens", "num_computed_tokens",
                    "num_recomputed_tokens", "prefill_replica_id", "num_swaps"}
        requests = _columns(self._rows, REQUEST_COLUMNS, int_cols)
        # By finish time, ties by request id: replicas may report a finish inside a
        # fast-forward window after later events elsewhere.
        order = np.lexsort((requests["request_id"], requests["finish_s"]))
        requests = {name: col[order] for name, col in requests.items()}
        timeline = _columns(self._timeline, TIMELINE_COLUMNS,
                            set(TIMELINE_COLUMNS) - {"end_s", "busy_s", "kv_block_seconds"})
        return Records(requests, timeline, self.num_steps, dict(self.busy_s_by_replica),
                       dict(self.kv_block_seconds_by_replica), self.timeline_origin_s,
                       self.timeline_bin_s)


TIMELINE_COLUMNS = ("end_s", "replica_id", "busy_s", "num_steps", "num_tokens",
                    "num_used_blocks", "num_running", "num_waiting", "kv_block_seconds")


def _columns(rows: list[float], names: tuple[str, ...], int_cols: set[str]
             ) -> dict[str, NDArray]:
    """Rows of numbers as one array per column: one float64 matrix, then the integer columns
    cast back (exact: every count and id here is far below 2**53)."""
    table = np.array(rows, dtype=np.float64).reshape(-1, len(names))
    return {name: (table[:, j].astype(np.int64) if name in int_cols else table[:, j].copy())
            for j, name in enumerate(names)}
