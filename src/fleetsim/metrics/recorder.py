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
        cols = list(zip(*self._rows, strict=True)) if self._rows else [()] * len(REQUEST_COLUMNS)
        int_cols = {"request_id", "replica_id", "num_prompt_tokens", "num_output_tokens",
                    "num_preemptions", "num_prefix_hit_tokens", "num_computed_tokens",
                    "num_recomputed_tokens", "prefill_replica_id"}
        requests = {
            name: np.asarray(col, dtype=np.int64 if name in int_cols else np.float64)
            for name, col in zip(REQUEST_COLUMNS, cols, strict=True)
        }
        # By finish time, ties by request id: replicas may report a finish inside a
        # fast-forward window after later events elsewhere.
        order = np.lexsort((requests["request_id"], requests["finish_s"]))
        requests = {name: col[order] for name, col in requests.items()}
        tl_names = ("end_s", "replica_id", "busy_s", "num_steps", "num_tokens",
                    "num_used_blocks", "num_running", "num_waiting")
        tl_cols = list(zip(*self._timeline, strict=True)) if self._timeline else [()] * 8
        timeline = {
            name: np.asarray(col, dtype=np.float64 if name in ("end_s", "busy_s") else np.int64)
            for name, col in zip(tl_names, tl_cols, strict=True)
        }
        return Records(requests, timeline, self.num_steps, dict(self.busy_s_by_replica),
                       dict(self.kv_block_seconds_by_replica))
