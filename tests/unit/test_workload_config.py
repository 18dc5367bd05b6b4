"""WorkloadConfig / LengthConfig validation, build_workload and trace_info."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fleetsim.configutil import from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.workloads import (
    LengthConfig,
    WorkloadConfig,
    build_workload,
    load_trace,
    trace_info,
)
from fleetsim.workloads.config import PairedLengthsConfig

SYNTH = {
    "trace": "synthetic",
    "rate_per_s": 20.0,
    "num_requests": 2000,
    "prompt_tokens": {"kind": "uniform", "low": 10, "high": 20},
    "output_tokens": {"kind": "fixed", "value": 5},
}


def cfg(**data: object) -> WorkloadConfig:
    return from_dict(WorkloadConfig, data, "workload")


def build(data: dict[str, object], seed: int = 0):  # noqa: ANN201
    return build_workload(cfg(**data), np.random.default_rng(seed))


def test_default_is_embedded_trace() -> None:
    w = build_workload(WorkloadConfig(), np.random.default_rng(0))
    assert len(w) == 4424
    assert w.name == "embedded:azure_conv_2023"


def test_trace_with_scale_slice_and_max() -> None:
    w = build({"rate_scale": 2.0, "start_s": 100.0, "duration_s": 50.0})
    full = load_trace("embedded:azure_conv_2023")
    t = full.arrival_s / 2.0
    assert len(w) == np.sum((t >= 100.0) & (t < 150.0))
    assert w.arrival_s[-1] < 50.0
    assert len(build({"max_requests": 10})) == 10


def test_synthetic_from_toml_dict() -> None:
    w = build(SYNTH)
    assert len(w) == 2000
    assert w.arrival_s[0] == 0.0
    assert set(w.num_output_tokens.tolist()) == {5}
    assert w.num_prompt_tokens.min() >= 10
    assert w.num_prompt_tokens.max() <= 20
    assert len(w) / w.arrival_s[-1] == pytest.approx(20.0, rel=0.1)


def test_synthetic_by_duration_with_gamma() -> None:
    data = {**SYNTH, "num_requests": None, "duration_s": 500.0, "arrival": "gamma", "cv": 2.0}
    data.pop("num_requests")
    w = build(data)
    assert w.arrival_s[-1] < 500.0
    assert len(w) == pytest.approx(10_000, rel=0.15)
    iat = np.diff(w.arrival_s)
    assert iat.std() / iat.mean() == pytest.approx(2.0, rel=0.1)


def test_synthetic_rate_scale_and_empirical_lengths(tmp_path: Path) -> None:
    stats = tmp_path / "stats.csv"
    stats.write_text("num_prefill_tokens,num_decode_tokens\n100,7\n200,9\n")
    data = {
        **SYNTH,
        "rate_scale": 2.0,
        "prompt_tokens": {"kind": "empirical", "path": str(stats), "column": "num_prefill_tokens"},
        "output_tokens": {"kind": "lognormal", "mean": 100.0, "cv": 0.5},
    }
    w = build(data)
    assert set(w.num_prompt_tokens.tolist()) <= {100, 200}
    assert len(w) / w.arrival_s[-1] == pytest.approx(40.0, rel=0.1)


def test_same_seed_same_workload() -> None:
    a, b = build(SYNTH, seed=3), build(SYNTH, seed=3)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.num_prompt_tokens, b.num_prompt_tokens)


def test_none_trace_means_synthetic() -> None:
    c = WorkloadConfig(
        trace=None,
        rate_per_s=1.0,
        num_requests=3,
        prompt_tokens=LengthConfig(kind="fixed", value=4),
        output_tokens=LengthConfig(kind="fixed", value=2),
    )
    assert c.is_synthetic
    assert len(build_workload(c, np.random.default_rng(0))) == 3


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"rate_scale": 0.0}, "rate_scale must be > 0"),
        ({"start_s": -1.0}, "start_s must be >= 0"),
        ({"duration_s": 0.0}, "duration_s must be > 0"),
        ({"max_requests": 0}, "max_requests must be >= 1"),
        ({"format": "parquet"}, "format must be one of"),
        ({"rate_per_s": 3.0}, "rate_per_s is only used by synthetic"),
        ({"arrival": "gamma"}, "arrival is only used by synthetic"),
        ({"trace": ""}, "trace must be a file path"),
        ({"trace": "synthetic"}, "needs rate_per_s, prompt_tokens, output_tokens"),
        ({**SYNTH, "num_requests": None}, "needs num_requests or duration_s"),
        ({**SYNTH, "cv": 2.0}, "cv is only used with arrival = 'gamma'"),
        ({**SYNTH, "arrival": "weibull"}, "arrival must be one of poisson, gamma, constant"),
        ({**SYNTH, "rate_per_s": -1.0}, "rate_per_s must be a finite number > 0"),
        ({**SYNTH, "arrival": "gamma", "cv": 0.0}, "gamma arrivals need cv > 0"),
        ({**SYNTH, "prompt_tokens": {"kind": "normal"}}, "length kind must be one of"),
        ({**SYNTH, "prompt_tokens": {"kind": "uniform", "low": 1}}, "high is missing"),
        (
            {**SYNTH, "prompt_tokens": {"kind": "fixed", "value": 3, "mean": 2.0}},
            "mean is not used by kind = 'fixed'",
        ),
        ({**SYNTH, "prompt_tokens": {"kind": "fixed", "value": 0}}, "must be >= 1 token"),
        (
            {**SYNTH, "prompt_tokens": {"kind": "lognormal", "mean": 9.0, "cv": -1.0}},
            "cv must be > 0",
        ),
    ],
)
def test_config_validation(data: dict[str, object], needle: str) -> None:
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(FleetsimInputError) as info:
        cfg(**data)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_is_rejected() -> None:
    with pytest.raises(FleetsimInputError, match="workload.rate_scael.*did you mean 'rate_scale'"):
        cfg(rate_scael=2.0)


def test_empty_window_error() -> None:
    with pytest.raises(FleetsimInputError, match="no request arrives in the window"):
        build({"start_s": 1e6})


def test_empirical_file_error_names_the_table(tmp_path: Path) -> None:
    data = {**SYNTH, "output_tokens": {"kind": "empirical", "path": "nope.csv", "column": "x"}}
    with pytest.raises(FleetsimInputError, match=r"workload\.output_tokens\.path.*'nope\.csv'"):
        build(data)


def test_missing_trace_file_error(tmp_path: Path) -> None:
    with pytest.raises(FleetsimInputError, match="nope.csv"):
        build({"trace": str(tmp_path / "nope.csv")})


# --- trace_info --------------------------------------------------------------------------------


def test_trace_info_embedded_is_json_ready() -> None:
    info = trace_info("embedded:azure_conv_2023")
    assert json.loads(json.dumps(info)) == info
    assert info["rows"] == 4424
    assert info["source"] == "embedded:azure_conv_2023"
    assert 899 < info["span_s"] < 900
    assert info["mean_rate_per_s"] == pytest.approx(4424 / info["span_s"])
    assert 0.9 < info["iat_cv"] < 1.3
    assert info["prompt_tokens_p50"] <= info["prompt_tokens_p90"] <= info["prompt_tokens_p99"]
    assert info["prompt_tokens_p99"] <= info["prompt_tokens_max"]
    assert info["hash_block_reuse_share"] is None


def test_trace_info_hash_reuse(tmp_path: Path) -> None:
    rows = [(0.0, "1 2 3"), (1.0, "1 2 4"), (2.0, "5 2")]
    text = "arrival_s,prompt_tokens,output_tokens,hash_ids\n" + "".join(
        f"{t},1536,1,{ids}\n" for t, ids in rows
    )
    path = tmp_path / "h.csv"
    path.write_text(text)
    info = trace_info(str(path))
    assert info["num_hash_blocks"] == 8
    assert info["num_distinct_hash_blocks"] == 5
    assert info["hash_block_reuse_share"] == pytest.approx(3 / 8)
    assert info["prefix_hit_block_share"] == pytest.approx(2 / 8)  # "5 2": 2 is not a prefix hit
    assert info["hash_block_tokens"] == 512


def test_trace_info_on_the_embedded_mooncake_slice() -> None:
    """The statistics data/README.md states for the slice (computed there independently)."""
    info = trace_info("embedded:mooncake_conversation_10min")
    assert info["rows"] == 1_750
    assert info["num_distinct_hash_blocks"] == 34_850
    assert info["prefix_hit_block_share"] == pytest.approx(0.284, abs=0.001)


PAIRED = {"trace": "synthetic", "rate_per_s": 5.0, "num_requests": 3000,
          "lengths": {"path": "embedded:sharegpt_lengths", "max_prompt_tokens": 1024,
                      "max_total_tokens": 2048}}


def test_paired_lengths_keep_rows_together_and_apply_both_limits(tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    # Four rows; a row is (prompt, output): the output is always 1000 + the prompt, so any
    # mixing of rows would show. (50, 2000) passes the prompt limit but not the total one.
    rows.write_text("p,o\n10,1010\n20,1020\n50,2000\n3000,4000\n")
    w = build({"trace": "synthetic", "rate_per_s": 5.0, "num_requests": 500,
               "lengths": {"path": str(rows), "prompt_column": "p", "output_column": "o",
                           "max_prompt_tokens": 1024, "max_total_tokens": 2048}})
    assert set(w.num_prompt_tokens.tolist()) == {10, 20}
    assert (w.num_output_tokens == w.num_prompt_tokens + 1000).all()


def test_paired_sharegpt_as_vllm_benchmark_samples_it() -> None:
    w = build(PAIRED)
    p, o = w.num_prompt_tokens, w.num_output_tokens
    assert p.max() <= 1024 and (p + o).max() <= 2048
    assert len(w) == 3000
    # deterministic per seed, and a different seed draws other rows
    again = build(PAIRED)
    assert (again.num_output_tokens == o).all()
    assert not (build(PAIRED, seed=1).num_output_tokens == o).all()


def test_counted_rows_are_drawn_in_proportion_to_their_counts(tmp_path: Path) -> None:
    rows = tmp_path / "hist.csv"
    # (10, 1010) stands for 3 requests, (20, 1020) for 1
    rows.write_text("p,o,n\n10,1010,3\n20,1020,1\n")
    w = build({"trace": "synthetic", "rate_per_s": 5.0, "num_requests": 4000,
               "lengths": {"path": str(rows), "prompt_column": "p", "output_column": "o",
                           "count_column": "n"}})
    p = w.num_prompt_tokens
    assert set(p.tolist()) == {10, 20}
    assert (w.num_output_tokens == p + 1000).all()
    assert (p == 10).mean() == pytest.approx(0.75, abs=0.03)  # 3 of 4; 4,000 draws: sd 0.007


def test_embedded_sharegpt_first_turns_are_the_histogram_data_readme_describes() -> None:
    """The statistics src/fleetsim/data/README.md states (tools/sharegpt_first_turns.py)."""
    dist = PairedLengthsConfig(path="embedded:sharegpt_first_turn_opt",
                               count_column="num_requests", max_prompt_tokens=1024,
                               max_total_tokens=2048).distribution()
    assert len(dist.prompts) == 76_819  # every pair passes FastServe's filter already
    assert dist.prompts.mean() == pytest.approx(117.50, abs=0.01)
    assert dist.outputs.mean() == pytest.approx(340.18, abs=0.01)
    assert np.median(dist.prompts) == 32 and np.median(dist.outputs) == 265


def test_a_count_below_one_names_the_row_and_column(tmp_path: Path) -> None:
    rows = tmp_path / "hist.csv"
    rows.write_text("p,o,n\n10,1010,3\n20,1020,0\n")
    data = {"trace": "synthetic", "rate_per_s": 5.0, "num_requests": 10,
            "lengths": {"path": str(rows), "prompt_column": "p", "output_column": "o",
                        "count_column": "n"}}
    with pytest.raises(FleetsimInputError, match=r"line 3, column 'n': got '0'.*>= 1"):
        build(data)


@pytest.mark.parametrize(("data", "needle"), [
    ({**PAIRED, "lengths": {"path": "embedded:sharegpt_lengths", "count_column": ""}},
     "lengths.count_column must name a column"),
    ({**PAIRED, "prompt_tokens": {"kind": "fixed", "value": 3}},
     "remove prompt_tokens or remove lengths"),
    ({**PAIRED, "lengths": {"path": "embedded:sharegpt_lengths", "max_total_tokens": 0}},
     "max_total_tokens must be >= 1"),
    ({**PAIRED, "lengths": {"path": ""}}, "lengths.path must name a file"),
    ({"trace": "embedded:azure_conv_2023", "lengths": {"path": "x.csv"}},
     "lengths is only used by synthetic"),
])
def test_paired_lengths_validation(data: dict[str, object], needle: str) -> None:
    with pytest.raises(FleetsimInputError) as info:
        cfg(**data)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_paired_lengths_with_no_row_left_names_the_field() -> None:
    data = {**PAIRED, "lengths": {"path": "embedded:sharegpt_lengths", "max_prompt_tokens": 1,
                                  "max_total_tokens": 2}}
    with pytest.raises(FleetsimInputError, match=r"workload\.lengths.*no row passes"):
        build(data)


def test_paired_lengths_missing_column_names_the_table() -> None:
    data = {**PAIRED, "lengths": {"path": "embedded:sharegpt_lengths", "prompt_column": "nope"}}
    with pytest.raises(FleetsimInputError, match=r"workload\.lengths\.path.*nope"):
        build(data)
