"""Which tests run in which build (``make test``: the pure pass, then the compiled pass).

``make test`` runs every test on the pure-Python sources (the reference), then again on the
compiled engine with ``--compiled-pass``. That second pass exists to check the code mypyc
compiles (``fleetsim.native.NATIVE_MODULES``: the kernel, the replica, windows, the cluster,
the recorder, the step model...), so it leaves out the test files listed in
``PURE_PASS_ONLY``: files whose tests run none of that code, in this process or in a
fleetsim subprocess. Every test still runs in the pure pass, and every test that touches
compiled code runs in both.

The list is checked, not trusted: in the pure build, each test of a listed file runs under a
watch that fails it the first time it calls a function of a compiled module or starts a
fleetsim subprocess, naming what it reached. A plain ``pytest`` (no ``--compiled-pass``)
runs everything in either build.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from fleetsim import native

# Test files (relative to tests/) that run no compiled code. A file belongs here only if the
# watch below passes on every one of its tests in the pure build.
PURE_PASS_ONLY = frozenset({
})

# A subprocess that runs fleetsim (so, in the compiled build, compiled code): `python -m
# fleetsim`, `python -c "from fleetsim..."`, the `fleetsim` script, a shell line calling it.
_FLEETSIM_PROCESS = re.compile(r"-m\s+fleetsim\b|(from|import)\s+fleetsim\b|bin/fleetsim\b"
                               r"|(^|[\s;&|])fleetsim\s")
TESTS_DIR = Path(__file__).resolve().parent


def compiled_sources() -> frozenset[str]:
    """The source files of the compiled modules as this interpreter loaded them (the names
    their code objects carry)."""
    names = ("fleetsim." + m.removesuffix(".py").replace("/", ".") for m in native.NATIVE_MODULES)
    return frozenset(importlib.import_module(name).__file__ for name in names)


class _Watch:
    """What a test reached: the first compiled-module function called, or fleetsim
    subprocess started (None while neither happened)."""

    def __init__(self, sources: frozenset[str]) -> None:
        self.sources = sources
        self.reached: str | None = None

    def trace(self, frame, event, arg):  # noqa: ARG002 (sys.settrace's signature)
        # Returns None, so no line events: one check per frame entered, nothing per line.
        if self.reached is None and frame.f_code.co_filename in self.sources:
            code = frame.f_code
            self.reached = f"{Path(code.co_filename).name}:{code.co_name}()"
            sys.settrace(None)  # the verdict is in; stop paying for the trace

    def audit(self, event: str, args: tuple) -> None:
        if event != "subprocess.Popen" or self.reached is not None:
            return
        argv = args[1] if len(args) > 1 else None
        line = argv if isinstance(argv, str | bytes) else " ".join(map(str, argv or ()))
        line = line.decode(errors="replace") if isinstance(line, bytes) else line
        if _FLEETSIM_PROCESS.search(line):
            self.reached = f"a fleetsim subprocess ({line[:80]})"


_ACTIVE: list[_Watch] = []


def _audit(event: str, args: tuple) -> None:
    for watch in _ACTIVE:
        watch.audit(event, args)


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one only reads _ACTIVE


@contextmanager
def compiled_code_watch() -> Iterator[_Watch]:
    """Watch what the body reaches (in the pure build, where the compiled modules are
    sources whose frames can be seen); restores any trace function it found."""
    watch, before = _Watch(compiled_sources()), sys.gettrace()
    _ACTIVE.append(watch)
    sys.settrace(watch.trace)
    threading.settrace(watch.trace)  # servers and pools the test starts in threads
    try:
        yield watch
    finally:
        sys.settrace(before)
        threading.settrace(before)  # type: ignore[arg-type]
        _ACTIVE.remove(watch)


def listed(item: pytest.Item) -> bool:
    try:
        rel = Path(str(item.path)).resolve().relative_to(TESTS_DIR).as_posix()
    except ValueError:
        return False
    return rel in PURE_PASS_ONLY


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--compiled-pass", action="store_true",
        help="make test's second pass: leave out the files of tests/builds.py's "
             "PURE_PASS_ONLY (they run no compiled code and ran in the pure pass)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--compiled-pass"):
        return
    if native.engine() != "mypyc":
        # No compiled engine here: this pass is pure Python too, and runs everything.
        return
    kept = [item for item in items if not listed(item)]
    left = [item for item in items if listed(item)]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = kept


_WATCH = pytest.StashKey[tuple]()


def _watched(item: pytest.Item) -> bool:
    return listed(item) and native.engine() != "mypyc"


# The watch spans setup, call and teardown, so module fixtures built for the file count too.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if _watched(item):
        context = compiled_code_watch()
        item.stash[_WATCH] = (context, context.__enter__())
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    context_watch = item.stash.get(_WATCH, None)
    if context_watch is not None and context_watch[1].reached is not None:
        pytest.fail(f"{item.path.name} is in tests/builds.py's PURE_PASS_ONLY, but this test "
                    f"reached compiled code ({context_watch[1].reached}): remove the file from "
                    f"the list so that it runs in both builds", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        context_watch = item.stash.get(_WATCH, None)
        if context_watch is not None:
            del item.stash[_WATCH]
            context_watch[0].__exit__(None, None, None)
