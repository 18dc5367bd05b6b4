"""The step model against the 33 published vLLM points of docs/validation.md (issue 13 §4).

Keeps the figures the docs report: each point is predicted with the CPU model of the engine
it was measured on, none fitted to these points: vLLM V0's measured per-step CPU cost (Vidur's
profile) for the 2024 rows, which removes their bias, and async scheduling (vLLM >= 0.14's
default) for the recent-vLLM ones; MAPE 9.2%, within the issue's goal of 10%."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _validate_perf():
    spec = importlib.util.spec_from_file_location(
        "validate_perf", ROOT / "benchmarks" / "validate_perf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validate_perf", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_v0_cpu_model_removes_the_batched_bias():
    vp = _validate_perf()
    rows, mape = vp.run("auto", "v0")
    fixed_rows, fixed_mape = vp.run("auto", "fixed")
    assert len(rows) == 33
    batched = [r["error_pct"] for r in rows
               if r["point"].source == vp.SRC_BATCH and r["point"].batch >= 16]
    batched_fixed = [r["error_pct"] for r in fixed_rows
                     if r["point"].source == vp.SRC_BATCH and r["point"].batch >= 16]
    assert np.mean(batched_fixed) < -15  # the symptom, with a fixed overhead
    assert abs(np.mean(batched)) < 8  # gone with the per-sequence cost
    assert mape <= 10.0 and mape < fixed_mape - 4
    # The recent-vLLM points: async scheduling hides the CPU cost behind the GPU, so each
    # decode step is shorter by about that cost less the gap, and lands within 10%.
    for r, f in zip(rows, fixed_rows, strict=True):
        if r["point"].source in vp.ASYNC_SOURCES:
            assert 0.9e-3 < f["predicted_s"] - r["predicted_s"] < 1.5e-3
            assert abs(r["error_pct"]) < 10


def test_docs_table_is_current():
    vp = _validate_perf()
    rows, _ = vp.run("auto", "v0")
    rows_rl, _ = vp.run("roofline", "v0")
    fixed, _ = vp.run("auto", "fixed")
    table = vp.markdown(rows, rows_rl, fixed)
    assert table in (ROOT / "docs" / "validation.md").read_text(), (
        "rerun python benchmarks/validate_perf.py --write-docs")
