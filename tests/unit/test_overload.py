"""Issue 24: the overload warning catches an unstable queue whatever the span, counts only the
arrivals of a cut run, stays quiet on healthy runs, and reaches the sweep table, sweep.csv
and the HTML report."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.metrics.overload import overload_check
from fleetsim.run import run

ROOT = Path(__file__).resolve().parents[2]
EXP = str(ROOT / "examples" / "exp.toml")


def summary_of(waiting, span_s: float, n: int, makespan_s: float, num_finished: int | None = None):
    bins = np.linspace(0.0, makespan_s, len(waiting), endpoint=False)
    return {"num_requests": n, "num_finished": n if num_finished is None else num_finished,
            "makespan_s": makespan_s,
            "timeline": {"bin_start_s": list(bins), "mean_waiting": list(waiting)}}


def test_long_span_overload_with_a_short_drain_warns():
    """An hour at 1.1x capacity leaves a backlog of minutes: under the old 1.25x-makespan
    rule that went unseen. The waiting count grows at 10% of arrivals: a warning."""
    span, rate = 3600.0, 10.0
    arrivals = np.linspace(0.0, span, int(span * rate))
    t = np.linspace(0.0, span * 1.06, 64, endpoint=False)
    waiting = np.where(t < span, 0.1 * rate * t, 0.0)  # grows at lam - mu, then drains
    s = summary_of(waiting, span, len(arrivals), span * 1.06)
    out = overload_check(s, arrivals)
    assert out["queue_grew"] and "queue grew for the whole run" in out["warning"]
    assert out["queue_growth_per_s"] == pytest.approx(1.0, rel=0.05)
    assert out["offered_requests_per_s"] == pytest.approx(rate, rel=1e-3)


@pytest.mark.parametrize("seed", range(5))
def test_stable_fluctuating_queue_does_not_warn(seed):
    """A stable queue fluctuates around a constant, even a long one (here 40 waiting)."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0.0, 600.0, 6000))
    waiting = rng.poisson(40.0, 60).astype(float)
    out = overload_check(summary_of(waiting, 600.0, 6000, 605.0), arrivals)
    assert not out["queue_grew"] and "warning" not in out


def test_rising_but_small_queue_does_not_warn():
    """Quarter means that rise but stay a negligible share of the arrivals: no warning."""
    arrivals = np.linspace(0.0, 600.0, 6000)
    waiting = np.linspace(0.0, 3.0, 60)  # 0.005 req/s of growth against 10 req/s offered
    out = overload_check(summary_of(waiting, 600.0, 6000, 602.0), arrivals)
    assert not out["queue_grew"] and "warning" not in out


def test_cut_run_offers_its_arrivals_over_their_own_span():
    arrivals = np.linspace(0.0, 100.0, 1001)  # 10 req/s over the whole workload
    waiting = np.linspace(0.0, 200.0, 40)
    s = summary_of(waiting, 30.0, 301, 30.0, num_finished=100)  # cut at 30 s
    s["timeline"]["bin_start_s"] = list(np.linspace(0.0, 30.0, 40, endpoint=False))
    out = overload_check(s, arrivals)
    assert out["offered_requests_per_s"] == pytest.approx(301 / 30.0)
    assert out["queue_grew"] and "warning" in out


def overload_of(*sets: str) -> dict:
    return run(load_config(EXP, list(sets))).summary["overload"]


def test_the_missed_sweep_point_warns():
    """examples/sweep.toml's A100 at 2x: 3.2% SLO attainment, TTFT p99 86 s; the makespan is
    1.23x the arrivals' span, so the old rule (1.25x) missed it."""
    ov = overload_of("hardware.gpu=a100", "workload.rate_scale=2")
    assert ov["queue_grew"] and "warning" in ov
    assert ov["queue_growth_per_s"] > 0.1 * ov["offered_requests_per_s"]


def test_bursty_but_stable_point_does_not_warn():
    """The H100 at 4x misses its SLO in bursts (42.7%) but its queue empties again."""
    ov = overload_of("hardware.gpu=h100-sxm", "workload.rate_scale=4")
    assert not ov["queue_grew"] and "warning" not in ov


def test_run_cut_by_until_s_warns_with_its_own_offered_rate():
    """An H100 at 8x cut at 60 s: 2,247 arrivals in 60 s (37.5 req/s), not over the whole
    15-minute workload's span (19.98 req/s)."""
    ov = overload_of("hardware.gpu=h100-sxm", "workload.rate_scale=8", "until_s=60")
    assert ov["offered_requests_per_s"] == pytest.approx(37.47, abs=0.05)
    assert ov["queue_grew"] and "warning" in ov


def test_warning_reaches_sweep_table_csv_and_report(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'base = "{EXP}"\n[grid]\n"hardware.gpu" = ["h100-sxm", "a100"]\n')
    out = tmp_path / "sw"
    assert main(["sweep", str(spec), "--workers", "1", "--out", str(out), "--set",
                 "workload.rate_scale=2", "--set", "workload.duration_s=240"]) == 0
    stdout = capsys.readouterr()[0]
    assert "overloaded" in stdout and "point 1 overloaded: queue grew" in stdout
    with (out / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["overload_warning"] == ""
    assert rows[1]["overload_warning"].startswith("queue grew for the whole run")
    pytest.importorskip("matplotlib")
    html = tmp_path / "r.html"
    assert main(["report", str(out), "--out", str(html)]) == 0
    page = html.read_text()
    assert "point 1 (hardware.gpu=a100): queue grew for the whole run" in page
    assert "<tr class=overloaded>" in page and page.count("<tr class=overloaded>") == 1
