"""Hostile input, generated: every config field and trace column given NaN, infinities, huge,
negative, wrong-typed, boolean and empty values. Each is either rejected with one line that
names the field (exit 2 from the CLI) or runs to a summary of finite numbers."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
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
    """Dotted names of every scalar config field: nested tables walked, a list of tables
    walked through its first item (``elastic.schedule[0].at_s``), lists of scalars and unions
    with them drawn whole (``engine.speculative.acceptance``); maps are policy arguments,
    drawn by ``_policy_arg_fields``."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is tuple else None
        if dataclasses.is_dataclass(hint):
            out += _scalar_fields(hint, f"{prefix}{f.name}.")
        elif item is not None and dataclasses.is_dataclass(item):
            out += _scalar_fields(item, f"{prefix}{f.name}[0].")
        elif hint is not Mapping and typing.get_origin(hint) is not Mapping:
            out.append(f"{prefix}{f.name}")
    return out


def _policy_registries() -> dict[str, dict]:
    """Config field of a policy choice -> its registry (name -> class)."""
    import fleetsim.policies  # noqa: F401 - fills the registries
    from fleetsim.moe.balancers import BALANCERS
    from fleetsim.policies.batching import BATCH_POLICIES
    from fleetsim.policies.group_planners import GROUP_PLANNERS
    from fleetsim.policies.planners import PLANNERS, TRIGGERS
    from fleetsim.policies.routing import ROUTERS

    return {"policy.batching": BATCH_POLICIES, "cluster.router": ROUTERS,
            "cluster.decode_router": ROUTERS, "group.planner": GROUP_PLANNERS,
            "elastic.planner": PLANNERS, "elastic.trigger": TRIGGERS,
            "hardware.ep.balancer": BALANCERS}


def _policy_arg_fields() -> list[tuple[str, str, str]]:
    """(policy field, registered name, argument) for every argument of every registered
    policy of every policy field: what ``<field>.args.<argument>`` may be set to."""
    import inspect

    out = []
    for where, registry in _policy_registries().items():
        for name, cls in sorted(registry.items()):
            out.extend((where, name, arg) for arg in inspect.signature(cls).parameters
                       if not arg.startswith("_"))
    return out


FIELDS = _scalar_fields(SimConfig)
POLICY_ARGS = _policy_arg_fields()
# What a drawn key's section needs beside the bad value to be valid, so that an error, if
# any, is about the bad value: keys under each prefix are drawn on this base.
SECTION_BASES: dict[str, dict] = {
    "elastic.schedule[0].": {"hardware": {"num_replicas": 2}, "elastic": {
        "schedule": [{"at_s": 1.0, "pool": "default", "num_gpus": 1}]}},
    "cluster.pools[0].": {"cluster": {"pools": [{"name": "a", "gpu": "h100-sxm"}]}},
    "cluster.expert_pool.": {"model": "mixtral-8x7b", "cluster": {
        "pools": [{"name": "p", "gpu": "h200", "role": "prefill"},
                  {"name": "d", "gpu": "h200", "role": "decode"}],
        "expert_pool": {"num_gpus": 2}}},
    "engine.speculative.": {"engine": {"speculative": {
        "method": "eagle3", "num_speculative_tokens": 3}}},
    "group.": {"hardware": {"num_replicas": 2}},
    "elastic.": {"hardware": {"num_replicas": 2}, "elastic": {"monitor_interval_s": 5.0}},
    "hardware.ep.": {"model": "mixtral-8x7b", "hardware": {"gpu": "h200", "tp": 2, "ep": {}}},
    "cluster.decode_router.": {"cluster": {"pools": [
        {"name": "p", "gpu": "h100-sxm", "role": "prefill"},
        {"name": "d", "gpu": "h100-sxm", "role": "decode"}]}},
}


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def test_every_field_is_generated():
    """The generator reaches every section, the ones added last included."""
    assert {"seed", "cluster.link.latency_s", "slo.ttft_s", "engine.block_size",
            "workload.rate_per_s", "workload.prompt_tokens.value", "hardware.tp",
            "hardware.pp", "hardware.dp_attention", "engine.speculative.acceptance",
            "engine.speculative.num_speculative_tokens", "cluster.expert_pool.num_gpus",
            "group.min_compute_bound_batch", "elastic.monitor_interval_s",
            "elastic.schedule[0].num_gpus", "elastic.schedule[0].pool", "cluster.pools[0].tp",
            "elastic.trigger.name", "hardware.ep.scenario"} <= set(FIELDS)
    drawn = {(w, n) for w, n, _ in POLICY_ARGS}
    assert {("elastic.planner", "evolve"), ("elastic.trigger", "threshold"),
            ("group.planner", "esp"), ("policy.batching", "token_budget"),
            ("hardware.ep.balancer", "quota")} <= drawn
    assert ("elastic.planner", "evolve", "sla_itl_s") in POLICY_ARGS


def _data(base: dict, key: str, value: object) -> dict:
    """``base`` with the drawn key's section made valid, then ``key`` set to ``value``."""
    data = copy.deepcopy(base)
    for prefix, extra in SECTION_BASES.items():  # list items' prefixes come first
        if key.startswith(prefix):
            data = _merge(data, extra)
            break
    if "[0]." in key:
        head, _, rest = key.partition("[0].")
        node = data
        for part in head.split("."):
            node = node[part]
        node[0][rest] = value
        return data
    apply_override(data, key, value)
    return data


def _policy_data(base: dict, where: str, name: str, arg: str, value: object) -> dict:
    """``base`` with the policy field ``where`` set to ``name`` and one argument to ``value``
    (the balancer's arguments are ``hardware.ep.balancer_args``)."""
    data = _data(base, f"{where}.name" if where != "hardware.ep.balancer" else where, name)
    args = f"{where}.args.{arg}" if where != "hardware.ep.balancer" else \
        f"hardware.ep.balancer_args.{arg}"
    apply_override(data, args, value)
    return data


def outcome(fn, *args):
    """(result, None) or (None, the input error)."""
    try:
        return fn(*args), None
    except FleetsimInputError as err:
        return None, err


def _check_rejection(err: FleetsimInputError, key: str) -> None:
    """One line naming the field: its own name where the drawn key's section was made valid
    (``SECTION_BASES``), else at least its table (a table missing its required keys)."""
    text = str(err)
    assert "\n" not in text
    leaf = key.rsplit(".", 1)[-1]
    if key.startswith(tuple(SECTION_BASES)):
        assert leaf in text, text
    else:
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


NEW_SECTIONS = ("group.", "elastic.", "cluster.expert_pool.", "engine.speculative.",
                "hardware.pp", "hardware.dp_attention", "hardware.ep.", "cluster.pools[0].")
NEW_FIELDS = [k for k in FIELDS if k.startswith(NEW_SECTIONS)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(NEW_FIELDS), value=st.sampled_from(BAD_VALUES))
def test_new_sections_run_or_fail_naming_the_field(key, value):
    """The sections added last ([group], [elastic], the expert pool, speculative decoding,
    pipeline, attention DP, EP): a drawn bad value fails in one line naming the field, at
    config or at run time, or the run summarizes finitely."""
    data = _data(SYNTHETIC_BASE, key, value)
    data["workload"] = {**data["workload"], "num_requests": 6}
    result, err = outcome(lambda: run(config_from_dict(data)))
    if err is not None:
        _check_rejection(err, key)
        return
    assert non_finite_path(result.summary) is None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arg=st.sampled_from(POLICY_ARGS), value=st.sampled_from(BAD_VALUES))
def test_policy_arguments_run_or_fail_naming_the_argument(arg, value):
    """Every argument of every registered policy (planners, triggers, group planners, routers,
    batching policies, balancers): one line naming ``<field>.args.<argument>`` (or the
    argument), or a run of finite numbers."""
    where, name, key = arg
    data = _policy_data(SYNTHETIC_BASE, where, name, key, value)
    data["workload"] = {**data["workload"], "num_requests": 6}
    result, err = outcome(lambda: run(config_from_dict(data)))
    if err is not None:
        assert "\n" not in str(err) and key in str(err), str(err)
        return
    assert non_finite_path(result.summary) is None


EVOLVE = "elastic.planner.name=evolve"


@pytest.mark.parametrize("settings", [
    ["elastic.monitor_interval_s=0"],
    [EVOLVE, "elastic.planner.args.seed=-1"],
    [EVOLVE, "elastic.planner.args.concurrency_targets=[1e300]"],
    [EVOLVE, "elastic.planner.args.timeline=1"],
    ["elastic.planner.name=static", "elastic.planner.args.ttft_s=0"],
    ["elastic.trigger.name=periodic", "elastic.trigger.args.num_seen=3"],
    ["group.min_compute_bound_batch=0"],
    ["engine.speculative.method=eagle3", "engine.speculative.num_speculative_tokens=-1"],
    ["hardware.pp=0"],
    ["cluster.router.name=mooncake", "cluster.router.args.store_bytes=1e9"],
])
def test_cli_new_sections_exit_2_one_line_and_keep_what_was_written(settings, capsys,
                                                                    tmp_path):
    """The CLI's answer to a bad value of the sections added last (found by the generated
    tests above where they once gave a traceback): exit 2, one line naming the field, no
    traceback, and an earlier run's results in --out left as they were."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "summary.json").write_text("{\"earlier\": 1}")
    argv = ["run", "--out", str(out), "--force", "--set", "workload.max_requests=5"]
    for setting in settings:
        argv += ["--set", setting]
    code = main(argv)
    err = capsys.readouterr()[1]
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fleetsim: error: ") and "Traceback" not in err
    assert settings[-1].split("=")[0].rsplit(".", 1)[-1] in err, err
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == "{\"earlier\": 1}"


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


# ---- programs: generator arguments, JSONL programs, tau-bench, WEKA (issue 26) -----------
def _args_fields() -> list[tuple[str, str]]:
    from fleetsim.programs.generators import GENERATORS, MixedArgs

    out = [(name, f.name) for name, (cls, _) in GENERATORS.items()
           for f in dataclasses.fields(cls)]
    return out + [("mixed", f.name) for f in dataclasses.fields(MixedArgs)]


HUGE_OR_BAD = [*BAD_VALUES, 10**6, 10**9, 2**31, 1e9, 3, 1.5]


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(_args_fields()), value=st.sampled_from(HUGE_OR_BAD),
       num_programs=st.sampled_from([1, 100, 10_000_000]))
def test_generator_args_rejected_in_one_line_or_bounded(field, value, num_programs):
    """Every generator parameter: one line naming programs.args, or a config whose programs
    are bounded (finite numbers, at most MAX_CALLS_PER_PROGRAM calls, 1e8 calls in all)."""
    from fleetsim.inputs import MAX_REQUESTS
    from fleetsim.programs.config import generator_args
    from fleetsim.programs.generators import MAX_CALLS_PER_PROGRAM, max_calls

    generator, key = field
    data = {"programs": {"generator": generator, "num_programs": num_programs,
                         "args": {key: value}}}
    config, err = outcome(config_from_dict, data)
    if err is not None:
        assert "\n" not in str(err) and "programs" in str(err), str(err)
        return
    args = generator_args(config.programs)
    assert non_finite_path(dataclasses.asdict(args)) is None
    assert max_calls(generator, args) <= MAX_CALLS_PER_PROGRAM
    assert num_programs * max_calls(generator, args) <= MAX_REQUESTS


CALL_KEYS = ("prompt_tokens", "output_tokens", "tool_s", "parents", "hash_ids", "id")
PROGRAM_BAD = [*JSON_BAD, 2**63, -(2**63) - 1, [2**64], [1.5], ["x"], 1e9 + 1, 16_777_217]


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(CALL_KEYS + ("arrival_s", "kind", "calls")),
       bad=st.sampled_from(PROGRAM_BAD))
def test_jsonl_program_bad_value(key, bad):
    """One line naming the call's (or program's) key, or a program of bounded numbers."""
    from fleetsim.programs.formats import program_from_json

    call = {"id": "a", "prompt_tokens": 600, "output_tokens": 5, "tool_s": 0.5,
            "hash_ids": [1, 2]}
    child = {"prompt_tokens": 700, "output_tokens": 5, "parents": ["a"]}
    data = {"arrival_s": 1.0, "calls": [call, child]}
    if key in CALL_KEYS:
        child[key] = bad
    else:
        data[key] = bad
    program, err = outcome(program_from_json, data, "p.jsonl:1")
    if err is not None:
        assert "\n" not in str(err) and str(err).startswith("p.jsonl:1"), str(err)
        return
    assert 0 <= program.arrival_s <= 1e9
    for c in program.calls:
        assert 1 <= c.num_prompt_tokens <= 2**24 and 1 <= c.num_output_tokens <= 2**24
        assert 0 <= c.tool_s <= 1e9
        assert c.hash_ids is None or all(-(2**63) <= h < 2**63 for h in c.hash_ids)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "traj", "function",
                                       "requests", "type", "in", "out", "hash_ids",
                                       "think_time"]), inner, max_size=5),
    max_leaves=20)


def _tau_message() -> st.SearchStrategy:
    return st.fixed_dictionaries({"role": st.sampled_from(["assistant", "user", "tool"])},
                                 optional={"content": JSON_VALUES, "tool_calls": JSON_VALUES})


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(JSON_VALUES, st.lists(st.fixed_dictionaries(
    {"traj": st.one_of(JSON_VALUES, st.lists(_tau_message(), max_size=4))}), max_size=3)))
def test_tau_bench_file_of_anything(data):
    """Any JSON in a tau-bench file: programs, or one line naming the file."""
    import json
    import tempfile

    from fleetsim.programs.formats import load_tau_bench

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/tau.json"
        with open(path, "w") as f:
            f.write(json.dumps(data))
        programs, err = outcome(lambda: load_tau_bench(
            path, max_programs=None, tool_s=iter(lambda: 0.5, None)))
    if err is not None:
        assert "\n" not in str(err) and "tau.json" in str(err), str(err)
        return
    assert programs and all(p.calls for p in programs)


def _weka_request() -> st.SearchStrategy:
    good = {"type": st.just("n"), "in": st.just(128), "out": st.just(4),
            "hash_ids": st.just([1, 2]), "think_time": st.just(1.0)}
    return st.fixed_dictionaries(good).flatmap(
        lambda r: st.sampled_from(sorted(r)).flatmap(
            lambda k: st.sampled_from([*JSON_BAD, 2**64, [2**64], "subagent"]).map(
                lambda v: {**r, k: v})))


@settings(max_examples=200, deadline=None)
@given(conv=st.one_of(JSON_VALUES, st.fixed_dictionaries(
    {"requests": st.lists(_weka_request(), min_size=1, max_size=3)})))
def test_weka_conversation_of_anything(conv):
    """Any WEKA conversation: a program of bounded numbers, None (nothing fits), or one line
    naming the trace."""
    from fleetsim.programs.formats import weka_program

    program, err = outcome(weka_program, copy.deepcopy(conv), 131072, "w.tar:trace_1.json")
    if err is not None:
        assert "\n" not in str(err) and "trace_1.json" in str(err), str(err)
        return
    for c in [] if program is None else program.calls:
        assert 1 <= c.num_prompt_tokens <= 131072 and 0 <= c.tool_s <= 1e9


# ---- RL jobs, calibration files, moe compare flags (issue 26) -----------------------------
def _rl_fields() -> list[str]:
    from fleetsim.rl.config import RLConfig

    return [f for f in _scalar_fields(RLConfig) if not f.startswith("generation.engine.")]


@settings(max_examples=250, deadline=None)
@given(key=st.sampled_from(_rl_fields()), value=st.sampled_from(HUGE_OR_BAD))
def test_rl_fields_rejected_in_one_line_or_bounded(key, value):
    from fleetsim.inputs import MAX_REQUESTS
    from fleetsim.rl.config import MAX_SAMPLES_PER_STEP, rl_config_from_dict

    data: dict = {}
    apply_override(data, key, value)
    cfg, err = outcome(rl_config_from_dict, data)
    if err is not None:
        _check_rejection(err, key)
        return
    assert non_finite_path(dataclasses.asdict(cfg)) is None
    assert cfg.num_samples_per_step <= MAX_SAMPLES_PER_STEP
    assert cfg.num_steps * cfg.num_samples_per_step <= MAX_REQUESTS


RESULT_FIELDS = ("completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms",
                 "mean_tpot_ms", "num_prompts", "request_rate", "burstiness",
                 "max_concurrency", "model_id")


@settings(max_examples=250, deadline=None)
@given(key=st.sampled_from(RESULT_FIELDS), bad=st.sampled_from([*JSON_BAD, "inf", 1e12]))
def test_bench_result_field(key, bad):
    """A `vllm bench serve` result field: one line naming the file and the field, or a
    workload within `fleetsim run`'s own bounds."""
    import json
    import tempfile

    from fleetsim.calibrate.fit import load_bench_result

    data = {"completed": 3, "total_input_tokens": 300, "total_output_tokens": 30,
            "mean_ttft_ms": 20.0, "mean_tpot_ms": 5.0, "request_rate": 2.0, key: bad}
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/r.json"
        with open(path, "w") as f:
            f.write(json.dumps(data))
        r, err = outcome(load_bench_result, path)
    if err is not None:
        assert "\n" not in str(err) and f"r.json: {key}" in str(err), str(err)
        assert "--" not in str(err).split(";")[0], str(err)  # a field, not a run flag
        return
    assert 1 <= r.num_prompts <= 10**8 and 1 <= r.isl <= 2**24 and 1 <= r.osl <= 2**24
    assert r.request_rate == math.inf or 1e-6 <= r.request_rate <= 1e7
    assert 1e-4 <= r.burstiness <= 1e6


@settings(max_examples=200, deadline=None)
@given(column=st.integers(0, 4), bad=st.sampled_from([*CSV_BAD, "1e30", "16777217"]))
def test_step_csv_bad_cell(column, bad):
    import tempfile

    from fleetsim.calibrate.fit import STEP_COLUMNS, load_step_csv

    rows = [["4", "4000", "512", "0", "0.02"] for _ in range(5)]
    rows[2][column] = bad
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/steps.csv"
        with open(path, "w") as f:
            f.write(",".join(STEP_COLUMNS) + "\n" + "\n".join(map(",".join, rows)) + "\n")
        table, err = outcome(load_step_csv, path)
    if err is not None:
        assert "\n" not in str(err) and "steps.csv" in str(err), str(err)
        return
    assert all(math.isfinite(x) for x in table.ravel())
    assert table[:, 2].max() <= 2**24 and table[:, 0].max() <= 10**7


@functools.cache
def _moe_defaults() -> argparse.Namespace:
    from fleetsim.cli import build_parser

    return build_parser().parse_args(["moe", "compare"])


MOE_FLAGS = ("num_gpus", "gpus_per_node", "num_experts", "layers", "microbatches", "batch",
             "spare_slots", "tokens_per_gpu", "seed")


@settings(max_examples=200, deadline=None)
@given(flag=st.sampled_from(MOE_FLAGS),
       value=st.sampled_from([-(2**63), -1, 0, 1, 7, 10**6, 2**31, 2**64]))
def test_moe_compare_flags_rejected_or_bounded(flag, value):
    from fleetsim.moe.cli import MAX_LOAD_CELLS, _setups

    args = argparse.Namespace(**vars(_moe_defaults()))
    setattr(args, flag, value)
    setups, err = outcome(_setups, args)
    if err is not None:
        assert "\n" not in str(err) and "--" in str(err), str(err)
        return
    for s in setups:
        assert 0 <= s.seed < 2**63 and s.num_gpus <= 65_536
        assert s.num_microbatches * s.num_layers * s.num_experts <= MAX_LOAD_CELLS
