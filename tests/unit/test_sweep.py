"""Sweeps: grid expansion, failed points reported not lost, merged table, backends agree."""

from __future__ import annotations

import csv
import json

import pytest

from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError
from fleetsim.sweep import expand, load_spec, make_spec, parse_grid_arg, run_sweep

TINY = {"workload": {"max_requests": 30}}


def write_spec(tmp_path, text: str):
    path = tmp_path / "spec.toml"
    path.write_text(text)
    return path


def test_grid_is_the_cartesian_product_first_key_slowest():
    spec = make_spec(TINY, {"workload.rate_scale": [0.5, 1, 2], "hardware.gpu": ["h100", "a100"]})
    points = expand(spec)
    assert spec.num_points == len(points) == 6
    assert [p.index for p in points] == list(range(6))
    assert [tuple(p.values.values()) for p in points] == [
        (0.5, "h100"), (0.5, "a100"), (1, "h100"), (1, "a100"), (2, "h100"), (2, "a100")]
    assert points[3].config_data["workload"] == {"max_requests": 30, "rate_scale": 1}
    assert points[3].config_data["hardware"] == {"gpu": "a100"}
    assert "hardware" not in spec.base  # expanding never writes into the base


def test_spec_file_base_path_grid_tables_and_cli_axes(tmp_path):
    (tmp_path / "exp.toml").write_text('model = "llama-2-7b"\n[workload]\nmax_requests = 30\n')
    spec_path = write_spec(tmp_path, 'base = "exp.toml"\n[grid.workload]\nrate_scale = [1, 2]\n'
                                     '[grid]\n"engine.block_size" = [16, 32]\n')
    spec = load_spec(spec_path, overrides=["seed=3"],
                     grid_args=["engine.block_size=64", "hardware.gpu=h100-sxm,a100"])
    assert spec.base["model"] == "llama-2-7b"
    assert spec.base["seed"] == 3
    assert dict(spec.grid) == {"workload.rate_scale": (1, 2), "engine.block_size": (64,),
                               "hardware.gpu": ("h100-sxm", "a100")}


@pytest.mark.parametrize(("text", "values"), [
    ("workload.rate_scale=0.5,1,2", (0.5, 1, 2)),
    ("hardware.gpu=h100,a100", ("h100", "a100")),
    ("hardware.gpu='h100', 'a100'", ("h100", "a100")),
    ("workload.prompt_tokens={kind='fixed', value=10},{kind='fixed', value=20}",
     ({"kind": "fixed", "value": 10}, {"kind": "fixed", "value": 20})),
])
def test_grid_arg_values_are_toml_or_plain_strings(text, values):
    assert parse_grid_arg(text)[1] == values


def test_bad_specs_fail_before_running(tmp_path):
    with pytest.raises(FleetsimInputError, match="unknown key; did you mean 'rate_scale'"):
        make_spec(TINY, {"workload.rate_scal": [1]})
    with pytest.raises(FleetsimInputError, match="at least one value"):
        make_spec(TINY, {"workload.rate_scale": []})
    with pytest.raises(FleetsimInputError, match="give a comma-separated list"):
        parse_grid_arg("workload.rate_scale=")
    with pytest.raises(FleetsimInputError, match="base"):
        make_spec({"engine": {"block_size": 0}}, {})
    with pytest.raises(FleetsimInputError, match="expected a list"):
        load_spec(write_spec(tmp_path, '[grid]\n"seed" = 3\n'))
    with pytest.raises(FleetsimInputError, match="only `base`"):
        load_spec(write_spec(tmp_path, 'seed = 3\n'))
    # free-form policy args pass the key check; the policy validates them when the point runs
    make_spec(TINY, {"policy.batching.args.enable_chunked_prefill": [True, False]})


def test_failed_point_is_reported_and_the_others_still_run(tmp_path):
    spec = make_spec(TINY, {"hardware.gpu": ["h100-sxm", "no-such-gpu"],
                            "engine.max_running": [8, 0]})
    rows = run_sweep(spec, tmp_path / "out", backend="inline")
    assert [r["status"] for r in rows] == ["ok", "failed", "failed", "failed"]
    assert "max_running" in rows[1]["error"]
    assert "no-such-gpu" in rows[2]["error"]
    assert rows[0]["num_finished"] == 30
    assert rows[2]["ttft_p99_s"] is None
    points = tmp_path / "out" / "points"
    assert (points / "0" / "summary.json").exists()
    assert (points / "0" / "requests.csv").exists()
    assert "no-such-gpu" in (points / "2" / "error.txt").read_text()
    assert not (points / "1" / "summary.json").exists()


def test_merged_table_csv_and_json(tmp_path):
    spec = make_spec(TINY, {"workload.rate_scale": [1, 4]})
    run_sweep(spec, tmp_path, backend="inline")
    with open(tmp_path / "sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["workload.rate_scale"] for r in rows] == ["1", "4"]
    for col in ("status", "error", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                "e2e_p50_s", "e2e_p99_s", "throughput_requests_per_s", "slo_attainment",
                "goodput_requests_per_s", "usd_per_hour"):
        assert col in rows[0]
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["grid"] == {"workload.rate_scale": [1, 4]}
    assert doc["num_ok"] == 2
    assert doc["num_failed"] == 0
    fast, slow = doc["points"][1], doc["points"][0]
    assert fast["throughput_requests_per_s"] > slow["throughput_requests_per_s"]
    summary = json.loads((tmp_path / "points" / "1" / "summary.json").read_text())
    assert fast["ttft_p99_s"] == summary["ttft_s"]["p99"]


def test_local_processes_and_in_process_give_identical_summaries(tmp_path):
    spec = make_spec({"seed": 7, "workload": {
        "trace": "synthetic", "rate_per_s": 8.0, "num_requests": 30,
        "prompt_tokens": {"kind": "lognormal", "mean": 400.0, "cv": 1.0},
        "output_tokens": {"kind": "uniform", "low": 10, "high": 80}}},
        {"workload.rate_scale": [1, 3], "hardware.gpu": ["h100-sxm", "a100"]})
    run_sweep(spec, tmp_path / "inline", backend="inline")
    run_sweep(spec, tmp_path / "process", backend="process", workers=2)
    for i in range(spec.num_points):
        a = (tmp_path / "inline" / "points" / str(i) / "summary.json").read_text()
        b = (tmp_path / "process" / "points" / str(i) / "summary.json").read_text()
        assert a == b
        a = (tmp_path / "inline" / "points" / str(i) / "requests.csv").read_text()
        assert a == (tmp_path / "process" / "points" / str(i) / "requests.csv").read_text()
    assert ((tmp_path / "inline" / "sweep.csv").read_text()
            == (tmp_path / "process" / "sweep.csv").read_text())


def test_cli_sweep_runs_prints_and_writes(tmp_path, capsys):
    spec = write_spec(tmp_path, '[base.workload]\nmax_requests = 30\n[grid]\n'
                                '"workload.rate_scale" = [1, 2]\n')
    out = tmp_path / "out"
    code = main(["sweep", str(spec), "--grid", "hardware.gpu=h100-sxm,bogus", "--workers", "1",
                 "--out", str(out)])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    assert "point 1 failed" in stdout
    assert "bogus" in stdout
    assert "2/4 points ok" in stderr
    assert len(json.loads((out / "sweep.json").read_text())["points"]) == 4
    code = main(["sweep", str(spec), "--workers", "1", "--out", str(out), "--json"])
    assert code == 2 and "--force" in capsys.readouterr()[1]  # earlier results kept
    code = main(["sweep", str(spec), "--workers", "1", "--out", str(out), "--json", "--force"])
    rows = json.loads(capsys.readouterr()[0])
    assert code == 0
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_cli_every_point_failed_exits_1(tmp_path, capsys):
    spec = write_spec(tmp_path, '[grid]\n"hardware.gpu" = ["bogus"]\n')
    assert main(["sweep", str(spec), "--workers", "1", "--out", str(tmp_path / "o")]) == 1


@pytest.mark.parametrize(("spec_text", "extra", "message"), [
    (None, [], "no such file"),
    ('[grid]\n"workload.rate_scal" = [1]\n', [], "did you mean 'rate_scale'"),
    ('[grid]\n"workload.rate_scale" = []\n', [], "at least one value"),
    ('[grid\n', [], "fix the TOML syntax"),
    ("", ["--grid", "nonsense"], "dotted.key=v1,v2"),
    ("", ["--workers", "0"], "must be >= 1"),
    ('base = "nowhere.toml"\n', [], "relative to the spec"),
])
def test_cli_bad_spec_is_one_line_exit_2(tmp_path, capsys, spec_text, extra, message):
    path = tmp_path / "spec.toml"
    if spec_text is not None:
        path.write_text(spec_text)
    code = main(["sweep", str(path), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr()[1]
    assert code == 2
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "o").exists()
