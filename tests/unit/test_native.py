"""The compiled engine is used only when built from exactly the current sources."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import fleetsim.serving.replica as replica_module
from fleetsim import native


def _fake_build(tmp_path, **manifest):
    pkg = tmp_path / "src" / "fleetsim"
    shutil.copytree(native.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    build = tmp_path / "build"
    build.mkdir()
    fields = {"ok": True, "tag": native.build_tag(), "digest": native.source_digest(pkg)}
    fields.update(manifest)
    (build / native.MANIFEST).write_text(json.dumps(fields))
    return build, pkg


def test_a_build_of_these_sources_is_usable(tmp_path):
    build, pkg = _fake_build(tmp_path)
    assert native.usable_build(build, pkg) == (True, "")


def test_an_edit_makes_the_build_stale(tmp_path):
    build, pkg = _fake_build(tmp_path)
    window = pkg / "serving" / "window.py"
    window.write_text(window.read_text() + "\n# edited\n")
    ok, why = native.usable_build(build, pkg)
    assert not ok
    assert why.startswith("stale")


def test_failed_or_foreign_builds_are_not_used(tmp_path):
    build, pkg = _fake_build(tmp_path, ok=False, reason="mypyc exited 1")
    assert native.usable_build(build, pkg) == (False, "build failed (mypyc exited 1)")
    build, pkg = _fake_build(tmp_path / "other", tag="cpython-399-plan9-pdp11")
    assert not native.usable_build(build, pkg)[0]
    assert native.usable_build(tmp_path / "nowhere", pkg) == (False, "not built")


def test_engine_in_use_matches_the_build_state():
    compiled = replica_module.__file__.endswith((".so", ".pyd"))
    if os.environ.get("FLEETSIM_PURE"):
        assert not compiled
        assert native.engine().startswith("python")
    elif native.usable_build()[0]:
        assert compiled
        assert native.engine() == "mypyc"
        # Only the compiled modules come from the build: the rest, the sources in src/.
        import fleetsim.run
        import fleetsim.serving

        for module in (fleetsim.run, fleetsim.serving):
            assert module.__file__.startswith(str(native.PACKAGE_DIR)), module.__file__
    else:
        pytest.skip(f"no usable compiled engine here: {native.usable_build()[1]}")


_RUN = """
import hashlib, json
from fleetsim import native
from fleetsim.config import config_from_dict
from fleetsim.run import run
cfg = config_from_dict({"model": "llama-3.1-8b",
    "hardware": {"gpu": "h100-sxm", "num_replicas": 8},
    "cluster": {"router": {"name": "power_of_two"}},
    "workload": {"trace": None, "arrival": "poisson", "rate_per_s": 20.0,
                 "num_requests": 1500, "prompt_tokens": {"kind": "lognormal", "mean": 800.0,
                 "cv": 1.0}, "output_tokens": {"kind": "lognormal", "mean": 200.0, "cv": 1.0}}})
res = run(cfg)
rq = res.records.requests
summary = {k: v for k, v in res.summary.items() if k != "engine_build"}  # names the build
print(native.engine().split()[0],
      hashlib.sha256(json.dumps(summary, sort_keys=True, default=str).encode()).hexdigest(),
      hashlib.sha256(b"".join(rq[k].tobytes() for k in sorted(rq))).hexdigest())
"""


def test_compiled_and_pure_engines_give_identical_results():
    if not native.usable_build()[0]:
        pytest.skip(f"no usable compiled engine here: {native.usable_build()[1]}")
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FLEETSIM_PURE"}
    out = {}
    for engine, extra in (("mypyc", {}), ("python", {"FLEETSIM_PURE": "1"})):
        done = subprocess.run([sys.executable, "-c", _RUN], env={**env, **extra},
                              capture_output=True, text=True, check=True)
        name, *hashes = done.stdout.split()
        assert name == engine
        out[engine] = hashes
    assert out["mypyc"] == out["python"]
