"""Start-up: the CLI imports only what the command uses; measured tables come from a cache
that is keyed by what they depend on, written atomically and optional."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleetsim import cli
from fleetsim.perf import ops, tables

HEAVY = ("numpy", "rich", "pyarrow", "pandas", "aiconfigurator_core", "urllib.request")
SRC = str(Path(cli.__file__).resolve().parents[1])


def _modules_after(code: str, tmp_path: Path) -> tuple[str, list[str]]:
    """Run ``code`` in a fresh interpreter; its stdout and the HEAVY modules it loaded."""
    probe = (f"{code}\nimport json, sys\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": SRC, "FLEETSIM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=True)
    *out, loaded = proc.stdout.strip().splitlines()
    return "\n".join(out), json.loads(loaded)


# ---- the command line ---------------------------------------------------------------------
def test_version_imports_no_heavy_package(tmp_path):
    out, loaded = _modules_after(
        "from fleetsim.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n"
        "    pass", tmp_path)
    assert out.startswith("fleetsim 0.")
    assert loaded == []


def test_a_run_reads_cached_tables_without_pyarrow(tmp_path):
    """The first run fills the cache from parquet; the second needs neither pyarrow nor
    pandas, and prints the same summary."""
    code = ("from fleetsim.cli import main\n"
            "main(['run', '--format', 'json', '--force', '--out', 'res',"
            " '--set', 'workload.max_requests=20'])")
    first, loaded_first = _modules_after(code, tmp_path)
    assert "pyarrow" in loaded_first
    second, loaded_second = _modules_after(code, tmp_path)
    assert "pyarrow" not in loaded_second and "pandas" not in loaded_second
    assert "urllib.request" not in loaded_second  # only the LLM proposer's requests need it
    assert "rich" not in loaded_second  # stderr is a pipe: no progress bar, no rich
    assert json.loads(first) == json.loads(second)


def test_a_run_on_a_terminal_still_draws_its_progress_bar(tmp_path, capsys, monkeypatch):
    """rich is skipped only where its bar could not show: told stderr is a terminal
    (TTY_COMPATIBLE, as rich reads it), the run draws the bar."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["run", "--format", "json", "--out", str(tmp_path / "res"),
                     "--set", "workload.max_requests=20"]) == 0
    err = capsys.readouterr().err
    assert "simulating" in err and "ETA" in err


@pytest.mark.parametrize(("argv", "expected"), [
    (["--version"], ()),
    (["run", "--set", "model=x"], ("run",)),
    (["slo-scale", "--help"], ("slo-scale",)),
    (["-h"], None),
    (["--version", "-h"], None),
    ([], None),
    (["no-such-command"], None),
])
def test_commands_needed(argv, expected):
    assert cli._commands_needed(argv) == expected


def _command_names(parser) -> set[str]:
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def test_command_modules_list_what_they_register():
    """COMMAND_MODULES must name every command each module adds, or that command would be
    unknown when asked for alone."""
    full = _command_names(cli.build_parser())
    listed = {c for names in cli.COMMAND_MODULES.values() for c in names}
    assert full == set(cli.CORE_COMMANDS) | listed
    for module, names in cli.COMMAND_MODULES.items():
        assert _command_names(cli.build_parser(names)) == set(names), module
    assert _command_names(cli.build_parser(())) == set()


def test_a_command_alone_parses_as_in_the_full_parser():
    argv = ["goodput", "--target", "0.9", "--max-runs", "3"]
    alone = cli.build_parser(cli._commands_needed(argv)).parse_args(argv)
    full = cli.build_parser().parse_args(argv)
    assert vars(alone) == vars(full)


# ---- the table cache ------------------------------------------------------------------------
ALLREDUCE = ("h100_sxm", "comm", "vllm", "custom_allreduce_perf.parquet",
             ("message_size", "backend"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, and load_table's in-process cache cleared around the test."""
    if tables.find_table(*ALLREDUCE[:4]) is None:
        pytest.skip("aiconfigurator-core's tables are not installed")
    monkeypatch.setenv("FLEETSIM_CACHE_DIR", str(tmp_path / "cache"))
    tables.load_table.cache_clear()
    yield tmp_path / "cache" / "tables"
    tables.load_table.cache_clear()


def _load(**filters):
    tables.load_table.cache_clear()
    return tables.load_table(*ALLREDUCE, **filters)


def _no_parquet(monkeypatch):
    def refuse(*args, **kw):
        raise AssertionError("read parquet although the cache holds the table")

    monkeypatch.setattr(tables, "_read_parquet", refuse)


def _same(a, b):
    assert a.label == b.label
    assert a.columns.keys() == b.columns.keys()
    for k in a.columns:
        assert a.columns[k].dtype == b.columns[k].dtype, k
        assert np.array_equal(a.columns[k], b.columns[k]), k


def test_cached_table_equals_the_parquet_read(cache, monkeypatch):
    fresh = _load(num_gpus=2)
    assert len(fresh) > 0 and [p.suffix for p in cache.iterdir()] == [".npz"]
    _no_parquet(monkeypatch)
    _same(_load(num_gpus=2), fresh)
    # string columns survive as strings (filters on them still match)
    assert len(_load(num_gpus=2).where(backend="vllm_graph")) > 0


def test_a_missing_column_is_cached_as_absent(cache, monkeypatch):
    assert tables.load_table(*ALLREDUCE[:4], ("no_such_column",)) is None
    _no_parquet(monkeypatch)
    tables.load_table.cache_clear()
    assert tables.load_table(*ALLREDUCE[:4], ("no_such_column",)) is None


def test_entries_are_keyed_by_package_version_file_and_query(cache, monkeypatch, tmp_path):
    src = tmp_path / "t.parquet"
    src.write_bytes(b"x" * 10)
    entry = tables._cache_entry(src, ("a",), {"f": 1})
    assert entry == tables._cache_entry(src, ("a",), {"f": 1})
    others = {tables._cache_entry(src, ("b",), {"f": 1}),
              tables._cache_entry(src, ("a",), {"f": 2}),
              tables._cache_entry(src, ("a",), {"f": "1"})}
    os.utime(src, ns=(1, 1))  # same size, other modification time
    others.add(tables._cache_entry(src, ("a",), {"f": 1}))
    src.write_bytes(b"x" * 11)
    os.utime(src, ns=(1, 1))
    others.add(tables._cache_entry(src, ("a",), {"f": 1}))
    monkeypatch.setattr(tables, "_aic_version", lambda: "99.0")
    others.add(tables._cache_entry(src, ("a",), {"f": 1}))
    assert entry not in others and len(others) == 6


def test_a_changed_source_file_is_read_afresh(cache, monkeypatch, tmp_path):
    import pyarrow.parquet as pq

    copy = tmp_path / "data" / "custom_allreduce_perf.parquet"
    copy.parent.mkdir()
    shutil.copy(tables.find_table(*ALLREDUCE[:4]), copy)
    monkeypatch.setattr(tables, "find_table", lambda *a: copy)
    before = _load(num_gpus=2)
    data = pq.read_table(copy)
    doubled = data.set_column(data.schema.get_field_index("latency"), "latency",
                              [[2 * x for x in data.column("latency").to_pylist()]])
    pq.write_table(doubled, copy)
    after = _load(num_gpus=2)
    assert np.array_equal(after.columns["latency_s"], 2 * before.columns["latency_s"])
    assert len(list(cache.iterdir())) == 2


def test_a_damaged_entry_is_rebuilt(cache):
    fresh = _load(num_gpus=4)
    (entry,) = cache.iterdir()
    entry.write_bytes(b"not a zip file")
    _same(_load(num_gpus=4), fresh)
    _same(tables.Table(tables._read_entry(entry), fresh.label), fresh)  # rewritten whole


def test_an_unwritable_cache_falls_back_to_parquet(tmp_path, monkeypatch, cache):
    # a path under a regular file can never be created, even by root (chmod would not stop it)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("FLEETSIM_CACHE_DIR", str(blocker / "cache"))
    first = _load(num_gpus=2)
    assert blocker.is_file()
    monkeypatch.setenv("FLEETSIM_CACHE_DIR", str(tmp_path / "cache"))
    _same(first, _load(num_gpus=2))


def test_no_absolute_cache_folder_means_no_disk_cache(cache, monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETSIM_CACHE_DIR", "relative/cache")
    monkeypatch.chdir(tmp_path)
    fresh = _load(num_gpus=2)
    assert len(fresh) > 0 and not (tmp_path / "relative").exists()
    monkeypatch.delenv("FLEETSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tables.cache_dir() == tmp_path / "xdg" / "fleetsim" / "tables"


def test_writes_leave_no_temporary_files(cache):
    _load(num_gpus=2)
    _load(num_gpus=4)
    assert sorted(p.suffix for p in cache.iterdir()) == [".npz", ".npz"]


# ---- the GEMM ratio grid ----------------------------------------------------------------------
def _fill_reference(ratio, lns, lks):
    """The fill as first written: a full distance matrix for every m row."""
    ratio = ratio.copy()
    ln, lk = np.meshgrid(lns, lks, indexing="ij")
    for i in range(ratio.shape[0]):
        ok = np.isfinite(ratio[i])
        if not ok.any():
            ratio[i] = np.nan
            continue
        d = (ln[..., None] - ln[ok]) ** 2 + (lk[..., None] - lk[ok]) ** 2
        ratio[i] = ratio[i][ok][np.argmin(d, axis=-1)]
    return ratio


@pytest.mark.parametrize("seed", range(4))
def test_gemm_grid_fill_once_per_pattern_equals_row_by_row(seed):
    """Rows that share a measured pattern (and ties between equally near cells) fill exactly
    as the row-by-row search does."""
    rng = np.random.default_rng(seed)
    num_m, num_n, num_k = 12, 7, 9
    lns = np.log(np.array([1, 2, 4, 8, 16, 32, 64.0]))
    lks = np.log(2.0 ** np.arange(num_k))  # equal spacing: ties are common
    ratio = rng.normal(size=(num_m, num_n, num_k))
    patterns = rng.random((3, num_n, num_k)) < 0.6
    for i in range(num_m):
        ratio[i][~patterns[rng.integers(3)]] = np.inf
    ratio[5] = np.nan  # a row with nothing measured
    ratio[7][~(rng.random((num_n, num_k)) < 0.3)] = np.nan  # a pattern of its own
    got = ops._fill_unmeasured(ratio, lns, lks)
    assert np.array_equal(got, _fill_reference(ratio, lns, lks), equal_nan=True)
    assert np.isnan(got[5]).all() and np.isfinite(np.delete(got, 5, axis=0)).all()
