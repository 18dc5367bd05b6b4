"""Dependencies point one way (STYLE.md section 2): check every module's fleetsim imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "fleetsim"

# package -> fleetsim packages it may import (besides itself and the shared leaf modules).
ALLOWED = {
    "core": set(),
    "hardware": set(),
    "models": set(),
    "perf": {"hardware", "models"},
    "workloads": set(),
    "serving": {"core", "perf", "metrics", "workloads"},
    "metrics": {"serving"},
    "policies": {"serving"},
    "moe": {"hardware", "models", "perf"},
}
LEAVES = {"errors", "configutil", "inputs"}  # stdlib-only helpers anyone may use


def fleetsim_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "fleetsim" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package):
    bad = {}
    for path in (SRC / package).rglob("*.py"):
        if package == "moe" and path.name == "cli.py":
            continue  # the command-line front end of moe sits with the CLI layer
        extra = fleetsim_imports(path) - ALLOWED[package] - LEAVES - {package}
        if extra:
            bad[str(path.relative_to(SRC))] = sorted(extra)
    assert not bad, f"imports against the layering: {bad}"


def test_nothing_under_src_reads_the_wall_clock():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "cli.py":
            continue
        text = path.read_text()
        needles = ("time.time(", "time.perf_counter(", "time.monotonic(", "datetime.now(",
                   "import time")
        offenders.extend(f"{path.relative_to(SRC)}: {n}" for n in needles if n in text)
    assert not offenders
