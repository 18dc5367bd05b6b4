"""The recorder's columns and the workload source read and write in chunks (bounded memory
at a million requests); a run of a few thousand requests never crosses a chunk, so the
boundaries are attacked here with tiny chunks."""

import numpy as np

from fleetsim.serving import sources
from fleetsim.serving.recorder import Columns
from fleetsim.serving.sources import WorkloadSource
from fleetsim.workloads.workload import Workload


def _append(table: Columns, x_s: float, count: int) -> None:
    """As the recorder appends a row: packed into the buffer, flushed when full."""
    table.pack_into(table.buf, table.num_pending * table.row_bytes, x_s, count)
    table.num_pending += 1
    if table.num_pending >= table.chunk_rows:
        table.flush()


def _filled(num_rows: int, chunk_rows: int) -> tuple[Columns, list[tuple[float, int]]]:
    table = Columns(("x_s", "count"), frozenset({"count"}), chunk_rows=chunk_rows)
    rows = []
    for i in range(num_rows):
        _append(table, i + 0.5, 3 * i)
        rows.append((i + 0.5, 3 * i))
    return table, rows


def test_columns_hold_every_row_in_order_across_chunks_and_growth():
    for num_rows in (0, 1, 2, 3, 4, 7, 13):
        table, rows = _filled(num_rows, chunk_rows=2)
        cols = table.columns()
        assert table.num_rows == num_rows
        assert cols["x_s"].tolist() == [x for x, _ in rows]
        assert cols["count"].tolist() == [c for _, c in rows]
        assert cols["count"].dtype == np.int64 and cols["x_s"].dtype == np.float64
        assert table.columns()["x_s"].tolist() == cols["x_s"].tolist()  # again: the same


def test_columns_read_mid_run_and_later_rows_go_after():
    table, rows = _filled(5, chunk_rows=2)
    first = table.columns()
    _append(table, 99.5, 7)
    assert first["x_s"].tolist() == [x for x, _ in rows]  # an earlier read is unchanged
    assert table.columns()["count"].tolist() == [c for _, c in rows] + [7]


def test_rows_from_any_start_as_the_flat_rows():
    table, rows = _filled(9, chunk_rows=2)
    _append(table, 9.5, 27)  # one row not flushed yet
    rows.append((9.5, 27))
    for start in range(len(rows) + 1):
        assert table.rows_from(start) == [v for row in rows[start:] for v in row]


def test_nan_and_large_counts_come_back_as_written():
    # (a request without an inter-token gap records NaN; ids and token counts are ints far
    # below 2**53, which doubles hold exactly)
    table = Columns(("x_s", "count"), frozenset({"count"}), chunk_rows=4)
    _append(table, float("nan"), 2**52 + 1)
    _append(table, 1e-300, 0)
    cols = table.columns()
    assert np.isnan(cols["x_s"][0]) and cols["x_s"][1] == 1e-300
    assert cols["count"].tolist() == [2**52 + 1, 0]


def test_workload_source_reads_every_row_across_chunks(monkeypatch):
    monkeypatch.setattr(sources, "CHUNK_ROWS", 3)
    n = 10
    workload = Workload(arrival_s=np.arange(n) * 0.25, num_prompt_tokens=np.arange(n) + 10,
                        num_output_tokens=np.arange(n) + 100, priority=np.arange(n) % 3)
    source = WorkloadSource(workload)
    for i in [*range(n), 4, 0, 9]:  # in order, then back and forth
        req = source.request(100 + i, i)
        assert (req.id, req.arrival_s, req.num_prompt_tokens, req.max_output_tokens,
                req.priority) == (100 + i, i * 0.25, i + 10, i + 100, i % 3)
