"""Issue 13: the first hour (examples, warnings, wide tables, --force, config reference) and
the ecosystem's vocabulary (vLLM names, HF ids, shorthands, closed loop, vLLM result JSON)."""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import load_config
from fleetsim.models import get_model
from fleetsim.run import run

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--set", "workload.max_requests=30"]


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- section 1 ------------------------------------------------------------------------
def test_overloaded_run_warns_in_table_and_summary(tmp_path, capsys):
    code, out, err = cli(capsys, "run", "--out", str(tmp_path / "o"), "--set",
                         "workload.duration_s=30", "--set", "workload.rate_scale=12")
    assert code == 0, err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    ov = s["overload"]
    assert ov["queue_grew"] and ov["offered_over_capacity"] > 1.5
    assert "queue grew for the whole run: offered load is about" in ov["warning"]
    assert "queue grew" in out and "queue grew" in err


def test_sane_run_does_not_warn(tmp_path, capsys):
    code, out, _ = cli(capsys, "run", "--out", str(tmp_path / "o"), "--set",
                       "workload.duration_s=60")
    assert code == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert not s["overload"]["queue_grew"] and "warning" not in s["overload"]
    assert 0.8 < s["overload"]["offered_over_capacity"] < 1.2
    assert "WARNING" not in out


@pytest.mark.parametrize("command", [["models"], ["gpus"]])
def test_tables_never_cut_names_when_piped(capsys, command):
    code, out, _ = cli(capsys, *command)
    assert code == 0
    assert "…" not in out and "..." not in out
    if command == ["models"]:
        assert "Llama-3.1-8B" in out and "meta-llama/Llama-3.1-8B-Instruct" in out
        assert "131,072" in out
    assert "━" not in out  # plain layout, no box drawing, when not a terminal


def test_format_csv_and_json(capsys):
    code, out, _ = cli(capsys, "models", "--format", "csv")
    rows = list(csv.DictReader(out.splitlines()))
    assert code == 0 and rows[0]["name"] == "Llama-3.1-8B" and "hf_id" in rows[0]
    code, out, _ = cli(capsys, "gpus", "--format", "json")
    assert code == 0 and isinstance(json.loads(out), list)


def test_a_bare_run_after_make_run_writes_a_folder_of_its_own(tmp_path, capsys, monkeypatch):
    """`make run` fills results/default; the next bare `fleetsim run` must not refuse (issue
    24): it writes results/default-2, then -3, and never touches the earlier folders."""
    monkeypatch.chdir(tmp_path)
    assert cli(capsys, "run", "--out", "results/default", "--force", *FAST)[0] == 0
    first = (tmp_path / "results/default/summary.json").read_text()
    for n in (2, 3):
        code, out, err = cli(capsys, "run", *FAST)
        assert code == 0, err
        assert f"results/default-{n}/" in out + err
        assert (tmp_path / f"results/default-{n}/summary.json").exists()
    assert (tmp_path / "results/default/summary.json").read_text() == first


def test_fresh_out_dir_takes_the_first_free_name(tmp_path):
    from fleetsim.results import fresh_out_dir

    base = tmp_path / "results" / "exp"
    assert fresh_out_dir(base) == base  # nothing there yet
    base.mkdir(parents=True)
    assert fresh_out_dir(base) == base  # an empty folder is free
    (base / "summary.json").write_text("{}")
    (tmp_path / "results" / "exp-2").mkdir()
    (tmp_path / "results" / "exp-2" / "summary.json").write_text("{}")
    assert fresh_out_dir(base) == tmp_path / "results" / "exp-3"


def test_run_refuses_to_replace_earlier_results_without_force(tmp_path, capsys):
    out = tmp_path / "o"
    assert cli(capsys, "run", "--out", str(out), *FAST)[0] == 0
    before = (out / "summary.json").read_text()
    code, _, err = cli(capsys, "run", "--out", str(out), *FAST, "--set", "seed=3")
    assert code == 2 and "--force" in err and err.count("\n") == 1
    assert (out / "summary.json").read_text() == before
    assert cli(capsys, "run", "--out", str(out), *FAST, "--set", "seed=3", "--force")[0] == 0


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr()[0]
    assert out.startswith("fleetsim 0.") and ("mypyc" in out or "python" in out)


def test_config_dump_is_the_full_default_config(tmp_path, capsys):
    code, out, _ = cli(capsys, "config", "--dump")
    assert code == 0
    data = tomllib.loads(out)  # valid TOML, every table in place
    assert data["engine"]["fast_forward"] is True and data["engine"]["debug"] is False
    assert "# until_s =" in out and "Stop simulating" in out
    path = tmp_path / "dump.toml"
    path.write_text(out)
    assert load_config(path) == load_config(None)  # round trip: the defaults themselves


def test_config_reference_page_is_current(capsys):
    assert cli(capsys, "config", "--markdown")[0] == 0
    out = capsys.readouterr()[0] or main(["config", "--markdown"]) or capsys.readouterr()[0]
    page = (ROOT / "docs" / "config.md").read_text()
    for key in ("`until_s`", "`engine.fast_forward`", "`engine.debug`",
                "`workload.max_concurrency`", "`workload.over_long`"):
        assert key in page
    from fleetsim.configdoc import config_markdown

    assert page == config_markdown(), "regenerate: fleetsim config --markdown > docs/config.md"
    del out


# ---- section 2 ------------------------------------------------------------------------
def test_vllm_engine_names_are_accepted(tmp_path):
    cfg = tmp_path / "e.toml"
    cfg.write_text("[engine]\nmax_num_batched_tokens = 2048\nmax_num_seqs = 64\n"
                   "enable_chunked_prefill = false\n")
    c = load_config(cfg)
    assert c.engine.max_batched_tokens == 2048 and c.engine.max_running == 64
    assert c.policy.batching.args["enable_chunked_prefill"] is False


def test_vllm_name_and_fleetsim_name_together_is_an_error(tmp_path, capsys):
    cfg = tmp_path / "e.toml"
    cfg.write_text("[engine]\nmax_num_seqs = 8\nmax_running = 9\n")
    code, _, err = cli(capsys, "run", str(cfg), "--out", str(tmp_path / "o"))
    assert code == 2 and "max_num_seqs" in err and "keep one" in err and "e.toml" in err
    # on the command line either name overrides the file's, the last --set winning
    c = load_config(None,
                    ["engine.max_num_seqs=8", "engine.max_running=9"])
    assert c.engine.max_running == 9
    cfg.write_text("[engine]\nmax_num_seqs = 8\n")
    assert load_config(cfg, ["engine.max_running=5"]).engine.max_running == 5


def test_hugging_face_ids_name_catalog_models():
    assert get_model("meta-llama/Llama-3.1-8B-Instruct").name == "Llama-3.1-8B"
    assert get_model("Qwen/Qwen2.5-72B-Instruct").name == "Qwen2.5-72B"


def test_requests_csv_has_every_arrived_request_with_itl_and_pd_columns(tmp_path, capsys):
    out = tmp_path / "o"
    code, _, err = cli(capsys, "run", "--out", str(out), "--set", "until_s=20.0",
                       "--set", "engine.track_itl=true")
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == s["num_requests"] and s["num_unfinished"] > 0
    unfinished = [r for r in rows if r["finished"] == "0"]
    assert len(unfinished) == s["num_unfinished"]
    assert all(r["unfinished_reason"].endswith("at until_s") and r["e2e_s"] == ""
               for r in unfinished)
    for col in ("itl_mean_s", "itl_p99_s", "itl_max_s", "prefill_replica_id",
                "kv_transfer_s"):
        assert col in rows[0]
    done = [r for r in rows if r["finished"] == "1" and int(r["output_tokens"]) > 2]
    assert all(float(r["itl_max_s"]) >= float(r["itl_p99_s"]) > 0 for r in done)
    assert s["itl_s"]["p99"] >= s["itl_s"]["p50"] > 0


def test_vllm_json_has_the_benchmarks_keys_in_ms(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code, _, err = cli(capsys, "run", "--out", str(tmp_path / "o"), "--isl", "256", "--osl",
                       "64", "--num-prompts", "40", "--request-rate", "4",
                       "--vllm-json", str(path), "--percentiles", "50,90,99.9")
    assert code == 0, err
    d = json.loads(path.read_text())
    for m in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p90", "p99.9"):
            assert f"{stat}_{m}_ms" in d
    assert d["completed"] == 40 and d["failed"] == 0
    assert d["total_input_tokens"] == 40 * 256 and d["total_output_tokens"] == 40 * 64
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert d["median_ttft_ms"] == pytest.approx(s["ttft_s"]["p50"] * 1e3)
    assert d["p99.9_itl_ms"] >= d["p90_itl_ms"] >= d["p50_itl_ms"] > 0
    assert d["request_throughput"] == pytest.approx(40 / d["duration"])
    assert d["request_rate"] == 4.0


def test_closed_loop_keeps_at_most_c_in_flight():
    c = load_config(None, ["workload.trace='synthetic'", "workload.arrival='at_once'",
                           "workload.num_requests=60",
                           "workload.prompt_tokens={kind='fixed', value=200}",
                           "workload.output_tokens={kind='fixed', value=50}",
                           "workload.max_concurrency=4"])
    r = run(c).records.requests
    arrive, finish = r["arrival_s"], r["finish_s"]
    events = sorted([(t, 1) for t in arrive] + [(t, -1) for t in finish], key=lambda e: e)
    in_flight, peak = 0, 0
    for _, d in events:  # finishes before arrivals at the same instant (-1 sorts first)
        in_flight += d
        peak = max(peak, in_flight)
    assert peak == 4
    # each request after the first four is sent the moment an earlier one finishes
    later = np.sort(arrive)[4:]
    assert np.isin(later, finish).all()


def test_closed_loop_is_the_same_with_fast_forward_off():
    sets = ["workload.trace='synthetic'", "workload.rate_per_s=50.0",
            "workload.num_requests=40", "workload.prompt_tokens={kind='uniform', low=10, high=400}",
            "workload.output_tokens={kind='uniform', low=2, high=90}",
            "workload.max_concurrency=5"]
    a = run(load_config(None, sets)).records.requests
    b = run(load_config(None, [*sets, "engine.fast_forward=false"])).records.requests
    for col, values in a.items():
        assert np.array_equal(values, b[col], equal_nan=True), col


def test_shorthands_map_to_the_workload(tmp_path):
    from fleetsim.cli import build_parser
    from fleetsim.workloads.shorthand import workload_overrides

    args = build_parser().parse_args(["run", "--isl", "1000", "--osl", "100",
                                      "--random-range-ratio", "0.5", "--request-rate", "3",
                                      "--burstiness", "4", "--num-prompts", "50"])
    c = load_config(None, workload_overrides(args)).workload
    assert c.is_synthetic and c.num_requests == 50 and c.rate_per_s == 3.0
    assert c.arrival == "gamma" and c.cv == pytest.approx(0.5)
    assert (c.prompt_tokens.low, c.prompt_tokens.high) == (500, 1500)


def test_bad_shorthand_is_one_line(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "--out", str(tmp_path / "o"), "--isl", "100")
    assert code == 2 and "--osl" in err and err.count("\n") == 1
    code, _, err = cli(capsys, "run", "--out", str(tmp_path / "o"), "--isl", "0", "--osl", "5")
    assert code == 2 and "--isl" in err


@pytest.mark.parametrize("mode", ["clip", "drop"])
def test_over_long_requests_are_clipped_or_dropped_and_counted(tmp_path, mode):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n1,5000,300\n"
                     "2,4000,200\n3,50,5\n")
    cfg = tmp_path / "sub" / "c.toml"
    cfg.parent.mkdir()
    # a relative trace path resolves against the config file's folder
    cfg.write_text(f'model = "llama-2-7b"\n[workload]\ntrace = "../t.csv"\nover_long = "{mode}"\n')
    result = run(load_config(cfg))
    fit = result.summary["workload_fit"]
    assert fit["num_over_long"] == 2 and fit["max_context_tokens"] == 4096
    w = result.workload
    assert int((w.num_prompt_tokens + w.num_output_tokens).max()) <= 4096
    assert len(w) == (4 if mode == "clip" else 2)
    if mode == "clip":  # Vidur's rule: the excess comes off both, in proportion
        assert w.num_prompt_tokens[1] + w.num_output_tokens[1] == 4096
        assert w.num_prompt_tokens[1] < 5000 and w.num_output_tokens[1] < 300


def test_over_long_error_is_still_the_default(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,5000,10\n")
    code, _, err = cli(capsys, "run", "--out", str(tmp_path / "o"), "--set",
                       f"workload.trace='{trace}'", "--set", "model=llama-2-7b")
    assert code == 2 and "4096" in err


def test_summary_names_the_engine_build(tmp_path):
    s = run(load_config(None, ["workload.max_requests=5"])).summary
    assert s["engine_build"].startswith("0.") and not math.isnan(s["kv_cache"]["num_blocks"])


def test_goodput_with_an_slo_no_request_can_meet_exits_2(capsys):
    code, _, err = cli(capsys, "goodput", "--set", "workload.max_requests=200", "--set",
                       "slo.ttft_s=0.0001")
    assert code == 2 and "even alone on an idle replica" in err and "TTFT p50" in err
    assert err.count("\n") == 1
