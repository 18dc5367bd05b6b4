"""Trace loaders: each format, format detection, the embedded trace and every error path."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.workloads import (
    EMBEDDED_TRACES,
    load_azure_csv,
    load_generic,
    load_mooncake_jsonl,
    load_trace,
)

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def azure(tmp_path: Path, rows: str, name: str = "az.csv") -> Path:
    return write(tmp_path, name, AZURE_HEADER + rows)


def mooncake_line(ts: int, inp: int, out: int, ids: list[int]) -> str:
    d = {"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids}
    return json.dumps(d)


# --- happy paths -------------------------------------------------------------------------------


def test_azure_csv_relative_seconds_and_tokens(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:15:46.5000000,374,44\r\n"
        "2023-11-16 18:15:47.7500000,396,109\r\n"
        "2023-11-16 18:16:46.5000000,1,1\r\n",
    )
    w = load_azure_csv(path)
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.25, 60.0])
    assert w.num_prompt_tokens.tolist() == [374, 396, 1]
    assert w.num_output_tokens.tolist() == [44, 109, 1]
    assert w.num_prompt_tokens.dtype == np.int64
    assert w.hash_ids is None
    assert w.name == "az.csv"
    assert load_trace(path).num_prompt_tokens.tolist() == [374, 396, 1]


def test_mooncake_jsonl_ms_to_s_and_hash_ids(tmp_path: Path) -> None:
    lines = [mooncake_line(1000, 600, 5, [0, 1]), mooncake_line(3500, 512, 7, [0])]
    path = write(tmp_path, "mc.jsonl", "\n".join(lines) + "\n\n")
    w = load_mooncake_jsonl(path)
    np.testing.assert_allclose(w.arrival_s, [0.0, 2.5])
    assert w.num_prompt_tokens.tolist() == [600, 512]
    assert w.hash_ids == ((0, 1), (0,))
    assert w.hash_block_tokens == 512
    assert load_trace(path).hash_ids == ((0, 1), (0,))


def test_generic_csv_with_hash_ids_and_priority(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "g.csv",
        "arrival_s,prompt_tokens,output_tokens,hash_ids,priority\n"
        "5.0,32,4,1 2,0\n"
        "5.5,32,1,1;3,-2\n"
        "7,8,2,,1\n",
    )
    w = load_generic(path, hash_block_tokens=16)
    np.testing.assert_allclose(w.arrival_s, [0.0, 0.5, 2.0])
    assert w.hash_ids == ((1, 2), (1, 3), ())
    assert w.hash_block_tokens == 16
    assert w.priority is not None
    assert w.priority.tolist() == [0, -2, 1]
    assert load_trace(path, hash_block_tokens=16).hash_ids == w.hash_ids


def test_generic_jsonl_minimal(tmp_path: Path) -> None:
    rows = [
        {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 3},
        {"arrival_s": 0.25, "prompt_tokens": 20, "output_tokens": 1},
    ]
    path = write(tmp_path, "g.jsonl", "\n".join(json.dumps(r) for r in rows))
    w = load_trace(path)
    assert w.num_prompt_tokens.tolist() == [10, 20]
    assert w.hash_ids is None
    assert w.priority is None
    assert load_generic(path).num_output_tokens.tolist() == [3, 1]


def test_generic_accepts_whole_floats(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n0,12.0,3\n")
    assert load_generic(path).num_prompt_tokens.tolist() == [12]


def test_explicit_format_overrides_extension(tmp_path: Path) -> None:
    path = azure(tmp_path, "2023-11-16 18:15:46.0,5,6\n", name="trace.txt")
    assert load_trace(path, format="azure").num_prompt_tokens.tolist() == [5]
    assert load_trace(path).num_prompt_tokens.tolist() == [5]  # detected by header


def test_embedded_trace() -> None:
    w = load_trace("embedded:azure_conv_2023")
    assert len(w) == 4424
    assert w.arrival_s[0] == 0.0
    assert 899.0 < w.arrival_s[-1] < 900.0
    assert 1100 < w.num_prompt_tokens.mean() < 1250
    data = resources.files("fleetsim").joinpath("data")
    assert "Attribution 4.0 International" in data.joinpath("AZURE_LLM_2023_LICENSE.txt").read_text(
        "utf-8-sig"
    )
    readme = data.joinpath("README.md").read_text()
    assert "b469a113cedca53ddc3bdea71a143dc4b7d8700c" in readme
    assert "Splitwise" in readme
    assert set(EMBEDDED_TRACES) == {"azure_conv_2023", "azure_conv_2023_hour",
                                    "azure_code_2023_hour", "sharegpt_lengths",
                                    "sharegpt_first_turn_opt", "mooncake_conversation_10min"}
    for name in EMBEDDED_TRACES:  # every embedded file has its section in data/README.md
        assert f"`{EMBEDDED_TRACES[name][0]}`" in readme


def test_embedded_sharegpt_lengths_are_a_length_source_not_a_trace() -> None:
    from fleetsim.errors import FleetsimInputError
    from fleetsim.workloads.loaders import read_column

    prompts = read_column("embedded:sharegpt_lengths", "num_prefill_tokens")
    outputs = read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    assert len(prompts) == len(outputs) == 30731  # as in the source (data/README.md)
    assert round(float(prompts.mean())) == 2340 and round(float(outputs.mean())) == 439
    data = resources.files("fleetsim").joinpath("data")
    assert "Apache License" in data.joinpath("SHAREGPT_LENGTHS_LICENSE.txt").read_text()
    with pytest.raises(FleetsimInputError, match="lengths only"):
        load_trace("embedded:sharegpt_lengths")


# --- error paths: each names the file, the row/column and the value ----------------------------


def error(fn, *args, **kw) -> str:  # noqa: ANN001
    with pytest.raises(FleetsimInputError) as info:
        fn(*args, **kw)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_an_embedded_column_is_parsed_once_and_each_caller_owns_its_copy(monkeypatch) -> None:
    from fleetsim.workloads import loaders

    first = loaders.read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    parsed = []
    monkeypatch.setattr(loaders, "_read_column", lambda *a: parsed.append(a))
    first[:] = 0  # a caller changing its array changes nobody else's
    again = loaders.read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    assert not parsed and again.min() >= 1 and len(again) == len(first)
    assert again is not loaders.read_column("embedded:sharegpt_lengths", "num_decode_tokens")


def test_a_file_column_is_read_from_the_file_each_time(tmp_path: Path) -> None:
    from fleetsim.workloads.loaders import read_column

    path = tmp_path / "lengths.csv"
    path.write_text("n\n5\n")
    assert read_column(path, "n").tolist() == [5]
    path.write_text("n\n7\n")  # a user's file may change between runs
    assert read_column(str(path), "n").tolist() == [7]


def test_missing_file(tmp_path: Path) -> None:
    msg = error(load_trace, tmp_path / "nope.csv")
    assert "nope.csv" in msg
    assert "no such file" in msg


def test_unknown_embedded_name() -> None:
    msg = error(load_trace, "embedded:nope")
    assert "embedded:nope" in msg
    assert "embedded:azure_conv_2023" in msg


@pytest.mark.parametrize("text", ["", "  \n\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "e.csv", text)
    msg = error(load_trace, path)
    assert "e.csv" in msg
    assert "empty" in msg


def test_header_only(tmp_path: Path) -> None:
    msg = error(load_azure_csv, azure(tmp_path, ""))
    assert "az.csv" in msg
    assert "no requests" in msg


def test_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.0,5\n")
    msg = error(load_azure_csv, path)
    assert "a.csv" in msg
    assert "'GeneratedTokens'" in msg


@pytest.mark.parametrize(
    ("cell", "shown"), [("abc", "'abc'"), ("-3", "'-3'"), ("0", "'0'"), ("2.5", "'2.5'")]
)
def test_bad_token_count_names_line_column_value(tmp_path: Path, cell: str, shown: str) -> None:
    path = azure(tmp_path, f"2023-11-16 18:15:46.0,5,6\n2023-11-16 18:15:47.0,{cell},6\n")
    msg = error(load_azure_csv, path)
    assert "az.csv, line 3, column 'ContextTokens'" in msg
    assert shown in msg
    assert ">= 1" in msg


def test_zero_output_tokens_generic(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n0,5,0\n")
    msg = error(load_generic, path)
    assert "line 2, column 'output_tokens'" in msg
    assert "'0'" in msg


def test_bad_mooncake_token_count(tmp_path: Path) -> None:
    line = json.dumps({"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": []})
    msg = error(load_mooncake_jsonl, write(tmp_path, "m.jsonl", line))
    assert "m.jsonl, line 1, column 'input_length'" in msg
    assert "'x'" in msg


def test_unsorted_timestamps_name_the_row(tmp_path: Path) -> None:
    path = azure(
        tmp_path,
        "2023-11-16 18:15:46.0,5,6\n2023-11-16 18:15:48.0,5,6\n2023-11-16 18:15:47.0,5,6\n",
    )
    msg = error(load_azure_csv, path)
    assert "az.csv, line 4, column 'TIMESTAMP'" in msg
    assert "18:15:47.0" in msg
    assert "sort" in msg


def test_unsorted_generic(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens\n2,1,1\n1,1,1\n")
    msg = error(load_generic, path)
    assert "g.csv, line 3, column 'arrival_s'" in msg
    assert "'1'" in msg


def test_bad_timestamp(tmp_path: Path) -> None:
    msg = error(load_azure_csv, azure(tmp_path, "yesterday,5,6\n"))
    assert "az.csv, line 2, column 'TIMESTAMP'" in msg
    assert "'yesterday'" in msg


def test_short_row(tmp_path: Path) -> None:
    msg = error(load_azure_csv, azure(tmp_path, "2023-11-16 18:15:46.0,5\n"))
    assert "az.csv, line 2" in msg
    assert "expected 3 fields" in msg


def test_malformed_json_line(tmp_path: Path) -> None:
    good = mooncake_line(0, 10, 1, [0])
    path = write(tmp_path, "m.jsonl", f'{good}\n{{"timestamp": 1, oops\n{good}\n')
    msg = error(load_mooncake_jsonl, path)
    assert "m.jsonl, line 2" in msg
    assert "oops" in msg
    assert "malformed JSON" in msg


def test_json_line_not_an_object(tmp_path: Path) -> None:
    msg = error(load_mooncake_jsonl, write(tmp_path, "m.jsonl", "[1, 2]\n"))
    assert "m.jsonl, line 1" in msg


def test_missing_json_key(tmp_path: Path) -> None:
    line = json.dumps({"timestamp": 0, "input_length": 10, "hash_ids": []})
    msg = error(load_mooncake_jsonl, write(tmp_path, "m.jsonl", line))
    assert "m.jsonl, line 1" in msg
    assert "'output_length'" in msg


def test_bad_hash_ids(tmp_path: Path) -> None:
    path = write(tmp_path, "g.csv", "arrival_s,prompt_tokens,output_tokens,hash_ids\n0,5,1,1 x\n")
    msg = error(load_generic, path)
    assert "line 2, column 'hash_ids'" in msg
    assert "'1 x'" in msg


def test_too_many_hash_ids(tmp_path: Path) -> None:
    msg = error(load_mooncake_jsonl, write(tmp_path, "m.jsonl", mooncake_line(0, 512, 1, [0, 1])))
    assert "m.jsonl, line 1, column 'hash_ids'" in msg


def test_unknown_format_name(tmp_path: Path) -> None:
    msg = error(load_trace, azure(tmp_path, "2023-11-16 18:15:46.0,5,6\n"), format="parquet")
    assert "'parquet'" in msg
    assert "azure, mooncake, generic" in msg


def test_unknown_csv_header(tmp_path: Path) -> None:
    msg = error(load_trace, write(tmp_path, "x.csv", "a,b\n1,2\n"))
    assert "x.csv, line 1" in msg
    assert "'a,b'" in msg
    assert "format" in msg


def test_unknown_jsonl_keys(tmp_path: Path) -> None:
    msg = error(load_trace, write(tmp_path, "x.jsonl", '{"t": 1}\n'))
    assert "x.jsonl, line 1" in msg
    assert "['t']" in msg


def test_mooncake_block_size_is_fixed(tmp_path: Path) -> None:
    path = write(tmp_path, "m.jsonl", mooncake_line(0, 10, 1, [0]))
    msg = error(load_trace, path, hash_block_tokens=16)
    assert "512" in msg


# --- the embedded slices of the real traces (src/fleetsim/data/README.md) ----------------------
# Their bytes are checked against the README's SHA-256 in test_self_contained.py; here, that the
# loaders read them as the README describes.


def test_embedded_azure_conv_slice() -> None:
    w = load_trace("embedded:azure_conv_2023")
    assert len(w) == 4_424
    assert w.arrival_s[0] == 0.0 and w.arrival_s[-1] == pytest.approx(899.88, abs=0.01)


def test_embedded_mooncake_slice() -> None:
    w = load_trace("embedded:mooncake_conversation_10min")
    assert len(w) == 1_750
    assert w.num_prompt_tokens.mean() == pytest.approx(13_992, abs=1)
    assert w.hash_ids is not None
    assert len({h for ids in w.hash_ids for h in ids}) == 34_850


def test_embedded_azure_hours_are_the_whole_traces() -> None:
    """The statistics of the whole files (data/README.md); the 15-minute default is their
    conversation trace's head, row for row."""
    conv = load_trace("embedded:azure_conv_2023_hour")
    assert len(conv) == 19_366
    assert conv.num_prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert conv.num_output_tokens.mean() == pytest.approx(211, abs=1)
    assert conv.arrival_s[-1] == pytest.approx(3502, abs=1)
    head = load_trace("embedded:azure_conv_2023")
    assert np.array_equal(conv.arrival_s[: len(head)], head.arrival_s)
    code = load_trace("embedded:azure_code_2023_hour")
    assert len(code) == 8_819
    assert code.num_prompt_tokens.mean() == pytest.approx(2048, abs=1)
