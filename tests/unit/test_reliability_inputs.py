"""Issue 26: every input surface validated like the config (programs and their loaders, RL
jobs, calibration files, repro overrides), bounded reads, and no results folder replaced
without --force. Each bad input is one line naming the field, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import fleetsim
from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError

SRC = str(Path(fleetsim.__file__).resolve().parents[1])


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_exit_2(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(autouse=True)
def _own_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ---- 1. bounded reads ---------------------------------------------------------------------
def _cap_address_space() -> None:
    cap = 2 * 10**9
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def test_runs_under_a_2gb_address_space_cap(tmp_path):
    """A config of one line used to fail as "out of memory": read_bytes asked for 16 GiB."""
    config = tmp_path / "seed.toml"
    config.write_text("seed = 1\n")
    # OpenBLAS reserves a buffer per thread at import (~ 64 MiB x cores of address space):
    # one thread keeps numpy's own reservation small on a many-core machine, so the cap
    # measures fleetsim's reads and not the BLAS thread pool.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "fleetsim", "run", str(config), "--set",
         "workload.max_requests=50", "--out", str(tmp_path / "r"), "--format", "json"],
        env=env, preexec_fn=_cap_address_space, capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_finished"] == 50


def test_read_bytes_reads_a_file_that_grew(tmp_path, monkeypatch):
    from fleetsim import inputs

    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 10)
    real_stat = os.stat

    def stale_stat(p, *a, **kw):  # the file grew after stat(): the read is not cut short
        st = real_stat(p, *a, **kw)
        return os.stat_result((st.st_mode, *st[1:6], 3, *st[7:]))

    monkeypatch.setattr(inputs.os, "stat", stale_stat)
    assert inputs.read_bytes(path, "test") == b"x" * 10
    monkeypatch.setattr(inputs, "MAX_FILE_BYTES", 5)
    with pytest.raises(FleetsimInputError, match="more than 5 bytes"):
        inputs.read_bytes(path, "test")
