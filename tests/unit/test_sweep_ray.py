"""Sweeps on Ray: a local Ray instance runs the points with the same results as in-process."""

from __future__ import annotations

import sys

import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.sweep import make_spec, run_sweep

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

SPEC = ({"workload": {"max_requests": 30}},
        {"workload.rate_scale": [1, 2], "hardware.gpu": ["h100-sxm", "bogus"]})


def test_without_ray_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(FleetsimInputError, match=r"pip install 'fleetsim\[ray\]'"):
        run_sweep(make_spec(*SPEC), backend="ray", ray_address="local")


@pytest.mark.slow
def test_ray_local_instance_matches_in_process(tmp_path):
    ray = pytest.importorskip(
        "ray", reason="ray is not installed (optional extra: pip install 'fleetsim[ray]')")
    spec = make_spec(*SPEC)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = run_sweep(spec, tmp_path / "ray", backend="ray", ray_address="local")
        assert ray.is_initialized()  # a session it did not start is left running
    finally:
        ray.shutdown()
    run_sweep(spec, tmp_path / "inline", backend="inline")
    assert [r["status"] for r in rows] == ["ok", "failed", "ok", "failed"]
    assert "bogus" in rows[1]["error"]
    assert (tmp_path / "ray" / "sweep.csv").read_text() == (
        tmp_path / "inline" / "sweep.csv").read_text()
    for i in (0, 2):
        assert (tmp_path / "ray" / "points" / str(i) / "summary.json").read_text() == (
            tmp_path / "inline" / "points" / str(i) / "summary.json").read_text()
