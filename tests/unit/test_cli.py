"""The fleetsim command: results files, one-line errors with exit code 2, nothing lost."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from fleetsim.cli import main

FAST = ["--set", "workload.max_requests=40"]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_writes_summary_requests_and_config(tmp_path, capsys):
    out = tmp_path / "res"
    code, stdout, err = run_cli(capsys, "run", "--out", str(out), *FAST)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_finished"] == 40
    assert summary["model"] == "Llama-3.1-8B"
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p99"}
    assert 0.0 <= summary["slo"]["attainment"] <= 1.0
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40
    assert set(rows[0]) >= {"arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "tpot_s",
                            "e2e_s", "queueing_delay_s", "preemptions"}
    assert all(float(r["e2e_s"]) >= float(r["ttft_s"]) > 0 for r in rows)
    config = json.loads((out / "config.json").read_text())
    assert config["workload"]["max_requests"] == 40
    assert "TTFT" in stdout


def test_config_file_and_overrides_compose(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    cfg.write_text('model = "llama-2-7b"\n[hardware]\ngpu = "a100"\n[engine]\nblock_size = 32\n'
                   '[workload]\nmax_requests = 20\n')
    code, _, err = run_cli(capsys, "run", str(cfg), "--set", "hardware.gpu=h200",
                           "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["hardware"]["gpu"] == "h200"
    assert config["engine"]["block_size"] == 32
    assert config["model"] == "llama-2-7b"


def test_same_seed_same_results(tmp_path, capsys):
    synth = ["--set", "workload.trace='synthetic'", "--set", "workload.rate_per_s=5.0",
             "--set", "workload.num_requests=60",
             "--set", "workload.prompt_tokens={kind='lognormal', mean=500.0, cv=1.0}",
             "--set", "workload.output_tokens={kind='uniform', low=10, high=200}"]
    for name in ("a", "b"):
        assert run_cli(capsys, "run", "--out", str(tmp_path / name), *synth)[0] == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a == b
    assert (tmp_path / "a" / "requests.csv").read_text() == (
        tmp_path / "b" / "requests.csv").read_text()


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BAD_INPUTS = [
    (["--set", "model=llama-9"], "llama-9"),
    (["--set", "hardware.gpu=v100x"], "v100x"),
    (["--set", "policy.ordering=lifo"], "lifo"),
    (["--set", "policy.batching={name='token_budget', args={chunky=true}}"], "chunky"),
    (["--set", "engine.blok_size=8"], "block_size"),
    (["--set", "engine.max_running='many'"], "engine.max_running"),
    (["--set", "engine.gpu_memory_utilization=1.5"], "gpu_memory_utilization"),
    (["--set", "hardware.tp=0"], "tp"),
    (["--set", "nonsense"], "dotted.key=value"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_INPUTS)
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, args, needle):
    code, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"), *args)
    assert code == 2
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("content", "needle"), [
    ("arrival_s,prompt_tokens\n0,5\n", "output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,-5,3\n", "-5"),
    ("arrival_s,prompt_tokens,output_tokens\n0,abc,3\n", "abc"),
    ("arrival_s,prompt_tokens,output_tokens\n2,5,3\n1,5,3\n", "sort"),
    ("", "empty"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5000,10\n", "4096"),  # llama-2 context
])
def test_bad_traces_are_one_line_exit_2(tmp_path, capsys, content, needle):
    trace = _write(tmp_path, "t.csv", content)
    code, _, err = run_cli(capsys, "run", "--out", str(tmp_path / "o"), "--set",
                           f"workload.trace='{trace}'", "--set", "model=llama-2-7b")
    assert code == 2, err
    assert needle in err and "t.csv" in err or needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_failed_run_keeps_earlier_results(tmp_path, capsys):
    out = tmp_path / "o"
    assert run_cli(capsys, "run", "--out", str(out), *FAST)[0] == 0
    before = {p.name: p.read_text() for p in out.iterdir()}
    code, _, _ = run_cli(capsys, "run", "--out", str(out), "--set", "model=nope")
    assert code == 2
    assert {p.name: p.read_text() for p in out.iterdir()} == before


def test_missing_config_file(tmp_path, capsys):
    code, _, err = run_cli(capsys, "run", str(tmp_path / "nope.toml"))
    assert code == 2 and "nope.toml" in err


def test_bad_toml_names_the_file(tmp_path, capsys):
    cfg = _write(tmp_path, "bad.toml", "[engine\nblock_size = 3\n")
    code, _, err = run_cli(capsys, "run", cfg)
    assert code == 2 and "bad.toml" in err


def test_unknown_key_in_file_names_file_and_key(tmp_path, capsys):
    cfg = _write(tmp_path, "exp.toml", "[engine]\nmax_runing = 3\n")
    code, _, err = run_cli(capsys, "run", cfg)
    assert code == 2 and "exp.toml" in err and "max_runing" in err and "max_running" in err


def test_perf_json_breakdown(capsys):
    code, out, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h100",
                             "--prefill-tokens", "1024", "--json")
    assert code == 0, err
    data = json.loads(out)
    text = json.dumps(data)
    assert "gemm" in text and "attention" in text and "measured" in text


def test_perf_mixed_step(capsys):
    code, out, _ = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h100",
                           "--prefill-tokens", "512", "--decode-seqs", "32", "--context", "2000",
                           "--prefill-context", "1000", "--json")
    assert code == 0
    d = json.loads(out)
    assert (d["prefill_tokens"], d["decode_batch"], d["context_tokens"],
            d["prefill_context_tokens"]) == (512, 32, 2000, 1000)
    for argv, flag in ((["--prefill-tokens", "8", "--prefill-context", "5"], "--prefill-context"),
                       ([], "--prefill-tokens"),
                       (["--prefill-tokens", "8", "--decode-batch", "4", "--context", "9",
                         "--prefill-context", "-1"], "--prefill-context")):
        code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h100", *argv)
        assert code == 2 and flag in err and len(err.strip().splitlines()) == 1


def test_perf_decode_needs_context(capsys):
    code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h100",
                           "--decode-batch", "8")
    assert code == 2 and "--context" in err


def test_perf_h20_falls_back_to_roofline(capsys):
    code, out, _ = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h20",
                           "--decode-batch", "8", "--context", "512", "--json")
    assert code == 0 and "roofline" in out


@pytest.mark.parametrize("command", [["models"], ["gpus"], ["models", "--json"],
                                     ["trace", "info", "embedded:azure_conv_2023"]])
def test_catalog_commands(capsys, command):
    code, out, _ = run_cli(capsys, *command)
    assert code == 0 and out.strip()


def test_real_process_error_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fleetsim.cli", "run", "--set", "model=zzz",
                           "--out", str(tmp_path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("fleetsim: error:") and "Traceback" not in proc.stderr


def test_perf_rejects_a_shape_whose_weights_do_not_fit(capsys):
    code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-70b", "--gpu", "l40s",
                           "--prefill-tokens", "128")
    assert code == 2 and "L40S" in err and err.count("\n") == 1
