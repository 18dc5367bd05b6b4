"""Issue 13 §4: ``fleetsim calibrate`` recovers known parameters from fleetsim's own
``--vllm-json`` results and from a CSV of step times; bad input is one line, exit 2."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pytest

from fleetsim.calibrate import fit
from fleetsim.cli import main
from fleetsim.config import load_config

TRUE = {"step_overhead_s": 0.003, "step_overhead_per_seq_s": 4e-5, "kernel_time_scale": 1.2}
SETS = [x for k, v in TRUE.items() for x in ("--set", f"engine.{k}={v}")]
TOLERANCE = 0.01  # relative, every parameter


def _bench(tmp_path, name, *flags):
    path = tmp_path / f"{name}.json"
    code = main(["run", "--isl", "512", "--osl", "96", "--num-prompts", "48", *flags, *SETS,
                 "--vllm-json", str(path), "--out", str(tmp_path / f"run-{name}")])
    assert code == 0
    return str(path)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    fitted = [_bench(tmp, f"c{c}", "--max-concurrency", str(c)) for c in (1, 8, 32)]
    held = _bench(tmp, "poisson", "--request-rate", "6")  # open loop, Poisson arrivals
    return tmp, [*fitted, held]


def test_calibrate_recovers_known_parameters(results, capsys):
    tmp, paths = results
    out = tmp / "cal.toml"
    assert main(["calibrate", *paths, "--holdout", "1", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for k, v in TRUE.items():
        assert report["params"][k] == pytest.approx(v, rel=TOLERANCE), k
    held = [r for r in report["rows"] if r["set"] == "held back"]
    assert len(held) == 2 and all(abs(r["fitted_error_pct"]) < 1 for r in held)
    assert all(abs(r["default_error_pct"]) > 10 for r in held)  # the defaults were off
    # The snippet is a config that later runs use as it is.
    snippet = tomllib.loads(out.read_text())
    assert snippet["engine"] == pytest.approx(TRUE, rel=TOLERANCE)
    cfg = load_config(out)
    # model_id is the model as the run named it (vLLM's result keeps it as given)
    assert cfg.model == "llama-3.1-8b" and cfg.engine.kernel_time_scale == pytest.approx(1.2,
                                                                                          rel=0.01)
    assert "error on held back" in out.read_text()


def test_calibrate_fits_only_the_named_parameters(results, capsys):
    tmp, paths = results
    assert main(["calibrate", *paths[:2], "--holdout", "0", "--fit", "step_overhead_s",
                 "--out", str(tmp / "one.toml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["kernel_time_scale"] == 1.0
    assert report["params"]["step_overhead_per_seq_s"] == 0.0
    assert report["params"]["step_overhead_s"] > 0.003  # absorbs the slower kernels


def test_calibrate_from_step_time_csv_recovers_parameters(tmp_path, capsys):
    rng = np.random.default_rng(0)
    n = rng.integers(0, 200, 60)
    kv = n * rng.integers(100, 4000, 60)
    new = np.where(rng.random(60) < 0.4, rng.integers(16, 4096, 60), 0)
    ctx = np.where(new > 0, rng.integers(0, 8000, 60), 0)
    n[(n == 0) & (new == 0)] = 1
    rows = np.c_[n, kv, new, ctx, np.ones(60)].astype(float)
    kernels = fit.kernel_times_s(load_config(None), rows)
    rows[:, 4] = fit.predict_step_rows(kernels, rows, TRUE)
    lines = [",".join(fit.STEP_COLUMNS)] + [",".join(f"{x:.17g}" for x in r) for r in rows]
    path = tmp_path / "steps.csv"
    path.write_text("\n".join(lines) + "\n")
    assert main(["calibrate", str(path), "--out", str(tmp_path / "s.toml"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for k, v in TRUE.items():
        assert report["params"][k] == pytest.approx(v, rel=1e-6), k
    assert [r["set"] for r in report["rows"]] == ["fit", "held back"]


@pytest.mark.parametrize(("content", "needle"), [
    (None, "no such file"),
    ("[1, 2]", "expected a `vllm bench serve"),
    ('{"completed": 3}', "total_input_tokens"),
    ('{"completed": 3, "total_input_tokens": 9, "total_output_tokens": 9, "mean_ttft_ms": 1,'
     ' "mean_tpot_ms": 1, "request_rate": -2}', "request_rate"),
    ("not json", "result"),
])
def test_bad_result_files_are_one_line_and_exit_2(tmp_path, capsys, content, needle):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    assert main(["calibrate", str(path), "--out", str(tmp_path / "c.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err.lower() or needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "c.toml").exists()


def test_bad_step_csv_and_flags_are_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "steps.csv"
    bad.write_text("num_decode,step_time_s\n1,0.01\n")
    cases = [[str(bad)], [str(bad), "--fit", "nonsense"], [str(bad), str(bad)],
             [str(tmp_path / "a.json"), "--holdout", "1"],
             [str(tmp_path / "a.json"), "--set", "engine.async_scheduling=true"]]
    (tmp_path / "a.json").write_text('{"completed": 3, "total_input_tokens": 9, '
                                     '"total_output_tokens": 9, "mean_ttft_ms": 1, '
                                     '"mean_tpot_ms": 1}')
    for argv in cases:
        assert main(["calibrate", *argv, "--out", str(tmp_path / "c.toml")]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "engine.async_scheduling" in err or "async" not in " ".join(argv)
