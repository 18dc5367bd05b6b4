"""``fleetsim load`` as ``vllm bench serve``: its flags, its datasets, its result file, which
``fleetsim run --vllm-json`` writes with the same keys."""

from __future__ import annotations

import asyncio
import csv
import json
import re
from importlib import resources

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.live.emulate import emulated_backend
from fleetsim.live.load import run_load
from fleetsim.live.server import ServerThread
from fleetsim.vllm_json import peak_output_and_concurrency
from fleetsim.workloads import Workload

# Servers, Ray or whole commands: the code under test is not compiled, so `make test`
# runs these once, on the compiled build (pyproject.toml, marker `wiring`).
pytestmark = pytest.mark.wiring

MODEL = "llama-3.1-8b"
# What `vllm bench serve --save-result --save-detailed` writes for a generation benchmark
# with `--goodput` and `--metric-percentiles 99`: vllm-project/vllm, vllm/benchmarks/serve.py
# at commit def9ce85ba1079af970a58ed3d42dd861ae35d58 (`main_async`'s result_json: setup and
# traffic keys; `benchmark`'s result: totals, peaks and the per-request arrays;
# `process_one_metric` for ttft, tpot, itl, the default --percentile-metrics, and e2el).
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency",
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests",
    "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for s in ("mean", "median", "std", "p99")),
}
DETAILED = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def test_run_vllm_json_has_every_key_of_vllms_result(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["run", "--out", str(tmp_path / "o"), "--isl", "64", "--osl", "8",
                 "--num-prompts", "12", "--vllm-json", str(path), "--save-detailed",
                 "--label", "sim", "--set", 'model="llama-3.1-8b"']) == 0
    capsys.readouterr()
    d = json.loads(path.read_text())
    assert set(d) >= VLLM_KEYS, sorted(VLLM_KEYS - set(d))
    assert d["request_rate"] == "inf" and d["model_id"] == "llama-3.1-8b"
    assert d["label"] == "sim" and re.fullmatch(r"\d{8}-\d{6}", d["date"])
    assert all(len(d[k]) == 12 for k in DETAILED)
    assert d["max_concurrent_requests"] == 12  # all sent at 0 s, all within the first second
    assert d["max_output_tokens_per_s"] == 12 * 8
    assert main(["run", "--out", str(tmp_path / "o2"), "--isl", "64", "--osl", "8",
                 "--num-prompts", "12", "--vllm-json", str(path)]) == 0
    without = json.loads(path.read_text())
    assert not set(DETAILED) & set(without)


def test_load_takes_vllm_bench_flags_and_writes_the_same_file(tmp_path, capsys):
    sim = tmp_path / "sim.json"
    assert main(["run", "--out", str(tmp_path / "o"), "--isl", "32", "--osl", "4",
                 "--num-prompts", "6", "--request-rate", "inf", "--vllm-json", str(sim),
                 "--save-detailed"]) == 0
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        assert main(["load", "--url", url, "--dataset-name", "random",
                     "--random-input-len", "32", "--random-output-len", "4",
                     "--num-prompts", "6", "--request-rate", "inf", "--max-concurrency", "2",
                     "--goodput", "ttft:60000", "e2el:60000", "--percentile-metrics",
                     "ttft,tpot,itl,e2el", "--metric-percentiles", "99", "--save-result",
                     "--save-detailed", "--result-dir", str(tmp_path / "res"),
                     "--label", "emu", "--disable-tqdm"]) == 0
    capsys.readouterr()
    (saved,) = (tmp_path / "res").iterdir()
    assert re.fullmatch(rf"emu-infqps-concurrency2-{MODEL}-\d{{8}}-\d{{6}}\.json", saved.name)
    d = json.loads(saved.read_text())
    assert set(d) >= VLLM_KEYS, sorted(VLLM_KEYS - set(d))
    assert set(json.loads(sim.read_text())) - {"engine_build"} <= set(d)
    assert d["completed"] == 6 and d["input_lens"] == [32] * 6 and d["output_lens"] == [4] * 6
    assert d["request_goodput"] == pytest.approx(6 / d["duration"])
    assert d["request_rate"] == "inf" and d["max_concurrency"] == 2
    assert all(len(itl) == 3 for itl in d["itls"]) and all(d["generated_texts"])
    assert d["model_id"] == MODEL and d["backend"] == "openai"


def test_sharegpt_lengths_and_the_same_requests_for_the_same_seed(tmp_path, capsys):
    data = resources.files("fleetsim.data").joinpath("sharegpt_lengths.csv").read_text()
    prompts = {int(r["num_prefill_tokens"]) for r in csv.DictReader(data.splitlines())}
    runs = []
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        for i in range(2):
            out = tmp_path / f"load{i}.jsonl"
            assert main(["load", "--url", url, "--dataset-name", "sharegpt", "--osl", "2",
                         "--num-prompts", "5", "--request-rate", "100", "--burstiness", "0.5",
                         "--seed", "7", "--out", str(out), "--json"]) == 0
            capsys.readouterr()
            runs.append([json.loads(line) for line in out.read_text().splitlines()])
    assert [r["prompt_tokens"] for r in runs[0]] == [r["prompt_tokens"] for r in runs[1]]
    assert [r["arrival_s"] for r in runs[0]] == [r["arrival_s"] for r in runs[1]]
    assert all(r["prompt_tokens"] in prompts and r["output_tokens"] == 2 for r in runs[0])


@pytest.mark.parametrize(("argv", "field"), [
    (["--dataset-name", "random", "--goodput", "ttft"], "--goodput"),
    (["--dataset-name", "random", "--percentile-metrics", "ttft,bogus"],
     "--percentile-metrics"),
    (["--dataset-name", "sharegpt", "--isl", "10"], "--isl"),
    (["embedded:azure_conv_2023", "--dataset-name", "random"], "--dataset-name"),
    ([], "trace"),
])
def test_bad_bench_flags_are_one_line(argv, field, capsys):
    assert main(["load", "--url", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"fleetsim: error: {field}"), err


def test_progress_is_told_of_every_request():
    w = Workload(arrival_s=np.zeros(5), num_prompt_tokens=np.full(5, 8),
                 num_output_tokens=np.full(5, 2))
    done = []
    with ServerThread(lambda: emulated_backend(speed=50.0)) as url:
        outcomes = asyncio.run(run_load(w, url, model=MODEL, on_done=done.append))
    assert sorted(o.index for o in done) == [0, 1, 2, 3, 4]
    assert all(o.ok for o in outcomes)


def test_peaks_as_vllm_counts_them():
    """Two requests from t=0: A [0, 1.5] s with tokens at 0.2, 0.4, 1.2; B [0.5, 0.9] s with
    a token at 0.6. Second 0 holds 3 tokens and both requests; second 1 one token, A only."""
    tokens, requests = peak_output_and_concurrency(
        np.array([0.0, 0.5]), np.array([1.5, 0.4]),
        [np.array([0.2, 0.4, 1.2]), np.array([0.6])])
    assert (tokens, requests) == (3.0, 2)
