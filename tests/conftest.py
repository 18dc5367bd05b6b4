"""Shared factories: small workloads and a one-replica simulation with a stub perf model; the
reproductions' quick slices run once per test process; the tests marked slow collect first."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from fleetsim.perf.base import ConstantStepModel, LinearStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.serving.driver import simulate_replica
from fleetsim.workloads.workload import Workload


def make_workload(
    arrivals: Sequence[float],
    prompts: Sequence[int],
    outputs: Sequence[int],
    hash_ids: Sequence[Sequence[int]] | None = None,
    hash_block_tokens: int = 64,
    priority: Sequence[int] | None = None,
) -> Workload:
    return Workload(
        arrival_s=np.asarray(arrivals, dtype=np.float64),
        num_prompt_tokens=np.asarray(prompts, dtype=np.int64),
        num_output_tokens=np.asarray(outputs, dtype=np.int64),
        hash_ids=tuple(tuple(h) for h in hash_ids) if hash_ids is not None else None,
        hash_block_tokens=hash_block_tokens,
        priority=np.asarray(priority, dtype=np.int64) if priority is not None else None,
    )


def simulate(
    workload: Workload,
    *,
    step_time_s: float | None = 1.0,
    step_model=None,
    kv_blocks: int = 1000,
    block_size: int = 16,
    max_batched_tokens: int = 8192,
    max_running: int = 256,
    ordering: str = "fcfs",
    chunked: bool = True,
    fast_forward: bool = True,
    debug: bool = True,
    until_s: float = float("inf"),
    prefix_caching: bool = True,
    windows_stop_at_arrivals: bool = True,
    batch_policy=None,
    timeline=None,
    track_itl=True,
    speculative=None,
):
    """One replica with a constant (or given) step model; returns (records, replica)."""
    model = step_model or ConstantStepModel(step_time_s)
    return simulate_replica(
        workload, step_model=model, num_kv_blocks=kv_blocks, block_size=block_size,
        batch_policy=batch_policy or TokenBudgetPlanner(enable_chunked_prefill=chunked),
        order_key=make_ordering(ordering), max_batched_tokens=max_batched_tokens,
        max_running=max_running, enable_prefix_caching=prefix_caching,
        fast_forward=fast_forward, debug=debug, until_s=until_s,
        windows_stop_at_arrivals=windows_stop_at_arrivals, timeline=timeline,
        track_itl=track_itl, speculative=speculative,
    )


def by_id(records, column: str) -> dict[int, float]:
    r = records.requests
    return dict(zip(r["request_id"].tolist(), r[column].tolist(), strict=True))


@pytest.fixture
def linear_model():
    return LinearStepModel(0.005, 2e-5, 1e-7)


# ---- the repository stands alone -----------------------------------------------------------
# A user's clone has nothing beside it, so a test that reads a path beside the repository
# (a sibling folder of data, say) passes on a developer's machine and fails on the user's.
# Every file the tests open and every folder they list is checked by an audit hook (PEP 578):
# a path under the repository's parent folder but outside the repository fails the test that
# touched it. (.ci/run also runs the suite from a copy in an empty folder, which catches the
# subprocesses this hook does not see.)
REPO = Path(__file__).resolve().parents[1]
_PARENT = str(REPO.parent).rstrip(os.sep) + os.sep
_INSIDE = (str(REPO) + os.sep, *(os.path.realpath(p) + os.sep for p in
                                  {sys.prefix, sys.base_prefix, sys.exec_prefix}))
if (os.path.realpath(tempfile.gettempdir()) + os.sep).startswith(_PARENT):
    # The repository sits in the temporary folder itself (e.g. /tmp/fleetsim): pytest's
    # tmp_path lives beside it and is the tests' own.
    _INSIDE += (os.path.realpath(tempfile.gettempdir()) + os.sep,)
_AUDITED = frozenset({"open", "os.listdir", "os.scandir"})
_TOUCHED_OUTSIDE: list[str] = []


def outside_repository(path: str) -> bool:
    """True for a path beside the repository: under its parent folder, not under it."""
    full = os.path.abspath(path) + os.sep
    return os.sep != _PARENT and full.startswith(_PARENT) and not full.startswith(_INSIDE)


def _audit(event: str, args: tuple) -> None:
    if event not in _AUDITED or not args or not isinstance(args[0], str | bytes | os.PathLike):
        return
    try:
        path = os.fsdecode(args[0])
    except (TypeError, ValueError):
        return
    if outside_repository(path):
        _TOUCHED_OUTSIDE.append(os.path.abspath(path))


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _stays_inside_the_repository():
    start = len(_TOUCHED_OUTSIDE)
    yield
    touched = _TOUCHED_OUTSIDE[start:]
    del _TOUCHED_OUTSIDE[start:]
    if touched:
        pytest.fail(f"the test read {touched[0]}, outside the repository ({REPO}): a user's "
                    f"clone has nothing beside it; copy what the test needs into the repository")


@pytest.fixture
def touched_outside():
    """What the audit hook has recorded since the test began (the guard's own test)."""
    start = len(_TOUCHED_OUTSIDE)
    yield lambda: _TOUCHED_OUTSIDE[start:]
    del _TOUCHED_OUTSIDE[start:]


# ---- one quick slice of a reproduction per test process --------------------------------------
# `repro NAME --quick` is the costliest thing the suite does (FastServe's about 10 s of CPU), and
# several tests read the same slice: the per-entry test of test_repro.py checks the command's
# document, files and figure, and a reproduction's own tests check its mechanisms on the runs.
# Each test process runs it once, through the command, and every test reads what it wrote; the
# README's `repro fastserve --quick` (tests/unit/test_readme.py, a subprocess) hands its
# document, files and comparison over too. The simulation is deterministic, so a later test
# reads exactly what its own run would give; a test that runs alone (or on the other xdist
# worker) runs the command itself.
@dataclass(frozen=True, slots=True)
class QuickRun:
    """What ``fleetsim repro NAME --quick --json --out OUT`` printed and wrote, and the
    ``(comparison, ctx)`` that ``run_reproduction`` returned to it (for ``repro all``'s part
    and a reproduction's own checks on the runs). Read it, never change it."""

    document: dict
    out: Path
    comparison: object
    ctx: object | None
    """None where the run was made in another process (only its comparison comes back)."""


class QuickRuns:
    """``quick_run(NAME)``: ``repro NAME --quick`` run once per test process, in it."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp_path_factory = tmp_path_factory
        self._runs: dict[str, QuickRun] = {}

    def __call__(self, name: str) -> QuickRun:
        if name not in self._runs:
            self._runs[name] = self._run(name)
        return self._runs[name]

    def add(self, name: str, document: dict, out: Path, comparison: object) -> None:
        """A run of ``repro NAME --quick`` made in another process (the README's command):
        its ``repro.json``, its folder and the comparison it pickled."""
        self._runs.setdefault(name, QuickRun(document, out, comparison, None))

    def _run(self, name: str) -> QuickRun:
        import fleetsim.repro.frame
        from fleetsim.cli import main

        run_reproduction, ran = fleetsim.repro.frame.run_reproduction, []

        def keep(*args, **kwargs):
            ran.append(run_reproduction(*args, **kwargs))
            return ran[-1]

        out = self._tmp_path_factory.mktemp(f"quick-{name}") / "out"
        stdout = io.StringIO()
        fleetsim.repro.frame.run_reproduction = keep
        try:
            with contextlib.redirect_stdout(stdout):
                assert main(["repro", name, "--quick", "--json", "--out", str(out)]) == 0
        finally:
            fleetsim.repro.frame.run_reproduction = run_reproduction
        [(comparison, ctx)] = ran
        return QuickRun(json.loads(stdout.getvalue()), out, comparison, ctx)


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> QuickRuns:
    return QuickRuns(tmp_path_factory)


# ---- the longest tests start first -------------------------------------------------------------
# `make test` runs `pytest -n 2 --dist worksteal`: each worker starts on one half of the
# collection and a worker that runs out takes half of what the other has left. Collected in
# file order, the longest tests (the reproductions' quick slices, the README's commands, the
# gateway soak) came last, and the last of them ran with one core idle. The tests marked
# `slow` move to the front, in their collection order (tests that read one quick run stay
# close, so they tend to share a worker); the short tests come after and fill both cores to
# the end.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
