"""The quantized step model against LLM-Inference-Bench's FP8 vs FP16 vLLM points
(docs/validation.md, "Quantization"): keeps the figures the docs report, none fitted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _validate_quantization():
    _load("validate_perf")  # imported by name from the benchmarks folder
    return _load("validate_quantization")


def test_fp8_weights_and_cache_on_h100_within_the_documented_error():
    vq = _validate_quantization()
    rows = vq.run()
    fp8 = [r for r in rows if r["gpu"] == "H100" and r["setting"] == vq.FP8]
    assert len(fp8) == 9
    assert np.mean([abs(r["error_pct"]) for r in fp8]) < 10
    speedup_err = [abs(r["speedup_predicted"] / r["speedup_measured"] - 1) for r in fp8]
    assert np.mean(speedup_err) < 0.08
    # FP8 is predicted faster than FP16 on every H100 row, as measured
    assert all(r["speedup_predicted"] > 1 and r["speedup_measured"] > 1 for r in fp8)


def test_docs_table_is_current():
    vq = _validate_quantization()
    assert vq.markdown(vq.run()) in (ROOT / "docs" / "validation.md").read_text(), (
        "rerun python benchmarks/validate_quantization.py --write-docs")
