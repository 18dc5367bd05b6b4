"""Measured kernel tables from aiconfigurator-core (NVIDIA, Apache-2.0), read with pyarrow.

The package ships per-system parquet files under
``systems/data/<system>/<op>/<framework>/<version>/*.parquet``; every ``latency`` column is in
milliseconds per kernel call (checked: a causal 16k-token prefill with 32 heads of 128 on H100
reads 3.31, i.e. 665 TFLOP/s). We read the vLLM tables (NCCL for large all-reduces), keep only
the columns we use, convert to seconds, and cache them in-process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

_MS = 1e-3


@dataclass(frozen=True, slots=True)
class Table:
    """Columns of one parquet file after filtering (latency already in seconds)."""

    columns: dict[str, NDArray]  # column name -> values
    label: str  # "aiconfigurator-core <system>/<framework> <version> <file>"

    def __len__(self) -> int:
        return len(self.columns["latency_s"])

    def where(self, **equal: object) -> Table:
        mask = np.ones(len(self), dtype=bool)
        for col, value in equal.items():
            mask &= self.columns[col] == value
        return Table({k: v[mask] for k, v in self.columns.items()}, self.label)


@functools.cache
def _data_root() -> Path | None:
    try:
        import aiconfigurator_core
    except ImportError:  # pragma: no cover
        return None
    return Path(aiconfigurator_core.__file__).parent / "systems" / "data"


def known_systems() -> tuple[str, ...] | None:
    """Systems with measured tables (``GPUSpec.aic_system`` values), or None without the
    package."""
    root = _data_root()
    if root is None or not root.is_dir():
        return None
    return tuple(sorted(p.name for p in root.iterdir() if p.is_dir()))


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in v.replace("rc", ".").split("."))


def find_table(system: str, op: str, framework: str, filename: str) -> Path | None:
    """Newest ``<framework>/<version>/<filename>`` for ``system/op``, or None."""
    root = _data_root()
    if root is None:
        return None
    base = root / system / op / framework
    if not base.is_dir():
        return None
    versions = sorted(
        (p.name for p in base.iterdir() if (p / filename).is_file()), key=_version_key
    )
    return base / versions[-1] / filename if versions else None


def _to_numpy(column) -> NDArray:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        # arrow -> numpy for strings goes through pandas (slow import); a list is fast enough
        return np.array(column.to_pylist(), dtype=object)
    chunks = [_chunk_to_numpy(chunk) for chunk in column.chunks]
    return np.concatenate(chunks) if chunks else np.array([])


_NUMPY_BY_ARROW = {"int64": np.int64, "int32": np.int32, "double": np.float64, "float": np.float32}


def _chunk_to_numpy(chunk) -> NDArray:
    # pyarrow's to_numpy() checks for pandas on every call (a 0.3 s import); a null-free
    # fixed-width array is just its data buffer
    dtype = _NUMPY_BY_ARROW.get(str(chunk.type))
    if dtype is None or chunk.null_count:
        return chunk.to_numpy(zero_copy_only=False)
    return np.frombuffer(
        chunk.buffers()[1],
        dtype=dtype,
        count=len(chunk),
        offset=chunk.offset * np.dtype(dtype).itemsize,
    )


@functools.cache
def load_table(
    system: str, op: str, framework: str, filename: str, columns: tuple[str, ...], **filters: object
) -> Table | None:
    """Read ``columns`` (+ latency) of one table, rows matching ``filters``; None if absent."""
    path = find_table(system, op, framework, filename)
    if path is None:
        return None
    import pyarrow.parquet as pq  # not pyarrow.compute/dataset: slow to import

    wanted = list(dict.fromkeys((*columns, *filters, "latency")))
    pf = pq.ParquetFile(path)
    if any(c not in pf.schema_arrow.names for c in wanted):
        return None
    table = pf.read(columns=wanted)
    raw = {c: _to_numpy(table.column(c)) for c in wanted}
    mask = np.ones(table.num_rows, dtype=bool)
    for col, value in filters.items():
        mask &= raw[col] == value
    cols = {c: raw[c][mask] for c in columns}
    cols["latency_s"] = raw["latency"][mask] * _MS
    version = path.parent.name
    label = f"aiconfigurator-core {system}/{framework} {version} {path.name}"
    return Table(cols, label)
