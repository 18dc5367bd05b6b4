"""Reports: one self-contained HTML page from run, sweep, plan and goodput-search outputs."""

from __future__ import annotations

import base64
import json
import re
import shutil

import pytest

from fleetsim.cli import main
from fleetsim.report import write_report
from fleetsim.report.figures import pareto_front, pareto_points
from fleetsim.report.load import RunData
from fleetsim.sweep import make_spec, run_sweep

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TITLES = ("Latency CDFs", "SLO attainment vs offered load",
          "Queue length and batch size over time", "Pareto front: cost vs goodput")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "res"
    assert main(["run", "--out", str(out), "--set", "workload.max_requests=30"]) == 0
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    spec = make_spec({"workload": {"max_requests": 30}},
                     {"workload.rate_scale": [1, 4], "hardware.gpu": ["h100-sxm", "bogus"]})
    run_sweep(spec, out, backend="inline")
    return out


def images(page: str) -> list[bytes]:
    """Decoded PNGs of every <img> (all must be data URIs: the page is self-contained)."""
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert all(s.startswith("data:image/png;base64,") for s in srcs)
    pngs = [base64.b64decode(s.split(",", 1)[1]) for s in srcs]
    assert all(p.startswith(PNG_MAGIC) for p in pngs)
    return pngs


def assert_self_contained(page: str):
    assert "<script" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_report_of_a_run_folder(run_dir, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert "report.html" in capsys.readouterr()[0]
    page = (run_dir / "report.html").read_text()
    assert_self_contained(page)
    assert len(images(page)) == 2  # latency CDFs, queue and batch over time
    for title in TITLES:
        assert f"<h2>{title}</h2>" in page
    assert 'alt="Latency CDFs"' in page
    assert 'alt="Queue length and batch size over time"' in page
    assert "Not shown: needs a sweep over workload.rate_scale" in page
    assert "TTFT p99 (s)" in page
    assert "res" in page


def test_report_of_a_sweep_folder_keeps_failed_points(sweep_dir, tmp_path):
    out = tmp_path / "r" / "sweep.html"
    assert write_report(sweep_dir, out) == out
    page = out.read_text()
    assert_self_contained(page)
    has_cost = "cost" in json.loads((sweep_dir / "points" / "0" / "summary.json").read_text())
    # CDFs, SLO vs load, queue over time, and the Pareto front once summaries report cost
    assert len(images(page)) == 3 + has_cost
    assert 'alt="SLO attainment vs offered load"' in page
    assert "sweep of 4 points over workload.rate_scale × hardware.gpu (2 ok, 2 failed)" in page
    assert page.count("<tr class=failed>") == 2
    assert "bogus" in page


def test_plan_search_pools_and_cost_are_used_when_present(run_dir, tmp_path):
    folder = tmp_path / "all"
    shutil.copytree(run_dir, folder / "run")
    summary = json.loads((folder / "run" / "summary.json").read_text())
    tl = summary["timeline"]
    summary["pools"] = [
        {"name": name, "gpu": "h100-sxm", "role": role, "num_replicas": 2, "tp": 1,
         "busy_fraction": 0.5, "kv_used_fraction": 0.25,
         "timeline": {"bin_start_s": tl["bin_start_s"], "busy_fraction": tl["busy_fraction"],
                      "kv_used_fraction": tl["kv_used_fraction"]}}
        for name, role in (("prefill-pool", "prefill"), ("decode-pool", "decode"))]
    summary["cost"] = {"usd_per_hour": 12.5, "usd_per_million_tokens": 0.8}
    (folder / "run" / "summary.json").write_text(json.dumps(summary))
    (folder / "plan").mkdir()
    (folder / "plan" / "plan.json").write_text(json.dumps({
        "target": 0.9, "front": [0, 2], "infeasible": ["1x l40s"],
        "points": [
            {"shape": "1x h100", "num_gpus": 1, "usd_per_hour": 3.0,
             "goodput_requests_per_s": 4.0},
            {"shape": "2x a100", "num_gpus": 2, "usd_per_hour": 5.0,
             "goodput_requests_per_s": 3.5},
            {"shape": "2x h100", "num_gpus": 2, "usd_per_hour": 6.0,
             "goodput_requests_per_s": 8.0},
            {"shape": "1x l40s", "num_gpus": 1, "infeasible": "KV too small"}]}))
    (folder / "goodput.json").write_text(json.dumps({
        "goodput_requests_per_s": 6.0, "target": 0.9, "probes": [
            {"rate_per_s": 4.0, "attainment": 1.0, "passed": True, "ttft_attainment": 1.0,
             "tpot_attainment": 1.0},
            {"rate_per_s": 8.0, "attainment": 0.5, "passed": False, "ttft_attainment": 0.6,
             "tpot_attainment": 0.9},
            {"rate_per_s": 6.0, "attainment": 0.92, "passed": True, "ttft_attainment": 0.95,
             "tpot_attainment": 0.97}]}))
    page = write_report(folder).read_text()
    assert len(images(page)) == 4  # CDFs, SLO vs load (search), queue over time, Pareto
    for title in TITLES:
        assert f'alt="{title}"' in page
    assert "prefill-pool" in page
    assert "decode-pool" in page
    assert "$/hour" in page
    assert "12.5" in page
    assert "capacity plan plan.json (3 feasible shapes)" in page
    assert "goodput search goodput.json (3 probes)" in page


def test_pareto_front_is_cheapest_for_its_goodput():
    pts = [(3.0, 4.0), (5.0, 3.5), (6.0, 8.0), (6.0, 7.0), (2.0, 1.0), (9.0, 8.0)]
    assert pareto_front(pts) == [4, 0, 2]


def test_sweep_pareto_takes_each_configuration_at_its_best_rate(tmp_path):
    def point(gpu, rate, usd, goodput):
        summary = {"cost": {"usd_per_hour": usd}, "slo": {"goodput_requests_per_s": goodput}}
        return RunData(label=f"{gpu} {rate}", path=tmp_path, summary=summary,
                       values={"workload.rate_scale": rate, "hardware.gpu": gpu})

    runs = [point("a100", 1, 1.79, 3.0), point("a100", 2, 1.79, 5.0), point("a100", 4, 1.79, 0.2),
            point("h100", 1, 2.99, 3.0), point("h100", 4, 2.99, 14.0),
            point("l40s", 4, 2.5, 4.0)]
    points = {p["label"]: p for p in pareto_points(runs, "workload.rate_scale")}
    assert set(points) == {"gpu=a100 (best at rate_scale=2)", "gpu=h100 (best at rate_scale=4)",
                           "gpu=l40s (best at rate_scale=4)"}
    assert [p.get("on_front", False) for p in points.values()] == [True, True, False]


@pytest.mark.parametrize(("setup", "message"), [
    ("missing", "no such file or folder"),
    ("empty", "nothing to report"),
    ("bad_json", "invalid JSON"),
])
def test_bad_report_input_is_one_line_exit_2(tmp_path, capsys, setup, message):
    target = tmp_path / "d"
    if setup != "missing":
        target.mkdir()
        (target / "notes.txt").write_text("hello")
    if setup == "bad_json":
        (target / "summary.json").write_text("{not json")
    code = main(["report", str(target)])
    err = capsys.readouterr()[1]
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert not (target / "report.html").exists()
