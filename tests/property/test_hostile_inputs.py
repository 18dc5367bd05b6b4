"""Hostile input, generated: every config field and trace column given NaN, infinities, huge,
negative, wrong-typed, boolean and empty values. Each is either rejected with one line that
names the field (exit 2 from the CLI) or runs to a summary of finite numbers."""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetsim.cli import main
from fleetsim.config import SimConfig, config_from_dict
from fleetsim.configutil import apply_override
from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import non_finite_path
from fleetsim.run import run
from fleetsim.workloads import load_trace

TRACE_BASE = {"workload": {"max_requests": 12}}
SYNTHETIC_BASE = {"workload": {
    "trace": "synthetic", "rate_per_s": 4.0, "num_requests": 12,
    "prompt_tokens": {"kind": "uniform", "low": 50, "high": 400},
    "output_tokens": {"kind": "fixed", "value": 8}}}
BAD_VALUES = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, -1, 0, 0.5, 2**70, True,
              False, "", "x", [], {}, [1, 2]]


def _scalar_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of every scalar config field (nested tables walked, lists and maps not)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if dataclasses.is_dataclass(hint):
            out += _scalar_fields(hint, f"{prefix}{f.name}.")
        elif typing.get_origin(hint) is not tuple and hint is not Mapping and \
                typing.get_origin(hint) is not Mapping:
            out.append(f"{prefix}{f.name}")
    return out


FIELDS = _scalar_fields(SimConfig)


def test_every_field_is_generated():
    assert {"seed", "cluster.link.latency_s", "slo.ttft_s", "engine.block_size",
            "workload.rate_per_s", "workload.prompt_tokens.value", "hardware.tp"} <= set(FIELDS)


def _data(base: dict, key: str, value: object) -> dict:
    data = copy.deepcopy(base)
    apply_override(data, key, value)
    return data


def outcome(fn, *args):
    """(result, None) or (None, the input error)."""
    try:
        return fn(*args), None
    except FleetsimInputError as err:
        return None, err


def _check_rejection(err: FleetsimInputError, key: str) -> None:
    text = str(err)
    assert "\n" not in text
    leaf = key.rsplit(".", 1)[-1]
    assert leaf in text or key.split(".")[0] in text, text


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(FIELDS), value=st.sampled_from(BAD_VALUES),
       synthetic=st.booleans())
def test_bad_field_values_are_rejected_in_one_line_or_valid(key, value, synthetic):
    """Config level: either a one-line error naming the field, or a config whose every number
    is finite."""
    base = SYNTHETIC_BASE if synthetic else TRACE_BASE
    config, err = outcome(config_from_dict, _data(base, key, value))
    if err is not None:
        _check_rejection(err, key)
        return
    assert non_finite_path(dataclasses.asdict(config)) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(FIELDS), value=st.sampled_from(BAD_VALUES),
       synthetic=st.booleans())
def test_accepted_values_run_to_finite_numbers(key, value, synthetic):
    """Run level: what the config accepts either fails in one line or summarizes finitely."""
    base = SYNTHETIC_BASE if synthetic else TRACE_BASE
    result, err = outcome(lambda: run(config_from_dict(_data(base, key, value))))
    if err is not None:
        assert "\n" not in str(err)
        return
    assert non_finite_path(result.summary) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["seed", "cluster.link.latency_s", "slo.ttft_s", "engine.block_size",
                            "workload.max_requests", "hardware.tp", "engine.max_running"]),
       value=st.sampled_from(["nan", "inf", "-inf", "1e300", "-1", "true", '"x"', "[]", "{}"]))
def test_cli_set_bad_value_exit_2_one_line(key, value, capsys, tmp_path):
    code = main(["run", "--set", f"{key}={value}", "--set", "workload.max_requests=5",
                 "--out", str(tmp_path / "o")] if key != "workload.max_requests" else
                ["run", "--set", f"{key}={value}", "--out", str(tmp_path / "o")])
    err = capsys.readouterr()[1]
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: ")
    assert key.rsplit(".", 1)[-1] in err
    assert not (tmp_path / "o").exists()


# ---- trace columns -----------------------------------------------------------------------
COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "priority", "hash_ids")
JSON_BAD = [math.nan, math.inf, 1e300, -1e300, -1, 0, 0.5, 2**70, True, False, "", "x", [],
            {}, None]
CSV_BAD = ["nan", "inf", "-inf", "1e300", "-1", "0", "0.5", "true", "", "x", "1,2", "9" * 40]


def _rows(column: str, bad: object) -> list[dict]:
    rows = [{"arrival_s": 0.0, "prompt_tokens": 600, "output_tokens": 5, "priority": 1,
             "hash_ids": [1, 2]},
            {"arrival_s": 1.0, "prompt_tokens": 600, "output_tokens": 5, "priority": 0,
             "hash_ids": [1, 3]}]
    rows[1][column] = bad
    return rows


def _check_workload_or_error(path, column):
    w, err = outcome(load_trace, path)
    if err is not None:
        assert "\n" not in str(err)
        assert column in str(err), str(err)
        return
    assert all(math.isfinite(x) for x in w.arrival_s)
    assert (w.num_prompt_tokens >= 1).all() and (w.num_output_tokens >= 1).all()
    assert w.num_prompt_tokens.max() <= 2**24 and w.arrival_s.max() <= 1e9


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(COLUMNS), bad=st.sampled_from(JSON_BAD))
def test_jsonl_trace_bad_cell(tmp_path, column, bad):
    import json

    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows(column, bad)) + "\n")
    _check_workload_or_error(path, column)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(COLUMNS), bad=st.sampled_from(CSV_BAD))
def test_csv_trace_bad_cell(tmp_path, column, bad):
    import csv

    path = tmp_path / "t.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in _rows(column, bad):
            w.writerow([" ".join(map(str, v)) if isinstance(v, list) else v
                        for v in (r[c] for c in COLUMNS)])
    _check_workload_or_error(path, column)


@pytest.mark.parametrize("value", ["true", "false"])
def test_json_boolean_token_count_rejected(tmp_path, value):
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": {value}}}\n')
    with pytest.raises(FleetsimInputError, match="output_tokens"):
        load_trace(path)
