"""Programs: the DAG checks, the JSONL format, the WEKA loader, the generators, the config
table and a run through ``run()`` with program metrics."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.programs import Call, Program, dump_jsonl, load_jsonl, program_summary, slo_scale
from fleetsim.programs.config import ProgramWorkloadConfig, build_programs
from fleetsim.programs.dag import assign_hash_ids, shared_prefix_tokens
from fleetsim.programs.formats import weka_program
from fleetsim.programs.generators import GENERATORS, generate
from fleetsim.programs.source import kv_links
from fleetsim.programs.standalone import CallTimer, _prefill_s, critical_path_s
from fleetsim.registry import PolicySpec
from fleetsim.run import run
from fleetsim.search.slo_scale import _program_scale, deadline_slo_scale, program_slo_scales
from fleetsim.serving.standalone import decode_time_s


def write(tmp_path, lines):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_jsonl_round_trip_and_any_call_order(tmp_path):
    path = write(tmp_path, [{"arrival_s": 1.5, "kind": "k", "calls": [
        {"id": "b", "prompt_tokens": 300, "output_tokens": 5, "parents": ["a"]},
        {"id": "a", "prompt_tokens": 100, "output_tokens": 20, "tool_s": 0.5}]}])
    (p,) = load_jsonl(path)
    assert p.calls == (Call(100, 20, (), 0.5), Call(300, 5, (0,), 0.0))
    assert (p.arrival_s, p.kind) == (1.5, "k")
    again = tmp_path / "q.jsonl"
    again.write_text(dump_jsonl([p]))
    assert load_jsonl(again) == [p]


@pytest.mark.parametrize(("calls", "where", "words"), [
    ([{"id": "a", "prompt_tokens": 1, "output_tokens": 1, "parents": ["b"]},
      {"id": "b", "prompt_tokens": 1, "output_tokens": 1, "parents": ["a"]}],
     ".calls", "acyclic"),
    ([{"prompt_tokens": 1, "output_tokens": 1, "parents": ["7"]}], ".calls[0].parents",
     "no call has id '7'"),
    ([{"prompt_tokens": 1, "output_tokens": 1, "tool_s": -1}], ".calls[0].tool_s", ">= 0"),
    ([{"prompt_tokens": 0, "output_tokens": 1}], ".calls[0].prompt_tokens", "at least 1"),
    ([{"prompt_tokens": 5, "output_tokens": 1, "speed": 3}], ".calls[0].speed", "known keys"),
])
def test_bad_programs_name_the_field_the_value_and_the_fix(tmp_path, calls, where, words):
    path = write(tmp_path, [{"calls": calls}])
    with pytest.raises(FleetsimInputError) as err:
        load_jsonl(path)
    msg = str(err.value)
    assert f"{path}:1{where}" in msg and words in msg and "\n" not in msg


def test_bad_input_from_the_cli_is_one_line_and_exit_2(tmp_path, capsys):
    path = write(tmp_path, [{"calls": [{"prompt_tokens": 5, "output_tokens": 1,
                                        "tool_s": -2.0}]}])
    code = main(["run", "--set", "programs.generator=\"jsonl\"", "--set",
                 f"programs.path=\"{path}\"", "--set", "programs.arrival=\"trace\"",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "tool_s" in err[0] and "-2.0" in err[0]


def test_unknown_program_policy_is_one_line_exit_2(tmp_path, capsys):
    code = main(["run", "--set", "programs.num_programs=2", "--set",
                 "policy.batching.name=\"no_such_program_policy\"", "--out",
                 str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no_such_program_policy" in err[0]


@pytest.mark.parametrize(("sets", "words"), [
    (["programs.tool_kv=\"pin\""], "programs.tool_kv"),
    (["programs.tool_kv=\"keep\"", "programs.kv_ttl_s=-1"], "programs.kv_ttl_s"),
    (["programs.tool_kv=\"offload\""], "engine.swap_space_gib"),
    (["programs.tool_kv=\"keep\"", "engine.enable_prefix_caching=false"],
     "engine.enable_prefix_caching"),
    # every tool-step generator checks the lengths and tool times it shares
    (["programs.generator=\"lats\"", "programs.args.tool_median_s=-1"], "tool_median_s"),
    (["programs.generator=\"map_reduce\"", "programs.args.length_sigma=-1"], "length_sigma"),
])
def test_bad_tool_kv_is_one_line_exit_2(tmp_path, capsys, sets, words):
    args = ["run", "--set", "programs.num_programs=2", "--out", str(tmp_path / "o")]
    for s in sets:
        args += ["--set", s]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and words in err[0], err


def test_children_share_the_parent_context_blocks_and_siblings_share_its_output():
    root = Call(200, 100, ())  # context 300 tokens: 4 full blocks of 64
    a, b = Call(300 + 50, 5, (0,)), Call(300 + 90, 5, (0,))
    short = Call(100, 5, (0,))  # does not extend the context: nothing shared
    ids = assign_hash_ids(Program(0.0, (root, a, b, short)), 64, itertools.count())
    assert len(ids[0]) == 3 and len(ids[1]) == 5 and len(ids[2]) == 6
    assert ids[1][:4] == ids[2][:4] and ids[1][:3] == ids[0]
    assert ids[1][4] != ids[2][4] and not set(ids[3]) & set(ids[0] + ids[1] + ids[2])
    assert shared_prefix_tokens(Program(0.0, (root, a, b, short)), 64) == [0, 256, 256, 0]


def test_critical_path_adds_tool_times_on_the_longest_path():
    p = Program(0.0, (Call(1, 1, (), 2.0), Call(1, 1, (0,), 0.0), Call(1, 1, (0,), 9.0),
                      Call(1, 1, (1, 2), 0.0)))
    assert critical_path_s(p, [1.0, 20.0, 1.0, 1.0]) == 1 + 2 + 20 + 1
    assert critical_path_s(p, [1.0, 1.0, 1.0, 1.0]) == 1 + 2 + 1 + 9 + 1


class _LinearDecode:
    """A step model whose decode step is ``base + per_kv * kv`` (prefill: 1e-5 s a token)."""

    def __init__(self, base, per_kv):
        self.base, self.per_kv = base, per_kv

    def step_time_s(self, chunks, num_decode, kv):
        return (sum(n for n, _ in chunks) * 1e-5
                + (self.base + self.per_kv * kv if num_decode else 0.0))

    def decode_step_times_s(self, num_decode, kv):
        return self.base + self.per_kv * np.asarray(kv, dtype=np.float64)

    def decode_terms_s(self, num_decode):
        return self.base, self.per_kv, 0.0


@pytest.mark.parametrize(("pools", "num_summed"), [
    # H200-like never slower than the others: only its decode time is summed
    ([(0.02, 3e-8), (0.01, 1e-8), (0.012, 2e-8)], 1),
    # a faster step that grows faster with context: the best depends on the call
    ([(0.01, 5e-6), (0.02, 1e-8)], 2),
])
def test_call_times_take_the_fastest_decode_pool_bit_for_bit(pools, num_summed):
    """A call's standalone time uses the least decode time over the decode pools; summing
    only a pool never slower than the others gives the same float."""
    models = [_LinearDecode(b, k) for b, k in pools]
    timer = CallTimer([_LinearDecode(0.0, 0.0)], 512, models, 1e-6, 0.001)
    assert len(timer._decode_candidates) == num_summed
    for prompt, output in ((10, 2), (300, 57), (4000, 700), (20000, 1500)):
        decode = min(float(m.decode_step_times_s(1, prompt + np.arange(output - 1)).sum())
                     for m in models)
        prefill = timer.call_s(prompt, 0, 1)  # (one token: the prefill alone)
        assert timer.call_s(prompt, 0, output) == prefill + 0.001 + 1e-6 * prompt + decode


def test_timers_sharing_alone_caches_give_a_fresh_timers_times():
    """Mixed pools: a call's time alone on each model is kept in ``alone_caches``; a timer
    handed another's (equal step models) reads them and gives a fresh timer's floats, and
    the least over the models is taken as before."""
    models = [_LinearDecode(0.02, 3e-8), _LinearDecode(0.01, 5e-6)]
    calls = ((10, 0, 2), (300, 64, 57), (4000, 0, 700), (20000, 128, 1500))
    fresh = CallTimer(models, 512)
    first = CallTimer(models, 512, alone_caches=[{}, {}])
    times = [first.call_s(*c) for c in calls]
    assert times == [fresh.call_s(*c) for c in calls]
    assert all(len(cache) == len(calls) for cache in first.alone_caches)
    # The second timer's models are never asked: every time comes from the shared caches.
    second = CallTimer([_Refuses(), _Refuses()], 512, alone_caches=first.alone_caches)
    assert [second.call_s(*c) for c in calls] == times
    assert times[2] == min(_prefill_s(m, 4000, 0, 512) + decode_time_s(m, 4000, 700)
                           for m in models)
    with pytest.raises(ValueError, match="alone_caches"):
        CallTimer(models, 512, alone_caches=[{}])


class _Refuses:
    def step_time_s(self, chunks, num_decode, kv):
        raise AssertionError("a shared cache should have answered")

    decode_step_times_s = step_time_s


def test_weka_conversation_becomes_a_chain_with_a_sub_agent_fork_join():
    def r(t, n_in, out, think, kind="n"):
        return {"t": t, "type": kind, "in": n_in, "out": out, "hash_ids": list(range(n_in // 64)),
                "input_types": ["tool_result"], "api_time": 1.0, "think_time": think}
    conv = {"requests": [r(0, 640, 10, 0), r(5, 704, 10, 3),
                         {"type": "subagent", "requests": [r(0, 128, 5, 0), r(2, 192, 5, 1)]},
                         r(30, 768, 10, 20), r(60, 10**6, 10, 4)]}
    p = weka_program(conv, 100_000, "w")
    assert [c.parents for c in p.calls] == [(), (0,), (1,), (2,), (1, 3)]
    assert [c.tool_s for c in p.calls] == [3.0, 0.0, 1.0, 0.0, 0.0]  # the last call: too long
    assert p.calls[2].hash_ids[0] != p.calls[0].hash_ids[0]  # a sub-agent's own id scope


@pytest.mark.parametrize("name", [*GENERATORS, "mixed"])
def test_generators_are_seeded_valid_dags(name):
    cfg = ProgramWorkloadConfig(generator=name, num_programs=30, rate_per_s=2.0)
    a = build_programs(cfg, np.random.default_rng(1), 131072)
    b = build_programs(cfg, np.random.default_rng(1), 131072)
    assert a == b and len(a) == 30
    assert all(x.arrival_s <= y.arrival_s for x, y in itertools.pairwise(a))
    for p in a:
        for i, c in enumerate(p.calls):
            assert all(q < i for q in c.parents) and c.tool_s >= 0


def test_lats_shape_is_breadth_times_depth_plus_root():
    from fleetsim.programs.generators import LatsArgs

    (p,) = generate("lats", LatsArgs(breadth=3, depth=2), [0.0], np.random.default_rng(0))
    assert p.num_calls == 7 and [len(c.parents) for c in p.calls] == [0] + [1] * 6


def test_config_rejects_unknown_generator_args():
    with pytest.raises(FleetsimInputError, match="programs"):
        config_from_dict({"programs": {"generator": "lats", "args": {"width": 3}}})


def test_slo_scale_counts_unfinished_programs_as_never_meeting():
    jct, tw = np.array([2.0, 3.0, 4.0]), np.array([1.0, 1.0, 1.0])
    assert slo_scale(jct, tw, 50) == 3.0
    assert slo_scale(jct, tw, 100, num_unfinished=1) == float("inf")


def test_latency_per_token_is_jct_over_the_tokens_of_every_call_finished_programs_only():
    """Autellix's program-level token latency (§6.2), by hand: 2 s over 4 tokens and 6 s over
    10; the unfinished third program is left out, as for every distribution."""
    rows = {"finish_s": np.array([3.0, 7.0, np.nan]), "jct_s": np.array([2.0, 6.0, np.nan]),
            "standalone_s": np.array([1.0, 2.0, 1.0]), "num_output_tokens": np.array([4, 10, 5]),
            "num_calls": np.array([1, 2, 1]), "kind": np.array(["a", "a", "a"], dtype=object)}
    summary = program_summary(rows)
    assert summary["latency_per_token_s"]["mean"] == pytest.approx((0.5 + 0.6) / 2)
    assert summary["latency_per_token_s"]["max"] == pytest.approx(0.6)
    assert summary["standalone_per_token_s"]["mean"] == pytest.approx((0.25 + 0.2) / 2)
    assert summary["num_unfinished"] == 1


def test_a_dags_tokens_are_those_of_all_its_threads(tmp_path):
    """A fork-join: the root, two branches in parallel and the join generate 10 + 20 + 30 +
    40 tokens; the latency per token is the program's JCT (its critical path) over all 100."""
    path = write(tmp_path, [{"arrival_s": 0.0, "kind": "k", "calls": [
        {"id": "r", "prompt_tokens": 100, "output_tokens": 10},
        {"id": "a", "prompt_tokens": 200, "output_tokens": 20, "parents": ["r"]},
        {"id": "b", "prompt_tokens": 200, "output_tokens": 30, "parents": ["r"]},
        {"id": "j", "prompt_tokens": 300, "output_tokens": 40, "parents": ["a", "b"]}]}])
    cfg = config_from_dict({"programs": {"generator": "jsonl", "path": str(path)}})
    prog = run(cfg).summary["programs"]
    assert prog["latency_per_token_s"]["mean"] == pytest.approx(prog["jct_s"]["mean"] / 100)
    assert prog["standalone_per_token_s"]["mean"] == pytest.approx(
        prog["standalone_s"]["mean"] / 100)


def test_run_reports_program_metrics_with_jct_at_least_standalone():
    cfg = config_from_dict({"hardware": {"num_replicas": 2}, "programs": {
        "generator": "mixed", "num_programs": 20, "rate_per_s": 0.5}})
    summary = run(cfg).summary
    prog = summary["programs"]
    assert prog["num_programs"] == prog["num_finished"] == 20
    assert summary["num_requests"] == prog["num_calls"] == summary["num_finished"]
    assert prog["slowdown"]["max"] >= 1.0 and prog["slo_scale"]["req95"] >= 1.0


def test_slo_scale_command_reports_programs_and_searches_llf_deadlines(tmp_path, capsys):
    base = {"hardware": {"num_replicas": 1},
            "programs": {"generator": "tool_chain", "num_programs": 12, "rate_per_s": 4.0}}
    fcfs = program_slo_scales(config_from_dict(base), (95.0,))
    assert fcfs["over"] == "programs" and not fcfs["deadline_searched"]
    assert fcfs["num_requests"] == 12 and fcfs["slo_scale"]["req95"] >= 1.0
    llf_cfg = config_from_dict({**base, "policy": {"batching": {"name": "workflow_llf"}}})
    s = deadline_slo_scale(llf_cfg, 95.0)
    # At the scale found, run with that deadline, 95% of programs meet it.
    cfg = dataclasses.replace(llf_cfg, policy=dataclasses.replace(
        llf_cfg.policy, batching=PolicySpec(name="workflow_llf", args={"slo_scale": s})))
    assert s >= 1.0 and _program_scale(cfg, 95.0) <= s
    assert main(["slo-scale", "--set", "programs.num_programs=6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["over"] == "programs"


def test_tau_bench_trajectory_is_a_chain_of_assistant_calls(tmp_path):
    traj = [{"role": "system", "content": "s" * 400}, {"role": "user", "content": "u" * 40},
            {"role": "assistant", "content": "a" * 80,
             "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "content": "t" * 200}, {"role": "assistant", "content": "b" * 8}]
    path = tmp_path / "tau.json"
    path.write_text(json.dumps([{"traj": traj}]))
    cfg = ProgramWorkloadConfig(generator="tau_bench", path=str(path), num_programs=None)
    (p,) = build_programs(cfg, np.random.default_rng(0), 131072)
    first, second = p.calls
    assert (first.num_prompt_tokens, first.parents, second.parents) == (110, (), (0,))
    tool_chars = len(json.dumps({"name": "f", "arguments": "{}"}))
    assert first.num_output_tokens == (80 + tool_chars) // 4
    assert second.num_prompt_tokens == (440 + 80 + tool_chars + 200) // 4
    assert first.tool_s > 0 and second.tool_s == 0.0


def test_weka_loader_reads_a_directory_of_traces(tmp_path):
    conv = {"requests": [{"type": "n", "in": 128, "out": 4, "hash_ids": [1, 2],
                          "think_time": 0}, {"type": "n", "in": 192, "out": 4,
                                             "hash_ids": [1, 2, 3], "think_time": 7}]}
    (tmp_path / "trace_0001.json").write_text(json.dumps(conv))
    cfg = ProgramWorkloadConfig(generator="weka", path=str(tmp_path), num_programs=None,
                                rate_per_s=1.0)
    (p,) = build_programs(cfg, np.random.default_rng(0), 131072)
    assert [c.tool_s for c in p.calls] == [7.0, 0.0] and p.kind == "claude_code"
    assert shared_prefix_tokens(p, 64) == [0, 128]


def test_tool_times_resampled_from_measured_tool_calls(tmp_path):
    from fleetsim.programs.tools import tool_latencies

    events = [
        {"type": "assistant", "timestamp": "2026-02-07T02:00:00.000Z",
         "message": {"content": [{"type": "tool_use", "id": "a", "name": "Bash"}]}},
        {"type": "user", "timestamp": "2026-02-07T02:00:02.500Z",
         "message": {"content": [{"type": "tool_result", "tool_use_id": "a"}]}},
        {"type": "assistant", "timestamp": "2026-02-07T02:00:03.000Z",
         "message": {"content": [{"type": "tool_use", "id": "b", "name": "Read"}]}},
        {"type": "user", "timestamp": "2026-02-07T02:00:03.040Z",
         "message": {"content": [{"type": "tool_result", "tool_use_id": "b"}]}}]
    run_dir = tmp_path / "experiments" / "task" / "attempt_1"
    run_dir.mkdir(parents=True)
    (run_dir / "trace.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    lat = tool_latencies(tmp_path)
    assert lat == {"Bash": [2.5], "Read": [pytest.approx(0.04)]}
    cfg = ProgramWorkloadConfig(generator="tool_chain", num_programs=3,
                                tool_trace=str(tmp_path), tool_names=("Bash",))
    for p in build_programs(cfg, np.random.default_rng(0), 131072):
        assert {c.tool_s for c in p.calls[:-1]} <= {2.5} and p.calls[-1].tool_s in (0.0, 2.5)
    with pytest.raises(FleetsimInputError, match="programs.tool_names"):
        build_programs(ProgramWorkloadConfig(generator="chain", num_programs=1,
                                             tool_trace=str(tmp_path), tool_names=("Web",)),
                       np.random.default_rng(0), 131072)


def test_kv_links_mark_the_parent_a_child_extends():
    """Only a parent whose whole sequence a child's prompt starts with is worth keeping."""
    root = Call(200, 100, ())  # context 300 tokens: 4 full blocks of 64
    extend, short = Call(300 + 50, 5, (0,)), Call(100, 5, (0,))
    program = Program(0.0, (root, extend, short))
    ids = assign_hash_ids(program, 64, itertools.count())
    context, extends = kv_links(program, ids, 64)
    assert context[0] == ids[1][:4] and extends == [False, True, False]
    assert context[1] == () and context[2] == ()
