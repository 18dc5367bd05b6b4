"""Issue 26: every input surface validated like the config (programs and their loaders, RL
jobs, calibration files, repro overrides), bounded reads, and no results folder replaced
without --force. Each bad input is one line naming the field, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import assert_one_line_exit_2, run_cli  # the first round's helpers

import fleetsim
from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError

SRC = str(Path(fleetsim.__file__).resolve().parents[1])



@pytest.fixture(autouse=True)
def _own_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ---- 1. bounded reads ---------------------------------------------------------------------
def _cap_address_space() -> None:
    cap = 2 * 10**9
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def test_runs_under_a_2gb_address_space_cap(tmp_path):
    """A config of one line used to fail as "out of memory": read_bytes asked for 16 GiB."""
    config = tmp_path / "seed.toml"
    config.write_text("seed = 1\n")
    # OpenBLAS reserves a buffer per thread at import (~ 64 MiB x cores of address space):
    # one thread keeps numpy's own reservation small on a many-core machine, so the cap
    # measures fleetsim's reads and not the BLAS thread pool.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "fleetsim", "run", str(config), "--set",
         "workload.max_requests=50", "--out", str(tmp_path / "r"), "--format", "json"],
        env=env, preexec_fn=_cap_address_space, capture_output=True, text=True, timeout=300,
        check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["num_finished"] == 50


def test_read_bytes_reads_a_file_that_grew(tmp_path, monkeypatch):
    from fleetsim import inputs

    path = tmp_path / "f.txt"
    path.write_bytes(b"x" * 10)
    real_stat = os.stat

    def stale_stat(p, *a, **kw):  # the file grew after stat(): the read is not cut short
        st = real_stat(p, *a, **kw)
        return os.stat_result((st.st_mode, *st[1:6], 3, *st[7:]))

    monkeypatch.setattr(inputs.os, "stat", stale_stat)
    assert inputs.read_bytes(path, "test") == b"x" * 10
    monkeypatch.setattr(inputs, "MAX_FILE_BYTES", 5)
    with pytest.raises(FleetsimInputError, match="more than 5 bytes"):
        inputs.read_bytes(path, "test")


# ---- 2-4, 10. programs: generator arguments, JSONL, tau-bench, WEKA -----------------------
def _programs(tmp_path, generator: str = "jsonl", text: str | None = None, **kw):
    import numpy as np

    from fleetsim.programs.config import ProgramWorkloadConfig, build_programs

    path = None
    if text is not None:
        path = tmp_path / "programs.jsonl"
        path.write_text(text)
    cfg = ProgramWorkloadConfig(generator=generator, path=None if path is None else str(path),
                                num_programs=None if path else 2, **kw)
    return build_programs(cfg, np.random.default_rng(0), 131072)


@pytest.mark.parametrize(("generator", "args", "needle"), [
    ("lats", "{breadth=1.5}", "programs.args.breadth"),
    ("lats", "{depth=100000000}", "lower breadth or depth"),
    ("lats", "{width=3}", "did you mean"),
    ("map_reduce", "{fan_out=1e300}", "at most 100,000 calls per program, got 1e+300"),
    ("map_reduce", "{length_sigma=1e300}", "length_sigma"),
    ("tool_chain", "{max_calls=1000000000}", "max_calls"),
    ("tool_chain", "{step_tokens_median=nan}", "step_tokens_median"),
    ("chain", "{max_turns=true}", "programs.args.max_turns"),
    ("mixed", "{weights=[1, \"a\", 1, 1]}", "programs.args.weights[1]"),
])
def test_generator_args_are_checked_before_the_run(capsys, generator, args, needle):
    code, _, err = run_cli(capsys, "run", "--set", f"programs.generator=\"{generator}\"",
                           "--set", f"programs.args={args}")
    assert_one_line_exit_2(code, err, needle)


def test_programs_times_calls_bounded():
    from fleetsim.config import config_from_dict

    with pytest.raises(FleetsimInputError, match="more than 100,000,000"):
        config_from_dict({"programs": {"generator": "lats", "num_programs": 10_000_000,
                                       "args": {"breadth": 10, "depth": 10}}})


@pytest.mark.parametrize("settings", [["workload.rate_scale=3"],
                                      ["workload.max_requests=5"]])
def test_workload_keys_beside_programs_are_an_error(capsys, settings):
    argv = ["run", "--set", "programs.num_programs=2"]
    for s in settings:
        argv += ["--set", s]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_exit_2(code, err, "is ignored when [programs] is set")


def _call(**kw) -> dict:
    return {"prompt_tokens": 100, "output_tokens": 5, **kw}


@pytest.mark.parametrize(("call", "needle"), [
    ('{"prompt_tokens": NaN, "output_tokens": 5}', "prompt_tokens"),
    ('{"prompt_tokens": 10, "output_tokens": Infinity}', "output_tokens"),
    ('{"prompt_tokens": 1e300, "output_tokens": 5}', "prompt_tokens"),
    ('{"prompt_tokens": 10, "output_tokens": 5, "tool_s": 1e300}', "tool_s"),
    ('{"prompt_tokens": 10, "output_tokens": 5, "tool_s": NaN}', "tool_s"),
    ('{"prompt_tokens": 10, "output_tokens": 5, "hash_ids": [18446744073709551616]}',
     "hash_ids"),
    ('{"prompt_tokens": 10, "output_tokens": 5, "hash_ids": [1, 2, 3]}', "hash_ids"),
])
def test_jsonl_numbers_are_checked(tmp_path, call, needle):
    with pytest.raises(FleetsimInputError, match=needle):
        _programs(tmp_path, text='{"calls": [' + call + ']}\n')


def test_jsonl_arrival_beyond_the_time_limit(tmp_path):
    with pytest.raises(FleetsimInputError, match="arrival_s"):
        _programs(tmp_path, text=json.dumps({"arrival_s": 1e300, "calls": [_call()]}) + "\n")


def test_jsonl_bad_program_is_one_line_from_the_cli(tmp_path, capsys):
    path = tmp_path / "p.jsonl"
    path.write_text('{"calls": [{"prompt_tokens": NaN, "output_tokens": 5}]}\n')
    code, _, err = run_cli(capsys, "run", "--set", "programs.generator=\"jsonl\"",
                           "--set", f"programs.path=\"{path}\"")
    assert_one_line_exit_2(code, err, "prompt_tokens", "nan")


@pytest.mark.parametrize(("data", "needle"), [
    ([], "no assistant message"),
    ([{"traj": []}], "no assistant message"),
    ([{"traj": ["x"]}], "traj[0]"),
    ([{"traj": [{"role": "assistant", "content": 7}]}], "content"),
    ([{"traj": [{"role": "assistant", "content": "a", "tool_calls": "f"}]}], "tool_calls"),
])
def test_tau_bench_loader_validates(tmp_path, data, needle):
    import numpy as np

    from fleetsim.programs.config import ProgramWorkloadConfig, build_programs

    path = tmp_path / "tau.json"
    path.write_text(json.dumps(data))
    cfg = ProgramWorkloadConfig(generator="tau_bench", path=str(path), num_programs=None)
    with pytest.raises(FleetsimInputError, match=needle.replace("[", r"\[")):
        build_programs(cfg, np.random.default_rng(0), 131072)


def _weka(tmp_path, files: dict[str, str]):
    import numpy as np

    from fleetsim.programs.config import ProgramWorkloadConfig, build_programs

    folder = tmp_path / "weka"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    cfg = ProgramWorkloadConfig(generator="weka", path=str(folder), num_programs=None)
    return build_programs(cfg, np.random.default_rng(0), 131072)


def _weka_request(**kw) -> dict:
    return {"type": "n", "in": 128, "out": 4, "hash_ids": [1, 2], "think_time": 0, **kw}


@pytest.mark.parametrize(("files", "needle"), [
    ({}, "no trace_\\*.json"),
    ({"notes.txt": "x"}, "no trace_\\*.json"),
    ({"trace_1.json": "{"}, "not JSON"),
    ({"trace_1.json": "[]"}, "WEKA trace is"),
    ({"trace_1.json": json.dumps({"requests": [_weka_request(think_time=1e300)]})},
     "think_time"),
    ({"trace_1.json": json.dumps({"requests": [_weka_request(**{"in": "x"})]})},
     r"requests\[0\].in"),
    ({"trace_1.json": json.dumps({"requests": [_weka_request(hash_ids=[2**70])]})},
     "hash_ids"),
    ({"trace_1.json": json.dumps({"requests": [{"type": "n"}]})}, "in"),
    ({"trace_1.json": json.dumps({"requests": [_weka_request(**{"in": 10**7})]})},
     "pick a model with a longer context"),
])
def test_weka_loader_validates_with_an_honest_message(tmp_path, files, needle):
    with pytest.raises(FleetsimInputError, match=needle) as info:
        _weka(tmp_path, files)
    assert "raise the model's context" not in str(info.value)


# ---- 5. RL job sizes ----------------------------------------------------------------------
@pytest.mark.parametrize(("sets", "needle"), [
    (["samples_per_prompt=100000000"], "more than 1,048,576"),
    (["num_prompts_per_step=100000", "samples_per_prompt=100"], "samples per step"),
    (["num_steps=100000", "num_prompts_per_step=4096", "samples_per_prompt=256"],
     "simulate fewer steps"),
    (["num_steps=1000000"], "num_steps"),
    (["max_response_tokens=1e300"], "max_response_tokens"),
])
def test_rl_job_sizes_bounded(sets, needle):
    from fleetsim.rl.config import load_rl_config

    with pytest.raises(FleetsimInputError, match=needle):
        load_rl_config(None, sets)


@pytest.mark.parametrize(("sets", "needle"), [
    (["lengths={kind=\"fixed\", value=32, prompt_tokens=200000}"], "rl.lengths.prompt_tokens"),
    (["max_response_tokens=131000"], "rl.max_response_tokens"),
])
def test_rl_rollout_longer_than_the_actor_context(capsys, sets, needle):
    argv = ["rl", "run"]
    for s in sets:
        argv += ["--set", s]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_exit_2(code, err, needle, "131,072")


# ---- 7. results folders replaced only with --force ----------------------------------------
def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


RL_TINY = ["--set", "num_steps=1", "--set", "num_prompts_per_step=2", "--set",
           "samples_per_prompt=2", "--set", "actor=\"llama-3.1-8b\"", "--set",
           "pools=[{name=\"p\",gpu=\"h100\",num_gpus=2}]", "--set", "max_response_tokens=64"]


@pytest.mark.parametrize("argv", [
    ["repro", "areal-tik", "--quick"],
    ["rl", "run", *RL_TINY],
    ["plan", "--gpus", "h100", "--max-gpus", "1", "--requests-per-gpu", "40", "--max-runs",
     "4"],
])
def test_a_results_folder_is_replaced_only_with_force(tmp_path, capsys, argv):
    out = tmp_path / "r"
    assert main(["run", "--set", "workload.max_requests=4", "--out", str(out)]) == 0
    before = _snapshot(out)
    capsys.readouterr()
    code, _, err = run_cli(capsys, *argv, "--out", str(out))
    assert_one_line_exit_2(code, err, "--out", "pass --force")
    assert _snapshot(out) == before


def test_rl_run_with_force_replaces_the_set(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--set", "workload.max_requests=4", "--out", str(out)]) == 0
    assert main(["rl", "run", *RL_TINY, "--out", str(out), "--force"]) == 0
    names = {p.name for p in out.iterdir()}
    assert "timeline.csv" in names and "requests.csv" not in names


# ---- 6. calibrate -------------------------------------------------------------------------
def _step_csv(tmp_path, truth: dict, *, extra: str = "") -> Path:
    import numpy as np

    from fleetsim.calibrate import fit
    from fleetsim.config import load_config

    rng = np.random.default_rng(1)
    n = rng.integers(1, 200, 40)
    rows = np.c_[n, n * rng.integers(100, 4000, 40), np.zeros(40), np.zeros(40),
                 np.ones(40)].astype(float)
    kernels = fit.kernel_times_s(load_config(None), rows)
    rows[:, 4] = fit.predict_step_rows(kernels, rows, truth)
    lines = [",".join(fit.STEP_COLUMNS)] + [",".join(f"{x:.17g}" for x in r) for r in rows]
    path = tmp_path / "steps.csv"
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def test_step_fit_never_writes_a_config_run_rejects(tmp_path, capsys):
    """Steps faster than the kernels alone: least squares says a negative overhead."""
    from fleetsim.config import load_config

    truth = {"step_overhead_s": -0.001, "step_overhead_per_seq_s": 1e-6,
             "kernel_time_scale": 1.0}
    path = _step_csv(tmp_path, truth)
    out = tmp_path / "cal.toml"
    assert main(["calibrate", str(path), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["step_overhead_s"] == 0.0
    assert any("step_overhead_s held at 0" in n for n in report["notes"])
    assert load_config(out).engine.step_overhead_s == 0.0  # run takes it as it is
    assert "unbounded least squares gave -0.001" in out.read_text()


def test_bounded_step_fit_is_the_box_optimum():
    """Against brute force over a grid of the box: no point inside fits better."""
    import itertools

    import numpy as np

    from fleetsim.calibrate import fit

    rng = np.random.default_rng(2)
    rows = np.c_[rng.integers(1, 50, 30), np.zeros(30), np.zeros(30), np.zeros(30),
                 np.zeros(30)].astype(float)
    kernels = rng.uniform(1e-3, 5e-3, 30)
    rows[:, 4] = -0.004 + 3e-4 * rows[:, 0] + 0.1 * kernels + rng.normal(0, 1e-4, 30)
    got = fit.fit_step_rows(kernels, rows)

    def sse(p):
        return float(np.sum((fit.predict_step_rows(kernels, rows, p) - rows[:, 4]) ** 2))

    for k, (lo, hi) in fit.BOUNDS.items():
        assert lo <= got[k] <= hi
    grid = [np.linspace(*fit.BOUNDS[k], 21) for k in fit.PARAMS]
    best = min(sse(dict(zip(fit.PARAMS, x, strict=True))) for x in itertools.product(*grid))
    assert sse(got) <= best + 1e-15


@pytest.mark.parametrize(("row", "needle"), [
    ("1,100,1e30,0,0.01", "column 'prefill_tokens'"),
    ("1e12,100,0,0,0.01", "column 'num_decode'"),
    ("1,1e30,0,0,0.01", "column 'decode_kv_tokens'"),
    ("1,100,0.5,0,0.01", "column 'prefill_tokens'"),
    ("1,100,0,0,1e300", "column 'step_time_s'"),
    ("1,100,200000,0,0.01", "context"),
])
def test_step_csv_counts_bounded(tmp_path, capsys, row, needle):
    path = _step_csv(tmp_path, {"step_overhead_s": 0.002, "step_overhead_per_seq_s": 0.0,
                                "kernel_time_scale": 1.0}, extra=row + "\n")
    code, _, err = run_cli(capsys, "calibrate", str(path), "--out", str(tmp_path / "c.toml"))
    assert_one_line_exit_2(code, err, needle)


GOOD_RESULT = {"completed": 3, "total_input_tokens": 300, "total_output_tokens": 30,
               "mean_ttft_ms": 20.0, "mean_tpot_ms": 5.0}


@pytest.mark.parametrize(("fields", "needle", "absent"), [
    ({"num_prompts": "abc"}, "num_prompts", None),
    ({"num_prompts": 1e300}, "num_prompts", None),
    ({"total_input_tokens": 3e12}, "total_input_tokens", "--isl"),
    ({"total_output_tokens": 3e12}, "total_output_tokens", "--osl"),
    ({"request_rate": 1e300}, "request_rate", "--request-rate"),
    ({"burstiness": 1e300}, "burstiness", "--burstiness"),
    ({"burstiness": 0.5}, "burstiness", "--burstiness"),
    ({"max_concurrency": 10**12}, "max_concurrency", "--max-concurrency"),
    ({"model_id": "nosuch/model-7b"}, "model_id", None),
    ({"model_id": 7}, "model_id", None),
])
def test_result_file_fields_are_named_as_fields(tmp_path, capsys, fields, needle, absent):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**GOOD_RESULT, **fields}))
    code, _, err = run_cli(capsys, "calibrate", str(path), "--holdout", "0", "--fit",
                           "step_overhead_s", "--out", str(tmp_path / "c.toml"))
    assert_one_line_exit_2(code, err, f"{path}: {needle}")
    assert absent is None or absent not in err


def test_results_of_different_models_are_an_error(tmp_path):
    from fleetsim.calibrate import fit

    results = []
    for i, name in enumerate(("llama-3.1-8b", "qwen2.5-7b")):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({**GOOD_RESULT, "model_id": name}))
        results.append(fit.load_bench_result(str(path)))
    with pytest.raises(FleetsimInputError, match="different models"):
        fit.model_override(results)
    unknown = tmp_path / "u.json"
    unknown.write_text(json.dumps({**GOOD_RESULT, "model_id": "nosuch/model"}))
    assert fit.model_override([fit.load_bench_result(str(unknown))], model_given=True) == []
    assert fit.model_given(None, ["model=\"llama-3.1-8b\""])


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    import errno

    from fleetsim import results

    path = _step_csv(tmp_path, {"step_overhead_s": 0.002, "step_overhead_per_seq_s": 0.0,
                                "kernel_time_scale": 1.0})
    out = tmp_path / "c.toml"
    out.write_text("# earlier\n")

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "replace", full)
    code, _, err = run_cli(capsys, "calibrate", str(path), "--out", str(out))
    assert_one_line_exit_2(code, err, "--out", "No space left on device")
    assert out.read_text() == "# earlier\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(results.TMP_PREFIX)]


# ---- 9. still failing from the first round ------------------------------------------------
def test_slowest_link_bandwidth_is_bounded(capsys):
    code, _, err = run_cli(capsys, "run", "--set", "workload.max_requests=4", "--set",
                           "cluster.link.bw_bytes_per_s=1e-300", "--set",
                           'cluster.pools=[{name="p", gpu="h100", role="prefill"}, '
                           '{name="d", gpu="h100", role="decode"}]')
    assert_one_line_exit_2(code, err, "cluster.link.bw_bytes_per_s", "1e-300")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--seed", "-1"], "--seed"),
    (["--num-gpus", "100000000", "--gpus-per-node", "1"], "--num-gpus"),
    (["--microbatches", "1000000"], "--microbatches"),
    (["--tokens-per-gpu", "100000000"], "--tokens-per-gpu"),
])
def test_moe_compare_flags_bounded(capsys, argv, needle):
    code, _, err = run_cli(capsys, "moe", "compare", *argv)
    assert_one_line_exit_2(code, err, needle)


def test_report_on_an_unreadable_folder(tmp_path, capsys, monkeypatch):
    """Run as root the mode bits do not stop us: the listing fails as it would for a user."""
    import pathlib

    folder = tmp_path / "r"
    assert main(["run", "--set", "workload.max_requests=4", "--out", str(folder)]) == 0
    capsys.readouterr()
    real = pathlib.Path.iterdir

    def denied(self):
        if self == folder:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "iterdir", denied)
    code, _, err = run_cli(capsys, "report", str(folder))
    assert_one_line_exit_2(code, err, str(folder), "Permission denied", "permissions")


@pytest.mark.parametrize(("setting", "needles"), [
    ('cluster.router={name="hostile_plugins:R"}',
     ["cluster.router", "no router", "fix hostile_plugins:R.__init__"]),
    ('policy.batching={name="hostile_plugins:B"}',
     ["policy.batching", "fix hostile_plugins:B.__init__", "policy.batching.args"]),
    ('cluster.router={name="hostile_plugins:X"}', ["cluster.router.name", "not callable"]),
    ('policy.ordering="hostile_plugins:X"', ["policy.ordering", "not callable"]),
])
def test_plugin_failures_name_the_fix(tmp_path, capsys, monkeypatch, setting, needles):
    (tmp_path / "hostile_plugins.py").write_text(
        "class R:\n    def __init__(self):\n        raise RuntimeError('no router')\n"
        "class B:\n    def __init__(self, **kw):\n        raise RuntimeError('no batch')\n"
        "X = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hostile_plugins", raising=False)
    code, _, err = run_cli(capsys, "run", "--set", "workload.max_requests=4", "--set", setting)
    assert_one_line_exit_2(code, err, *needles)


# ---- 10. silently accepted ----------------------------------------------------------------
def test_repro_overrides_mark_the_document_and_the_table():
    from fleetsim.repro import get_reproduction
    from fleetsim.repro.cli import _ratio_line, _result_table
    from fleetsim.repro.frame import Comparison, to_document

    repro = get_reproduction("fastserve")
    comparison = Comparison(results={"fastserve": {"1": 1.0}}, ratio=1.5)
    paper = to_document(repro, comparison, quick=True)
    assert paper["paper_setting"] is True and paper["overrides"] == []
    assert f"paper {repro.paper_ratio:.2f}x" in _ratio_line(repro, paper)
    doc = to_document(repro, comparison, quick=True, overrides=["hardware.gpu=\"a100\""])
    assert doc["paper_setting"] is False and doc["overrides"] == ["hardware.gpu=\"a100\""]
    line = _ratio_line(repro, doc)
    assert "not comparable" in line and "--set hardware.gpu=\"a100\"" in line
    assert f"paper {repro.paper_ratio:.2f}x" not in line
    assert "NOT the paper's setting" in str(_result_table(repro, doc).title)


def test_numpy_runtime_warnings_do_not_reach_stderr(capsys, monkeypatch):
    import warnings

    import numpy as np

    from fleetsim import cli

    def noisy(args):
        print(float(np.mean(np.array([]))), float(np.float64(0.0) / np.float64(0.0)))
        return 0

    monkeypatch.setattr(cli, "cmd_models", noisy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli(capsys, "models")
    assert code == 0 and out.strip() == "nan nan" and err == ""
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_programs_arrival_span_and_tool_tails_bounded():
    import numpy as np

    from fleetsim.config import config_from_dict
    from fleetsim.programs.generators import ToolChainArgs, tool_chain

    with pytest.raises(FleetsimInputError, match="beyond 1e\\+09 s"):
        config_from_dict({"programs": {"num_programs": 10_000, "rate_per_s": 1e-6}})
    # the widest tail at the largest median never draws a tool call beyond the time limit
    args = ToolChainArgs(tool_median_s=1e9, tool_sigma=5.0, mean_calls=30, max_calls=30)
    calls = tool_chain(args, np.random.default_rng(0))
    assert max(c.tool_s for c in calls) <= 1e9
