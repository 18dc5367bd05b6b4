"""The compiled engine: the same sources, compiled by mypyc, used when fresh.

The event loop's hot modules are plain typed Python. ``make native`` (``tools/build_native.py``)
copies the package to ``build/native/fleetsim`` and compiles ``NATIVE_MODULES`` there with
mypyc (part of mypy); about twice as fast, with identical results (``make test`` runs every
test on both). ``fleetsim`` then loads its subpackages from that copy, but only while the copy
was built from exactly the current sources by this Python: a stale or foreign build is
ignored (``engine()`` says why), so an edit is never shadowed by old compiled code. Only the
compiled modules come from the build (an import hook maps exactly ``NATIVE_MODULES`` to their
extension files); every other module, and so every interpreted frame of a traceback or a
debugger, is the source under ``src/``. Set ``FLEETSIM_PURE=1`` to run the pure-Python
sources regardless.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# Engine internals only: policies users subclass stay interpreted (a compiled class cannot be
# subclassed from Python), except the per-step helpers beside them: batching's, routing's,
# Agent.xpu's, FastServe's and LoongServe's functions (FastServe's with its per-job state,
# LoongServe's with its planner state: records no one subclasses); and ExpertPlex's cost
# model and step models (``moe/expertplex_steps.py``: the engine prices every step and
# window with them; no one subclasses them).
NATIVE_MODULES = (
    "core/simulator.py",
    "serving/request.py",
    "serving/prefix_cache.py",
    "serving/kv_cache.py",
    "serving/chunk_runs.py",
    "serving/window.py",
    "serving/views.py",
    "serving/kv_moves.py",
    "serving/replica.py",
    "serving/transfers.py",
    "serving/resources.py",
    "serving/beside.py",
    "serving/shared_steps.py",
    "serving/sources.py",
    "serving/cluster.py",
    "serving/groups.py",
    "serving/recorder.py",
    "serving/itl.py",
    "policies/batch_steps.py",
    "policies/fastserve_steps.py",
    "policies/agent_xpu_steps.py",
    "policies/esp_steps.py",
    "policies/routing_steps.py",
    "policies/ordering.py",
    "perf/step_model.py",
    "perf/soc.py",
    "perf/soc_contention.py",
    "moe/expertplex_steps.py",
    "esp/admission.py",
    "esp/cost.py",
    "esp/dp.py",
    "esp/rules.py",
)

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_DIR.parents[1] / "build" / "native"  # in a source checkout
MANIFEST = "MANIFEST.json"


def source_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over every ``.py`` file of the package (relative path and bytes)."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        h.update(path.relative_to(package_dir).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def build_tag() -> str:
    """What a compiled module is tied to: the interpreter and the platform."""
    return f"{sys.implementation.cache_tag}-{sys.platform}-{os.uname().machine}"


def usable_build(build_dir: Path = BUILD_DIR, package_dir: Path = PACKAGE_DIR) -> tuple[bool, str]:
    """(True, "") when ``build_dir`` holds a successful build of exactly these sources for
    this interpreter; else (False, why)."""
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return False, "not built"
    if not manifest.get("ok"):
        return False, f"build failed ({manifest.get('reason', 'see build/native/build.log')})"
    if manifest.get("tag") != build_tag():
        return False, f"built for {manifest.get('tag')}, this is {build_tag()}"
    if manifest.get("digest") != source_digest(package_dir):
        return False, "stale: the sources changed since it was built (run `make native`)"
    return True, ""


STATE = {"engine": "python", "why": "FLEETSIM_PURE is set" if os.environ.get("FLEETSIM_PURE")
         else ""}


class CompiledModules:
    """Finds exactly the compiled modules (``fleetsim.serving.replica`` -> its extension
    file in the build); every other name is left to the normal finders. A meta path finder
    by protocol (``find_spec``): subclassing ``importlib.abc.MetaPathFinder`` would import
    ``importlib.resources`` at every start (25 ms)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files  # module name -> extension file

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def compiled_files(build_dir: Path = BUILD_DIR) -> dict[str, Path] | None:
    """Module name -> extension file of every compiled module, or None if one is missing."""
    files: dict[str, Path] = {}
    for module in NATIVE_MODULES:
        stem = build_dir / "fleetsim" / module.removesuffix(".py")
        found = [stem.with_name(stem.name + suffix)
                 for suffix in importlib.machinery.EXTENSION_SUFFIXES
                 if stem.with_name(stem.name + suffix).exists()]
        if not found:
            return None
        files["fleetsim." + module.removesuffix(".py").replace("/", ".")] = found[0]
    return files


def activate(package_path: list[str]) -> None:
    """Called by ``fleetsim/__init__``: when the build is usable, import the compiled
    modules from it (and nothing else)."""
    if os.environ.get("FLEETSIM_PURE"):
        return
    ok, why = usable_build()
    files = compiled_files() if ok else None
    if files is None:
        # Silent: results are the same either way, and commands must keep their one-line
        # errors; ``engine()`` says why (the benchmarks print it).
        STATE["why"] = why or "an extension module is missing from the build"
        return
    sys.meta_path.insert(0, CompiledModules(files))
    sys.path.append(str(BUILD_DIR))  # mypyc's shared library is a top-level module there
    STATE["engine"] = "mypyc"


def engine() -> str:
    """"mypyc" when the compiled engine is loaded, else "python (why)"."""
    if STATE["engine"] == "mypyc":
        return "mypyc"
    return f"python ({STATE['why']})" if STATE["why"] else "python"


def engine_build() -> str:
    """fleetsim's version and which engine ran: "0.1.0, mypyc" or "0.1.0, python (why)"."""
    from fleetsim import __version__

    return f"{__version__}, {engine()}"
