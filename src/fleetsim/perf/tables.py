"""Measured kernel tables from aiconfigurator-core (NVIDIA, Apache-2.0), read with pyarrow.

The package ships per-system parquet files under
``systems/data/<system>/<op>/<framework>/<version>/*.parquet``; every ``latency`` column is in
milliseconds per kernel call (checked: a causal 16k-token prefill with 32 heads of 128 on H100
reads 3.31, i.e. 665 TFLOP/s). We read the vLLM tables (NCCL for large all-reduces), keep only
the columns we use, convert to seconds, and cache them in-process.

Reading parquet needs pyarrow (0.3 s to import, more than a short run takes), so each table a
run reads is also kept on disk as a small numpy ``.npz`` of exactly the rows and columns it
returned (see ``cache_dir``): later processes load that instead. An entry is named by a hash
of everything its content depends on (this module's ``CACHE_FORMAT``, aiconfigurator-core's
version, the parquet file's path, size and modification time, the columns and filters), so
an upgraded package or a changed file is read afresh; entries are written atomically, and
where the cache folder cannot be written (a read-only install) the table is read from parquet
each time, as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import tempfile
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
    entry = _cache_entry(path, columns, filters)
    cols = _read_entry(entry) if entry is not None else None
    if cols is None:
        cols = _read_parquet(path, columns, filters)
        if entry is not None:
            _write_entry(entry, cols)
    if cols is ABSENT:
        return None
    version = path.parent.name
    label = f"aiconfigurator-core {system}/{framework} {version} {path.name}"
    return Table(cols, label)


# An empty mapping marks "the file lacks a wanted column" (load_table returns None): cached too,
# so that asking for it again needs no pyarrow either.
ABSENT: dict[str, NDArray] = {}


def _read_parquet(path: Path, columns: tuple[str, ...], filters: dict[str, object]
                  ) -> dict[str, NDArray]:
    import pyarrow.parquet as pq  # not pyarrow.compute/dataset: slow to import

    wanted = list(dict.fromkeys((*columns, *filters, "latency")))
    pf = pq.ParquetFile(path)
    if any(c not in pf.schema_arrow.names for c in wanted):
        return ABSENT
    table = pf.read(columns=wanted)
    raw = {c: _to_numpy(table.column(c)) for c in wanted}
    mask = np.ones(table.num_rows, dtype=bool)
    for col, value in filters.items():
        mask &= raw[col] == value
    cols = {c: _plain(raw[c][mask]) for c in columns}
    cols["latency_s"] = raw["latency"][mask] * _MS
    return cols


def _plain(values: NDArray) -> NDArray:
    # strings as a fixed-width unicode array, not objects: the same values and comparisons,
    # and an .npz stores them without pickle (which np.load refuses by default)
    return values.astype(str) if values.dtype == object else values


# ---- on-disk cache --------------------------------------------------------------------------
CACHE_FORMAT = 1  # bump when what an entry holds, or how it is filtered, changes


def cache_dir() -> Path | None:
    """Where table entries live: ``$FLEETSIM_CACHE_DIR/tables``, else
    ``$XDG_CACHE_HOME/fleetsim/tables``, else ``~/.cache/fleetsim/tables``; None (no disk
    cache) when none of these is an absolute path (no home folder, say)."""
    base = os.environ.get("FLEETSIM_CACHE_DIR")
    if base:
        folder = Path(base) / "tables"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                               ".cache")
        folder = Path(xdg) / "fleetsim" / "tables"
    # a relative folder would land wherever the command happens to run
    return folder if folder.is_absolute() else None


@functools.cache
def _aic_version() -> str:
    # importlib.metadata costs 35 ms to import; the dist-info folder beside the package says it
    root = _data_root()
    if root is None:  # pragma: no cover
        return "none"
    site = root.parents[2]
    names = sorted(p.name for p in site.glob("aiconfigurator_core-*.dist-info"))
    return names[-1].removeprefix("aiconfigurator_core-").removesuffix(".dist-info") if names \
        else "unknown"


def _cache_entry(path: Path, columns: tuple[str, ...], filters: dict[str, object]) -> Path | None:
    """The entry file for this read of ``path``, or None (no disk cache for it)."""
    try:
        st = path.stat()
    except OSError:  # pragma: no cover
        return None
    key = repr((CACHE_FORMAT, _aic_version(), str(path.resolve()), st.st_size, st.st_mtime_ns,
                columns, sorted((k, repr(v)) for k, v in filters.items())))
    folder = cache_dir()
    if folder is None:
        return None
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return folder / f"{path.stem}-{digest}.npz"


def _read_entry(entry: Path) -> dict[str, NDArray] | None:
    """The entry's columns, ABSENT, or None when there is no usable entry."""
    try:
        with np.load(entry, allow_pickle=False) as npz:
            cols = {name: npz[name] for name in npz.files}
    except Exception:  # missing, or damaged in any way: rebuilt, never trusted
        return None
    if cols.pop("__absent__", None) is not None:
        return ABSENT
    return cols if "latency_s" in cols else None


def _write_entry(entry: Path, cols: dict[str, NDArray]) -> None:
    """Write atomically (a temp file in the same folder, then rename) so that a concurrent
    reader sees the whole entry or none; skip silently where the folder is not writable."""
    arrays = cols if cols is not ABSENT else {"__absent__": np.array(True)}
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=entry.stem, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, entry)
        tmp = None
    except OSError:
        pass  # read-only or full: the in-process cache still holds the table
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
