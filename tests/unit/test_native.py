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
    else:
        pytest.skip(f"no usable compiled engine here: {native.usable_build()[1]}")
