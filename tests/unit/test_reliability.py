"""Issue 14: every bad input one line and exit 2, results replaced as a set, no garbage.

File-system faults on every reader, unwritable outputs found before the work, result folders
that are the old set or the new set byte for byte when a write fails or a signal arrives.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleetsim import results
from fleetsim.cli import main

TINY = ["--set", "workload.max_requests=8"]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_exit_2(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def no_strays(parent: Path) -> None:
    assert not [p.name for p in parent.iterdir() if p.name.startswith(results.TMP_PREFIX)]


# ---- class 1: file errors other than "missing" --------------------------------------------
def _bad_files(tmp_path: Path) -> dict[str, str]:
    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00garbage")
    parent_file = tmp_path / "plain"
    parent_file.write_text("x")
    return {"binary": str(binary), "folder": str(tmp_path), "device": "/dev/zero",
            "under_a_file": str(parent_file / "child.toml")}


COMMANDS = {
    "config": lambda p: ["run", p, *TINY],
    "trace": lambda p: ["trace", "info", p],
    "gpu catalog": lambda p: ["gpus", "--catalog", p],
    "sweep spec": lambda p: ["sweep", p],
    "model": lambda p: ["perf", "--model", p, "--gpu", "h100", "--prefill-tokens", "8"],
    "report": lambda p: ["report", p],
}


@pytest.mark.parametrize("kind", ["binary", "folder", "device", "under_a_file"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_file_faults_are_one_line_exit_2(tmp_path, capsys, monkeypatch, kind, command):
    monkeypatch.chdir(tmp_path)
    path = _bad_files(tmp_path)[kind]
    if command == "report" and kind == "folder":
        pytest.skip("a folder is what report reads")
    if command == "model" and kind == "folder":
        path = str(tmp_path / "binary.bin")  # a model folder means <folder>/config.json
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").mkdir()
        path = str(tmp_path / "m")
    code, _, err = run_cli(capsys, *COMMANDS[command](path))
    assert_one_line_exit_2(code, err)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_unreadable_config(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text("seed = 1\n")
    path.chmod(0)
    code, _, err = run_cli(capsys, "run", str(path))
    assert_one_line_exit_2(code, err, "cannot read")


def test_toml_with_bom_is_read(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_bytes("\ufeffseed = 3\n[workload]\nmax_requests = 4\n".encode())
    code, _, err = run_cli(capsys, "run", str(path), "--out", str(tmp_path / "o"), "--json")
    assert code == 0, err
    assert json.loads((tmp_path / "o" / "config.json").read_text())["seed"] == 3


# ---- class 2: an unwritable --out is found before the work --------------------------------
@pytest.mark.parametrize("argv", [
    ["run", *TINY], ["sweep", "SPEC"], ["plan", "--gpus", "h100", "--max-runs", "1"]])
def test_out_under_a_file_fails_before_work(tmp_path, capsys, monkeypatch, argv):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    spec = tmp_path / "spec.toml"
    spec.write_text('[grid]\n"workload.rate_scale" = [1]\n')
    called = []
    monkeypatch.setattr("fleetsim.run.run", lambda *a, **k: called.append(1))
    argv = [str(spec) if a == "SPEC" else a for a in argv]
    code, _, err = run_cli(capsys, *argv, "--out", str(blocker / "out"))
    assert_one_line_exit_2(code, err, "--out", "is a file")
    assert not called


def test_out_folder_with_foreign_files_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    code, _, err = run_cli(capsys, "run", *TINY, "--out", str(out))
    assert_one_line_exit_2(code, err, "thesis.tex")
    assert (out / "thesis.tex").read_text() == "precious"


def test_plot_into_missing_folder_and_bad_suffix(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(capsys, "plan", "--plot", str(blocker / "p.png"))
    assert_one_line_exit_2(code, err, "--plot")
    code, _, err = run_cli(capsys, "plan", "--plot", str(tmp_path / "p.txt"))
    assert_one_line_exit_2(code, err, ".png")


def test_write_file_creates_missing_folders(tmp_path):
    target = tmp_path / "a" / "b" / "plot.png"
    results.check_out_file(target, "--plot")
    results.write_file(target, b"png")
    assert target.read_bytes() == b"png"
    no_strays(target.parent)


# ---- class 3: result files replaced as a set ----------------------------------------------
@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("old") / "res"
    assert main(["run", *TINY, "--set", "seed=1", "--out", str(out)]) == 0
    return snapshot(out)


def _restore(out: Path, files: dict[str, bytes]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)


@pytest.mark.parametrize("fault", ["oserror", "interrupt", "sigterm"])
@pytest.mark.parametrize("victim", ["write_json", "write_requests_csv"])
def test_failed_write_keeps_the_old_set_byte_for_byte(tmp_path, capsys, monkeypatch, old_run,
                                                      fault, victim):
    out = tmp_path / "res"
    _restore(out, old_run)
    real = getattr(results, victim)
    calls = []

    def failing(path, data, *rest):
        calls.append(path.name)
        if len(calls) == 2 or victim == "write_requests_csv":  # after a file was written
            if fault == "oserror":
                raise OSError(28, "No space left on device")
            if fault == "interrupt":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        real(path, data, *rest)

    monkeypatch.setattr(results, victim, failing)
    code = main(["run", *TINY, "--set", "seed=2", "--out", str(out), "--force"])
    err = capsys.readouterr()[1]
    assert code == {"oserror": 2, "interrupt": 130, "sigterm": 143}[fault]
    assert "earlier results" in err and "Traceback" not in err
    assert snapshot(out) == old_run
    no_strays(tmp_path)


def test_successful_run_replaces_every_file(tmp_path, old_run):
    out = tmp_path / "res"
    _restore(out, old_run)
    (out / "error.txt").write_text("stale")
    assert main(["run", *TINY, "--set", "seed=2", "--out", str(out)]) == 2  # refused
    assert main(["run", *TINY, "--set", "seed=2", "--out", str(out), "--force"]) == 0
    new = snapshot(out)
    assert set(new) == {"summary.json", "config.json", "requests.csv"}
    assert new["config.json"] != old_run["config.json"]
    no_strays(tmp_path)


def test_swap_without_renameat2_still_replaces_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_exchange", lambda a, b: False)
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("old")
    (out / "requests.csv").write_text("old")
    with results.StagedFolder(out) as tmp:
        (tmp / "summary.json").write_text("new")
    assert snapshot(out) == {"summary.json": b"new"}
    no_strays(tmp_path)


def _spec(tmp_path: Path, values: str) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(f'[base.workload]\nmax_requests = 6\n[grid]\n"hardware.gpu" = [{values}]\n')
    return spec


def test_resweep_leaves_no_stale_points(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", str(_spec(tmp_path, '"h100", "a100"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in (out / "points").iterdir()) == ["0", "1"]
    assert main(["sweep", str(_spec(tmp_path, '"h100"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in (out / "points").iterdir()) == ["0"]
    capsys.readouterr()
    no_strays(tmp_path)


def test_sweep_of_failures_keeps_earlier_good_sweep(tmp_path, capsys):
    out = tmp_path / "sw"
    assert main(["sweep", str(_spec(tmp_path, '"h100"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 0
    before = snapshot(out)
    assert main(["sweep", str(_spec(tmp_path, '"bogus"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 1
    assert "keeps its earlier results" in capsys.readouterr()[1]
    assert snapshot(out) == before
    no_strays(tmp_path)


def test_interrupted_sweep_keeps_earlier_sweep(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    assert main(["sweep", str(_spec(tmp_path, '"h100"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 0
    before = snapshot(out)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("fleetsim.sweep.driver.write_table", interrupted)
    assert main(["sweep", str(_spec(tmp_path, '"h100", "a100"')), "--workers", "1",
                 "--out", str(out), "--force"]) == 130
    assert snapshot(out) == before
    no_strays(tmp_path)


def test_json_output_rejects_non_finite():
    from fleetsim.inputs import to_json

    with pytest.raises(ValueError, match=r"a\.b\[1\]"):
        to_json({"a": {"b": [1.0, float("nan")]}})


# ---- class 4: missing required keys, policy argument types --------------------------------
def test_set_one_policy_arg_keeps_the_default_policy(tmp_path, capsys):
    code, out, err = run_cli(capsys, "run", *TINY, "--json", "--out", str(tmp_path / "o"),
                             "--set", "policy.batching.args.enable_chunked_prefill=false")
    assert code == 0, err
    config = json.loads((tmp_path / "o" / "config.json").read_text())
    assert config["policy"]["batching"] == {"name": "token_budget",
                                            "args": {"enable_chunked_prefill": False}}


@pytest.mark.parametrize(("override", "needles"), [
    ('policy.batching.args.enable_chunked_prefill="no"', ["enable_chunked_prefill",
                                                           "true or false"]),
    ("policy.batching.args.enable_chunked_prefil=true", ["did you mean"]),
    ("policy.batching.args.long_prefill_token_threshold=1e300", ["long_prefill_token"]),
    ('cluster.pools=[{name="a"}]', ["cluster.pools[0].gpu", "missing required key"]),
    ('cluster.router={name="round_robin", args={bogus=1}}', ["cluster.router.args.bogus"]),
])
def test_policy_and_table_errors(capsys, override, needles):
    code, _, err = run_cli(capsys, "run", *TINY, "--set", override)
    assert_one_line_exit_2(code, err, *needles)
    if "valid keys" in err:
        assert err.split("valid keys")[1].count("bogus") == 0


# ---- class 5: Hugging Face config.json ----------------------------------------------------
HF = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
      "max_position_embeddings": 4096}


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("num_hidden_layers", True, "num_hidden_layers"),
    ("num_attention_heads", 3, "not a multiple"),
    ("num_attention_heads", 0, "num_attention_heads"),
    ("hidden_size", [4096], "hidden_size"),
    ("vocab_size", "Infinity", "vocab_size"),
    ("intermediate_size", 1.5, "intermediate_size"),
    ("num_key_value_heads", 0, "num_key_value_heads"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings"),
])
def test_hf_config_values_are_checked(tmp_path, capsys, key, value, needle):
    path = tmp_path / "config.json"
    text = json.dumps({**HF, key: value})
    path.write_text(text.replace('"Infinity"', "Infinity"))
    code, _, err = run_cli(capsys, "perf", "--model", str(path), "--gpu", "h100",
                           "--prefill-tokens", "16")
    assert_one_line_exit_2(code, err, needle)


def test_hf_config_valid_loads(tmp_path):
    from fleetsim.models import get_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF))
    assert get_model(str(path)).head_dim == 64


# ---- class 6: non-finite and enormous numbers ---------------------------------------------
@pytest.mark.parametrize("override", [
    "cluster.link.latency_s=inf", "cluster.link.latency_s=1e300", "cluster.link.latency_s=nan",
    "seed=-1", "slo.ttft_s=nan", "slo.tpot_s=inf", "workload.max_requests=1000000000000",
    "engine.block_size=100000", "until_s=1e300",
])
def test_non_finite_and_enormous_numbers(capsys, override):
    code, _, err = run_cli(capsys, "run", *TINY, "--set", override)
    assert_one_line_exit_2(code, err, override.split("=")[0].rsplit(".", 1)[-1])


def test_nan_gpu_price_in_catalog(tmp_path, capsys):
    cat = tmp_path / "gpus.toml"
    cat.write_text("[[gpu]]\nname='X'\npeak_bf16_flops=1e15\npeak_fp8_flops=1e15\n"
                   "hbm_bytes=8e10\nhbm_bw_bytes_per_s=3e12\nnvlink_bw_bytes_per_s=4e11\n"
                   "network_bw_bytes_per_s=5e10\nnum_gpus_per_node=8\nprice_per_hour_usd=nan\n")
    code, _, err = run_cli(capsys, "gpus", "--catalog", str(cat))
    assert_one_line_exit_2(code, err, "price_per_hour_usd")


def test_slowest_link_still_finishes(tmp_path):
    """The largest link latency allowed (60 s) on a P/D cluster: a run that ends."""
    from fleetsim.config import load_config
    from fleetsim.run import run

    config = load_config(None, [
        "workload.max_requests=4", "cluster.link.latency_s=60",
        'cluster.pools=[{name="p", gpu="h100", role="prefill"}, '
        '{name="d", gpu="h100", role="decode"}]'])
    summary = run(config).summary
    assert summary["num_finished"] == 4
    assert summary["ttft_s"]["p50"] < summary["e2e_s"]["p50"]
    assert summary["e2e_s"]["p50"] >= 60


@pytest.mark.parametrize(("settings", "needle"), [
    (["workload.rate_per_s=1e-300", "workload.num_requests=5"], "rate_per_s"),
    (["workload.rate_per_s=1e-6", "workload.num_requests=2000"], "rate_per_s"),
    (["workload.rate_per_s=1e7", "workload.duration_s=1e9"], "duration_s"),
])
def test_synthetic_rates_bounded(capsys, settings, needle):
    base = ['workload.trace="synthetic"', 'workload.prompt_tokens={kind="fixed", value=10}',
            'workload.output_tokens={kind="fixed", value=2}']
    argv = ["run"]
    for s in base + settings:
        argv += ["--set", s]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_exit_2(code, err, needle)


@pytest.mark.parametrize(("row", "needle"), [
    ("1e300,10,10", "arrival_s"), ("1,1e300,10", "prompt_tokens"),
    ("1,10,true", "output_tokens"), ("1,10,10,5", "expected 3 fields"),
])
def test_trace_rows(tmp_path, capsys, row, needle):
    trace = tmp_path / "t.csv"
    trace.write_text(f"arrival_s,prompt_tokens,output_tokens\n0,10,10\n{row}\n")
    code, _, err = run_cli(capsys, "trace", "info", str(trace))
    assert_one_line_exit_2(code, err, needle)


def test_duplicate_trace_columns(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,prompt_tokens\n0,10,10,20\n")
    code, _, err = run_cli(capsys, "trace", "info", str(trace))
    assert_one_line_exit_2(code, err, "appears twice")


# ---- class 8: user plug-ins ---------------------------------------------------------------
@pytest.mark.parametrize(("source", "needle"), [
    ("def key(:\n", "syntax error"),
    ("raise RuntimeError('boom at import')\n", "boom at import"),
    ("def key(req, now_s):\n    raise ZeroDivisionError('boom in key')\n", "boom in key"),
])
def test_plugin_failures_name_the_field(tmp_path, capsys, monkeypatch, source, needle):
    name = f"hostile_plugin_{abs(hash(source)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli(capsys, "run", *TINY, "--set", f'policy.ordering="{name}:key"',
                           "--out", str(tmp_path / "o"))
    assert_one_line_exit_2(code, err, "policy.ordering", needle)
    sys.modules.pop(name, None)


def test_plugin_constructor_failure_names_the_field(tmp_path, capsys, monkeypatch):
    name = "hostile_router_ctor"
    (tmp_path / f"{name}.py").write_text(
        "class R:\n    def __init__(self):\n        raise RuntimeError('no router')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = run_cli(capsys, "run", *TINY, "--set", f'cluster.router={{name="{name}:R"}}')
    assert_one_line_exit_2(code, err, "cluster.router", "no router")
    sys.modules.pop(name, None)


# ---- class 9: fleetsim perf limits --------------------------------------------------------
@pytest.mark.parametrize(("argv", "needle"), [
    (["--prefill-tokens", "10000000"], "context"),
    (["--decode-batch", "100000", "--context", "100000"], "KV tokens"),
    (["--decode-batch", "1", "--context", "200000"], "context"),
    (["--prefill-tokens", "16", "--tp", "16"], "--tp"),
    (["--prefill-tokens", "99999999999"], "--prefill-tokens"),
])
def test_perf_limits(capsys, argv, needle):
    code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "h100", *argv)
    assert_one_line_exit_2(code, err, needle)


# ---- class 10: smaller --------------------------------------------------------------------
def test_oversized_block_is_blamed_on_block_size(capsys):
    code, _, err = run_cli(capsys, "run", *TINY, "--set", "engine.gpu_memory_utilization=0.22",
                           "--set", "engine.block_size=4096")
    assert_one_line_exit_2(code, err, "engine.block_size")


def test_misspelled_aic_system(tmp_path, capsys):
    cat = tmp_path / "gpus.toml"
    cat.write_text("[[gpu]]\nname='X'\npeak_bf16_flops=1e15\npeak_fp8_flops=1e15\n"
                   "hbm_bytes=8e10\nhbm_bw_bytes_per_s=3e12\nnvlink_bw_bytes_per_s=4e11\n"
                   "network_bw_bytes_per_s=5e10\nnum_gpus_per_node=8\nprice_per_hour_usd=1\n"
                   "aic_system='h100_sx'\n")
    code, _, err = run_cli(capsys, "perf", "--model", "llama-3.1-8b", "--gpu", "X",
                           "--gpu-catalog", str(cat), "--prefill-tokens", "16")
    assert_one_line_exit_2(code, err, "aic_system", "h100_sx")


def test_priority_ordering_needs_priorities(capsys):
    code, _, err = run_cli(capsys, "run", *TINY, "--set", 'policy.ordering="priority"')
    assert_one_line_exit_2(code, err, "policy.ordering", "priority column")


def test_empty_grid(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text("[grid]\n")
    code, _, err = run_cli(capsys, "sweep", str(spec), "--out", str(tmp_path / "o"))
    assert_one_line_exit_2(code, err, "grid is empty")


def test_plan_with_nothing_feasible_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "plan"
    code, _, err = run_cli(capsys, "plan", "--set", "model=deepseek-v3", "--gpus", "l40s",
                           "--max-gpus", "1", "--out", str(out))
    assert code == 1
    assert "no shape meets the target" in err
    assert not out.exists()


def test_broken_pipe_is_quiet():
    proc = subprocess.run(
        f"'{sys.executable}' -m fleetsim.cli models --json | head -c 1",
        shell=True, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")})
    assert "Traceback" not in proc.stderr
    assert "BrokenPipe" not in proc.stderr


def test_moe_plot_under_a_file_fails_before_work(tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setattr("fleetsim.moe.cli._setups", lambda args: pytest.fail("work started"))
    code, _, err = run_cli(capsys, "moe", "compare", "--plot", str(blocker / "p.png"))
    assert_one_line_exit_2(code, err, "--plot")


@pytest.mark.parametrize("argv", [
    ["goodput", "--min-rate", "inf"], ["goodput", "--max-rate", "1e300"],
    ["goodput", "--max-runs", "1000000000000"], ["goodput", "--tol", "nan"],
    ["slo-scale", "--pct", "nan"], ["plan", "--max-gpus", "1000000000"],
    ["sweep", "s.toml", "--workers", "100000000"],
])
def test_cli_flags_bounded(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_exit_2(code, err, argv[-2])


@pytest.fixture(autouse=True)
def _own_working_folder(tmp_path, monkeypatch):
    """Runs without --out write results/<name>/ under the working folder: give each test
    its own, so earlier results there (which a run refuses to replace) cannot interfere."""
    monkeypatch.chdir(tmp_path)
