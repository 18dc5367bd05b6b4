"""``fleetsim goodput``, ``slo-scale`` and ``plan``: JSON output, files, exit code 2."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from fleetsim.cli import main

SMALL = ["--set", "workload.max_requests=60"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_goodput_json(capsys):
    code, out, err = run_cli(capsys, "goodput", *SMALL, "--tol", "0.2", "--max-runs", "8",
                             "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["goodput_requests_per_s"] > 0
    assert r["num_runs"] == len(r["probes"]) <= 8
    assert r["status"] in ("converged", "max_runs")
    assert r["usd_per_hour"] == pytest.approx(2.99)  # one H100 at the catalog price
    assert r["usd_per_million_tokens"] > 0
    best = [p for p in r["probes"] if p["rate_per_s"] == r["goodput_requests_per_s"]]
    assert best[0]["passed"]
    assert best[0]["attainment"] >= 0.9
    assert all(p["rate_per_s"] >= r["goodput_requests_per_s"] for p in r["probes"]
               if not p["passed"])


def test_goodput_table_and_max_rate_note(capsys):
    code, out, err = run_cli(capsys, "goodput", *SMALL, "--max-rate", "1.0", "--max-runs", "3")
    assert code == 0, err
    assert "goodput:" in out
    assert "at least" in out  # passes at --max-rate


def test_slo_scale_json(capsys):
    code, out, err = run_cli(capsys, "slo-scale", *SMALL, "--pct", "90", "99", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert set(r["slo_scale"]) == {"req90", "req99"}
    assert 1.0 - 1e-6 <= r["slo_scale"]["req90"] <= r["slo_scale"]["req99"]
    code, out, _ = run_cli(capsys, "slo-scale", *SMALL, "--pct", "95", "--pct", "99", "--json")
    assert set(json.loads(out)["slo_scale"]) == {"req95", "req99"}
    code, out, _ = run_cli(capsys, "slo-scale", *SMALL, "--json")
    assert set(json.loads(out)["slo_scale"]) == {"req90", "req95", "req99"}


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory):
    """One ``plan --json`` with every output flag the tests below read (``--out``, ``--plot``,
    ``--total-gpus``, ``--target-rate``): one run for both tests where they share a worker."""
    folder = tmp_path_factory.mktemp("plan")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--gpus", "h100,a100", "--max-gpus", "1", "--requests-per-gpu",
                     "40", "--max-runs", "4", "--json", "--total-gpus", "4", "--target-rate",
                     "10", "--out", str(folder / "p"), "--plot", str(folder / "front.png")])
    return code, out.getvalue(), err.getvalue(), folder


@pytest.mark.slow
def test_plan_json_writes_plan_and_plot(plan_run):
    code, out, err, folder = plan_run
    out_dir, png = folder / "p", folder / "front.png"
    assert code == 0, err
    r = json.loads(out)
    assert r == json.loads((out_dir / "plan.json").read_text())
    assert [p["shape"] for p in r["points"]] == ["1x A100-80GB-SXM tp1", "1x H100-SXM tp1"]
    assert r["front"]
    assert png.stat().st_size > 1000
    assert all(r["points"][i]["usd_per_hour"] > 0 for i in r["front"])


@pytest.mark.slow
def test_plan_in_aiconfigurator_terms(plan_run, capsys):
    """tokens/s per GPU and per user at goodput, a GPU budget, a target rate, and the
    vllm serve line of every point."""
    code, out, err, _ = plan_run
    assert code == 0, err
    r = json.loads(out)
    assert (r["total_gpus"], r["target_rate_per_s"]) == (4, 10)
    assert r["per_user_front"]
    for p in r["points"]:
        rate = p["goodput_requests_per_s"]
        assert p["output_tokens_per_s_per_gpu"] > 0 and p["tokens_per_s_per_user"] > 0
        assert p["copies_in_total_gpus"] == 4
        assert p["total_goodput_requests_per_s"] == pytest.approx(4 * rate)
        assert p["gpus_for_target_rate"] == math.ceil(10 / rate) * p["num_gpus"]
        assert p["target_rate_fits_total_gpus"] == (p["gpus_for_target_rate"] <= 4)
        (line,) = p["vllm_serve"]
        assert line.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct "
                               "--tensor-parallel-size 1 ")
    # The table form shows the per-user front and the commands.
    code, out, _ = run_cli(capsys, "plan", "--gpus", "h100", "--max-gpus", "1",
                           "--requests-per-gpu", "40", "--max-runs", "3", "--total-gpus", "2")
    assert code == 0 and "tok/s/user" in out and "vllm serve" in out


@pytest.mark.parametrize(("argv", "flag"), [
    (["goodput", "--target", "1.5"], "--target"),
    (["goodput", "--target", "0"], "--target"),
    (["goodput", "--min-rate", "5", "--max-rate", "1"], "--min-rate"),
    (["goodput", "--tol", "0"], "--tol"),
    (["goodput", "--max-runs", "0"], "--max-runs"),
    (["slo-scale", "--pct", "0"], "--pct"),
    (["plan", "--gpus", "h100,tpu9"], "--gpus"),
    (["plan", "--tp", "2", "--max-gpus", "1"], "--max-gpus"),
    (["plan", "--tp", "x"], "--tp"),
    (["plan", "--target", "2"], "--target"),
    (["plan", "--total-gpus", "2", "--max-gpus", "4"], "--max-gpus"),
    (["plan", "--total-gpus", "0"], "--total-gpus"),
    (["plan", "--target-rate", "-1"], "--target-rate"),
    (["plan", "--target-rate", "nan"], "--target-rate"),
    (["goodput", "--set", "workload.max_requests=1"], "workload"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, flag):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("fleetsim: error: ")
    assert flag in err
