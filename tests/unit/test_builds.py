"""tests/builds.py: the compiled pass leaves out only listed files, and the list is checked by
a watch that sees compiled code being reached (a call or a fleetsim subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests import builds
from tests.conftest import make_workload, simulate

from fleetsim import native

pure_only = pytest.mark.skipif(native.engine() == "mypyc",
                               reason="compiled frames cannot be watched (the pure pass does it)")


@pure_only
def test_the_watch_sees_a_simulation_reach_the_engine():
    with builds.compiled_code_watch() as watch:
        simulate(make_workload([0.0], [32], [4]))
    assert watch.reached is not None and ".py:" in watch.reached


def test_the_watch_passes_code_that_reaches_no_compiled_module():
    with builds.compiled_code_watch() as watch:
        sorted(str(n) for n in range(100))
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert watch.reached is None


@pure_only
def test_the_watch_sees_a_thread_reach_the_engine():
    import threading

    with builds.compiled_code_watch() as watch:
        worker = threading.Thread(target=simulate, args=(make_workload([0.0], [32], [4]),))
        worker.start()
        worker.join()
    assert watch.reached is not None


def test_the_watch_sees_a_fleetsim_subprocess():
    with builds.compiled_code_watch() as watch:
        subprocess.run([sys.executable, "-c", "import fleetsim"], check=True)
    assert watch.reached is not None and "fleetsim subprocess" in watch.reached


@pytest.mark.parametrize(("argv", "runs_fleetsim"), [
    ([sys.executable, "-m", "fleetsim", "--version"], True),
    ([sys.executable, "-m", "fleetsim.cli", "run"], True),
    (["bash", "-c", ".venv/bin/fleetsim run --out results/x"], True),
    (["bash", "-c", "cd x && fleetsim run"], True),
    ([sys.executable, "-c", "from fleetsim.cli import main; main()"], True),
    ([sys.executable, "-m", "mypy", "--strict", "src/fleetsim/core"], False),
    (["git", "ls-files", "src/fleetsim"], False),
])
def test_which_subprocesses_run_fleetsim(argv, runs_fleetsim):
    watch = builds._Watch(frozenset())
    watch.audit("subprocess.Popen", (argv[0], argv, None, None))
    assert (watch.reached is not None) == runs_fleetsim


def test_every_listed_file_exists():
    for rel in builds.PURE_PASS_ONLY:
        assert (builds.TESTS_DIR / rel).is_file(), rel


def _items(tmp_rel: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(path=builds.TESTS_DIR / rel, name=rel) for rel in tmp_rel]


class _Config:
    def __init__(self, compiled_pass: bool) -> None:
        self.compiled_pass = compiled_pass
        self.deselected: list = []
        self.hook = SimpleNamespace(pytest_deselected=lambda items: self.deselected.extend(items))

    def getoption(self, name: str) -> bool:
        assert name == "--compiled-pass"
        return self.compiled_pass


@pytest.mark.parametrize(("compiled_pass", "engine", "left_out"), [
    (True, "mypyc", True),  # make test's second pass, on the compiled engine
    (False, "mypyc", False),  # a plain pytest on the compiled engine runs everything
    (True, "python (not built)", False),  # no compiled engine: the pass is pure, runs all
])
def test_only_the_compiled_pass_leaves_out_listed_files(compiled_pass, engine, left_out,
                                                        monkeypatch):
    monkeypatch.setattr(builds, "PURE_PASS_ONLY", frozenset({"unit/test_listed.py"}))
    monkeypatch.setattr(native, "engine", lambda: engine)
    items = _items(["unit/test_engine.py", "unit/test_listed.py", "property/test_abort.py"])
    config = _Config(compiled_pass)
    builds.pytest_collection_modifyitems(config, items)
    names = [Path(i.path).name for i in items]
    if left_out:
        assert names == ["test_engine.py", "test_abort.py"]
        assert [Path(i.path).name for i in config.deselected] == ["test_listed.py"]
    else:
        assert names == ["test_engine.py", "test_listed.py", "test_abort.py"]
        assert config.deselected == []
