"""Columnar recording of finished requests and of steps, converted to arrays once at the end."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.serving.request import Request

REQUEST_COLUMNS = (
    "request_id", "replica_id", "arrival_s", "num_prompt_tokens", "num_output_tokens",
    "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
    "num_prefix_hit_tokens", "num_computed_tokens", "num_recomputed_tokens",
    "prefill_replica_id", "kv_transfer_s",
)


@dataclass(frozen=True, slots=True, eq=False)
class Records:
    """Everything a run recorded, as arrays."""

    requests: dict[str, NDArray]  # column -> one value per finished request, by finish time
    # (ties by request id)
    timeline: dict[str, NDArray]  # column -> one value per step event (a fast-forward is one)
    num_steps: int
    busy_s_by_replica: dict[int, float]
    kv_block_seconds_by_replica: dict[int, float]


class Recorder:
    """Receives ``on_finish``/``on_step`` from replicas (cheap appends only)."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []
        self._timeline: list[tuple] = []
        self.num_steps = 0
        self.busy_s_by_replica: dict[int, float] = {}
        self.kv_block_seconds_by_replica: dict[int, float] = {}

    def on_finish(self, replica_id: int, req: Request) -> None:
        self._rows.append((
            req.id, replica_id, req.arrival_s, req.num_prompt_tokens, req.num_output_tokens,
            req.first_scheduled_s, req.first_token_s, req.finish_s, req.num_preemptions,
            req.num_prefix_hit_tokens, req.num_computed_tokens_total, req.num_recomputed_tokens,
            replica_id if req.prefill_replica_id is None else req.prefill_replica_id,
            req.kv_transfer_s,
        ))

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
        self._timeline.append(
            (end_s, replica_id, busy_s, num_steps, num_tokens, num_used_blocks, num_running,
             num_waiting))

    def records(self) -> Records:
        int_cols = {"request_id", "replica_id", "num_prompt_tokens", "num_output_tokens",
                    "num_preemptions", "num_prefix_hit_tokens", "num_computed_tokens",
                    "num_recomputed_tokens", "prefill_replica_id"}
        requests = _columns(self._rows, REQUEST_COLUMNS, int_cols)
        # By finish time, ties by request id: replicas may report a finish inside a
        # fast-forward window after later events elsewhere.
        order = np.lexsort((requests["request_id"], requests["finish_s"]))
        requests = {name: col[order] for name, col in requests.items()}
        timeline = _columns(self._timeline, TIMELINE_COLUMNS,
                            set(TIMELINE_COLUMNS) - {"end_s", "busy_s"})
        return Records(requests, timeline, self.num_steps, dict(self.busy_s_by_replica),
                       dict(self.kv_block_seconds_by_replica))


TIMELINE_COLUMNS = ("end_s", "replica_id", "busy_s", "num_steps", "num_tokens",
                    "num_used_blocks", "num_running", "num_waiting")


def _columns(rows: list[tuple], names: tuple[str, ...], int_cols: set[str]) -> dict[str, NDArray]:
    """Rows of numbers as one array per column: one float64 matrix, then the integer columns
    cast back (exact: every count and id here is far below 2**53)."""
    table = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    return {name: (table[:, j].astype(np.int64) if name in int_cols else table[:, j].copy())
            for j, name in enumerate(names)}
