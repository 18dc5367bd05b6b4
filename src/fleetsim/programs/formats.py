"""Programs from files: fleetsim's JSONL program format and the WEKA Claude Code traces.

JSONL, one program per line (``docs/programs.md``)::

    {"arrival_s": 0.0, "kind": "agent", "calls": [
       {"id": "plan", "prompt_tokens": 1500, "output_tokens": 60, "tool_s": 0.8},
       {"id": "act", "prompt_tokens": 1800, "output_tokens": 40, "parents": ["plan"]}]}

``id`` is optional (default: the call's position, and ``parents`` then name positions);
``parents``, ``tool_s`` (seconds of the tool call after the call) and ``hash_ids`` (the
prompt's prefix-block hash ids, blocks of the source's ``block_tokens``) are optional;
``arrival_s`` is used when the arrival process is ``trace``. Calls may be listed in any order.
"""

from __future__ import annotations

import io
import json
import math
import os
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import (
    MAX_TIME_S,
    MAX_TOKENS,
    check_number,
    read_bytes,
    read_json,
    read_text,
)
from fleetsim.programs.dag import Call, Program, check_program, topological_order
from fleetsim.programs.generators import MAX_CALLS_PER_PROGRAM

_CALL_KEYS = {"id", "prompt_tokens", "output_tokens", "parents", "tool_s", "hash_ids"}


def _int(value: Any, where: str) -> int:
    """A token count: a whole number of at most MAX_TOKENS (NaN, Infinity, 1e300 fail here;
    check_program asks for at least 1)."""
    check_number(value, where, lo=-math.inf, hi=math.inf, integer=True)
    if value > MAX_TOKENS:
        raise FleetsimInputError(where, value, f"give at most {MAX_TOKENS:,} tokens")
    return int(value)


def _float(value: Any, where: str) -> float:
    """Seconds, at most MAX_TIME_S: beyond it float64 time no longer resolves a step, and a
    program waiting 1e300 s would never finish (check_program asks for >= 0)."""
    check_number(value, where, lo=-math.inf, hi=math.inf)
    if value > MAX_TIME_S:
        raise FleetsimInputError(where, value, f"give at most {MAX_TIME_S:g} seconds")
    return float(value)


def program_from_json(data: Any, where: str) -> Program:
    """One program of the JSONL format (``where`` names it in errors)."""
    if not isinstance(data, dict) or not isinstance(data.get("calls"), list):
        raise FleetsimInputError(where, str(data)[:60], 'write {"calls": [...]} per line')
    unknown = set(data) - {"arrival_s", "kind", "calls"}
    if unknown:
        raise FleetsimInputError(f"{where}.{sorted(unknown)[0]}", data[sorted(unknown)[0]],
                                 "known keys: arrival_s, kind, calls")
    raw = data["calls"]
    if len(raw) > MAX_CALLS_PER_PROGRAM:
        raise FleetsimInputError(f"{where}.calls", f"{len(raw):,} calls",
                                 f"a program holds at most {MAX_CALLS_PER_PROGRAM:,}; split it")
    ids, parents = [], []
    for i, c in enumerate(raw):
        here = f"{where}.calls[{i}]"
        if not isinstance(c, dict):
            raise FleetsimInputError(here, c, "each call is an object")
        bad = set(c) - _CALL_KEYS
        if bad:
            raise FleetsimInputError(f"{here}.{sorted(bad)[0]}", c[sorted(bad)[0]],
                                     f"known keys: {', '.join(sorted(_CALL_KEYS))}")
        for key in ("prompt_tokens", "output_tokens"):
            if key not in c:
                raise FleetsimInputError(f"{here}.{key}", None, "every call needs it")
        ids.append(str(c.get("id", i)))
        ps = c.get("parents", [])
        if not isinstance(ps, list):
            raise FleetsimInputError(f"{here}.parents", ps, "give a list of call ids")
        parents.append([str(p) for p in ps])
    order = topological_order(ids, parents, where)
    position = {ids[j]: k for k, j in enumerate(order)}
    calls = []
    for j in order:
        c, here = raw[j], f"{where}.calls[{j}]"
        hash_ids = c.get("hash_ids")
        # The engine keys blocks by int64, as the trace loaders check (workloads.parsing).
        if hash_ids is not None and (not isinstance(hash_ids, list) or not all(
                type(h) is int and -(2**63) <= h < 2**63 for h in hash_ids)):
            raise FleetsimInputError(f"{here}.hash_ids", str(hash_ids)[:40],
                                     "give a list of 64-bit integers")
        calls.append(Call(_int(c["prompt_tokens"], f"{here}.prompt_tokens"),
                          _int(c["output_tokens"], f"{here}.output_tokens"),
                          tuple(position[p] for p in parents[j]),
                          _float(c.get("tool_s", 0.0), f"{here}.tool_s"),
                          tuple(hash_ids) if hash_ids is not None else None))
    try:
        check_program(calls, where)
    except FleetsimInputError as err:  # name the call as the file does, not by position
        raise _renamed(err, order, where) from None
    arrival = _float(data.get("arrival_s", 0.0), f"{where}.arrival_s")
    if not arrival >= 0:
        raise FleetsimInputError(f"{where}.arrival_s", arrival, "give seconds >= 0")
    return Program(arrival, tuple(calls), str(data.get("kind", "program")))


def _renamed(err: FleetsimInputError, order: list[int], where: str) -> FleetsimInputError:
    prefix = f"{where}.calls["
    if err.where.startswith(prefix):
        k, _, rest = err.where[len(prefix):].partition("]")
        if k.isdigit():
            return FleetsimInputError(f"{prefix}{order[int(k)]}]{rest}", err.value, err.fix)
    return err


def load_jsonl(path: str | os.PathLike[str]) -> list[Program]:
    """Every program of a JSONL file (blank lines skipped)."""
    text = read_text(path, "programs")
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{os.fspath(path)}:{n}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise FleetsimInputError(where, line[:40], f"not JSON ({err.msg})") from None
        out.append(program_from_json(data, where))
    if not out:
        raise FleetsimInputError(os.fspath(path), "no programs", "write one program per line")
    return out


def dump_jsonl(programs: Iterable[Program]) -> str:
    """``programs`` in the JSONL format (ids are positions)."""
    lines = []
    for p in programs:
        calls = []
        for c in p.calls:
            d: dict[str, Any] = {"prompt_tokens": c.num_prompt_tokens,
                                 "output_tokens": c.num_output_tokens}
            if c.parents:
                d["parents"] = list(c.parents)
            if c.tool_s:
                d["tool_s"] = c.tool_s
            if c.hash_ids is not None:
                d["hash_ids"] = list(c.hash_ids)
            calls.append(d)
        lines.append(json.dumps({"arrival_s": p.arrival_s, "kind": p.kind, "calls": calls}))
    return "\n".join(lines) + "\n"


# ---- WEKA Claude Code traces (callanjfox/kv-cache-tester, Apache-2.0) ---------------------
WEKA_BLOCK_TOKENS = 64  # the traces' hash block (``block_size``)


def weka_program(conv: dict[str, Any], max_context_tokens: int, where: str) -> Program | None:
    """One conversation as a program: a chain of its top-level calls, each call's ``tool_s``
    the client gap before the next (``think_time``: tool execution plus any human time); a
    sub-agent forks from the call before it (which then has no tool time: the sub-agent is
    its tool) and the next top-level call joins it. The program stops before the first call
    whose context exceeds ``max_context_tokens``; None if not even the first call fits."""
    calls: list[Call] = []
    prev: int | None = None  # last top-level call
    joins: list[int] = []  # sub-agents' last calls the next top-level call waits for

    def add(r: dict[str, Any], parents: tuple[int, ...]) -> int | None:
        pin, pout = r["in"], max(1, r["out"])
        if pin < 1 or pin + pout > max_context_tokens:
            return None
        calls.append(Call(pin, pout, parents, 0.0, tuple(int(h) for h in r["hash_ids"])))
        return len(calls) - 1

    def set_tool(i: int, tool_s: float) -> None:
        c = calls[i]
        calls[i] = Call(c.num_prompt_tokens, c.num_output_tokens, c.parents, tool_s, c.hash_ids)

    spawned = False  # the last top-level call spawned sub-agents (its tool time is 0)
    requests = _weka_requests(conv, where)
    for n_sub, r in enumerate(requests):
        if r.get("type") == "subagent":
            spawned = prev is not None
            sub_prev, offset = prev, (n_sub + 1) << 40  # sub-agent ids: their own scope
            for j, s in enumerate(x for x in r.get("requests", []) if x.get("type") != "subagent"):
                if j and sub_prev is not None:
                    set_tool(sub_prev, float(s.get("think_time") or 0.0))
                k = add({**s, "hash_ids": [h + offset for h in s["hash_ids"]]},
                        (sub_prev,) if sub_prev is not None else ())
                if k is None:
                    break
                sub_prev = k
            if sub_prev is not None and sub_prev != prev:
                joins.append(sub_prev)
            continue
        if prev is not None and not spawned:
            set_tool(prev, float(r.get("think_time") or 0.0))
        k = add(r, ((prev,) if prev is not None else ()) + tuple(joins))
        if k is None:
            break
        prev, joins, spawned = k, [], False
    if not calls:
        return None
    waited = {q for c in calls for q in c.parents}
    for i in range(len(calls)):
        if i not in waited:
            set_tool(i, 0.0)  # the program ends at its last call
    check_program(calls, where)
    return Program(0.0, tuple(calls), "claude_code")


def _weka_requests(conv: Any, where: str) -> list[dict[str, Any]]:
    """The conversation's requests, each checked (and its sub-agents'): token counts whole
    numbers in range, ``think_time`` seconds in range, ``hash_ids`` 64-bit integers."""
    if not isinstance(conv, dict) or not isinstance(conv.get("requests", []), list):
        raise FleetsimInputError(where, str(conv)[:40], 'a WEKA trace is {"requests": [...]}; '
                                 "give the weka .tar.xz or a directory of its trace_*.json")
    requests = conv.get("requests", [])
    for i, r in enumerate(requests):
        here = f"{where}: requests[{i}]"
        if not isinstance(r, dict):
            raise FleetsimInputError(here, str(r)[:40], "each request is an object")
        if r.get("type") == "subagent":
            _weka_requests(r, here)
            continue
        for key in ("in", "out", "hash_ids"):
            if key not in r:
                raise FleetsimInputError(f"{here}.{key}", None, "every WEKA request has it")
        r["in"] = int(check_number(r["in"], f"{here}.in", lo=0, hi=MAX_TOKENS, integer=True))
        r["out"] = int(check_number(r["out"], f"{here}.out", lo=0, hi=MAX_TOKENS,
                                    integer=True))
        if r.get("think_time") is not None:
            r["think_time"] = float(check_number(r["think_time"], f"{here}.think_time",
                                                 lo=0.0, hi=MAX_TIME_S))
        if not isinstance(r["hash_ids"], list) or not all(
                type(h) is int and -(2**63) <= h < 2**63 for h in r["hash_ids"]):
            raise FleetsimInputError(f"{here}.hash_ids", str(r["hash_ids"])[:40],
                                     "give a list of 64-bit integers")
    return requests


def _weka_json(data: bytes | str, where: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FleetsimInputError(where, "not JSON", f"invalid JSON ({err}); give the WEKA "
                                 "traces' trace_*.json files") from None


def iter_weka(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(member name, conversation) of a ``weka_claude_code_traces.tar.xz`` or a directory of
    ``trace_*.json`` files, in name order."""
    p = os.fspath(path)
    if os.path.isdir(p):
        for name in sorted(os.listdir(p)):
            if name.endswith(".json"):
                yield name, _weka_json(read_text(os.path.join(p, name), "weka trace"),
                                       f"{p}:{name}")
        return
    data = read_bytes(p, "weka traces")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = sorted((m for m in tar.getmembers() if m.name.endswith(".json")),
                             key=lambda m: m.name)
            for m in members:
                f = tar.extractfile(m)
                if f is not None:
                    yield m.name, _weka_json(f.read(), f"{p}:{m.name}")
    except tarfile.TarError as err:
        raise FleetsimInputError(p, "not a tar archive", f"give the weka .tar.xz or a "
                                 f"directory of trace_*.json ({err})") from None


def load_weka(path: str | os.PathLike[str], *, max_programs: int | None,
              max_context_tokens: int) -> list[Program]:
    """Up to ``max_programs`` conversations of the WEKA traces as programs (arrival 0: pair
    them with an arrival process)."""
    out: list[Program] = []
    num_read = 0
    for name, conv in iter_weka(path):
        if max_programs is not None and len(out) >= max_programs:
            break
        num_read += 1
        p = weka_program(conv, max_context_tokens, f"{os.fspath(path)}:{name}")
        if p is not None:
            out.append(p)
    if not num_read:  # an empty folder or archive: no context would help
        raise FleetsimInputError(os.fspath(path), "no trace_*.json",
                                 "give the weka_claude_code_traces .tar.xz or a directory "
                                 "holding its trace_*.json files")
    if not out:
        raise FleetsimInputError(os.fspath(path), f"no conversation of {num_read} fits",
                                 f"every first call is empty or longer than the model's "
                                 f"context ({max_context_tokens:,} tokens); pick a model "
                                 f"with a longer context")
    return out


# ---- tau-bench trajectories (sierra-research/tau-bench, MIT) ------------------------------
CHARS_PER_TOKEN = 4  # the common ~4 characters per English token rule of thumb


def _chars(message: Any, where: str) -> int:
    if not isinstance(message, dict):
        raise FleetsimInputError(where, str(message)[:40], "each message is an object with "
                                 "role and content")
    content = message.get("content") or ""
    if not isinstance(content, str):
        raise FleetsimInputError(f"{where}.content", str(content)[:40], "give text or null")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise FleetsimInputError(f"{where}.tool_calls", str(calls)[:40],
                                 "give a list of tool-call objects or null")
    n = len(content)
    for call in calls:
        n += len(json.dumps(call.get("function", call)))
    return n


def tau_program(trajectory: list[dict[str, Any]], tool_s: Iterator[float],
                user_gap_s: float, where: str = "traj") -> Program | None:
    """One tau-bench trajectory as a chain: each assistant message is a call whose prompt is
    every message before it (characters / 4) and whose output is the message itself; the
    trace has no timing, so a call ending in a tool call waits ``next(tool_s)`` seconds and
    one answered by the (LLM-simulated) customer ``user_gap_s``."""
    calls: list[Call] = []
    context = 0  # characters so far
    for k, m in enumerate(trajectory):
        chars = _chars(m, f"{where}[{k}]")
        if m.get("role") == "assistant":
            prompt = _int(max(1, context // CHARS_PER_TOKEN), f"{where}[{k}] prompt tokens")
            out = _int(max(1, chars // CHARS_PER_TOKEN), f"{where}[{k}] output tokens")
            gap = next(tool_s) if m.get("tool_calls") else user_gap_s
            calls.append(Call(prompt, out, (len(calls) - 1,) if calls else (), gap))
        context += chars
    if not calls:
        return None
    last = calls[-1]
    calls[-1] = Call(last.num_prompt_tokens, last.num_output_tokens, last.parents, 0.0)
    return Program(0.0, tuple(calls), "tau_bench")


def load_tau_bench(path: str | os.PathLike[str], *, max_programs: int | None,
                   tool_s: Iterator[float], user_gap_s: float = 0.0) -> list[Program]:
    """The trajectories of a tau-bench ``historical_trajectories`` JSON file as programs."""
    data = read_json(path, "tau-bench trajectories")
    if not isinstance(data, list):
        raise FleetsimInputError(os.fspath(path), type(data).__name__,
                                 "give a tau-bench historical_trajectories JSON list")
    out = []
    for i, run in enumerate(data):
        if max_programs is not None and len(out) >= max_programs:
            break
        traj = run.get("traj") if isinstance(run, dict) else None
        if not isinstance(traj, list):
            raise FleetsimInputError(f"{os.fspath(path)}[{i}].traj", str(traj)[:40],
                                     "each run needs its traj list of chat messages")
        p = tau_program(traj, tool_s, user_gap_s, f"{os.fspath(path)}[{i}].traj")
        if p is not None:
            out.append(p)
    if not out:
        raise FleetsimInputError(os.fspath(path), f"{len(data)} runs, no assistant message",
                                 "give a tau-bench historical_trajectories JSON list whose "
                                 "runs' traj hold assistant messages")
    return out
