"""STYLE.md section 7: ``mypy --strict`` holds on core/, models/ and policies/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STRICT = ["src/fleetsim/core", "src/fleetsim/models", "src/fleetsim/policies"]


@pytest.mark.slow
def test_strict_packages_type_check():
    pytest.importorskip("mypy", reason="mypy is in the test extra; install '.[test]'")
    # Incremental, in the checkout's (git-ignored) .mypy_cache: mypy re-checks every module
    # whose source, dependencies, options or mypy version changed, so the answer is the same
    # as --no-incremental's, and make test's second pass (and a rerun) takes 2 s, not 15.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(ROOT / ".mypy_cache"),
         *STRICT],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
