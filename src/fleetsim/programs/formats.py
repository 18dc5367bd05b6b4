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
import os
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_bytes, read_text
from fleetsim.programs.dag import Call, Program, check_program, topological_order

_CALL_KEYS = {"id", "prompt_tokens", "output_tokens", "parents", "tool_s", "hash_ids"}


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise FleetsimInputError(where, value, "give a whole number of tokens")
    return int(value)


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FleetsimInputError(where, value, "give a number of seconds")
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
        if hash_ids is not None and (not isinstance(hash_ids, list) or not all(
                isinstance(h, int) and not isinstance(h, bool) for h in hash_ids)):
            raise FleetsimInputError(f"{here}.hash_ids", str(hash_ids)[:40],
                                     "give a list of integers")
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
        pin, pout = int(r["in"]), max(1, int(r["out"]))
        if pin < 1 or pin + pout > max_context_tokens:
            return None
        calls.append(Call(pin, pout, parents, 0.0, tuple(int(h) for h in r["hash_ids"])))
        return len(calls) - 1

    def set_tool(i: int, tool_s: float) -> None:
        c = calls[i]
        calls[i] = Call(c.num_prompt_tokens, c.num_output_tokens, c.parents, tool_s, c.hash_ids)

    spawned = False  # the last top-level call spawned sub-agents (its tool time is 0)
    for n_sub, r in enumerate(conv.get("requests", [])):
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


def iter_weka(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(member name, conversation) of a ``weka_claude_code_traces.tar.xz`` or a directory of
    ``trace_*.json`` files, in name order."""
    p = os.fspath(path)
    if os.path.isdir(p):
        for name in sorted(os.listdir(p)):
            if name.endswith(".json"):
                yield name, json.loads(read_text(os.path.join(p, name), "weka trace"))
        return
    data = read_bytes(p, "weka traces")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = sorted((m for m in tar.getmembers() if m.name.endswith(".json")),
                             key=lambda m: m.name)
            for m in members:
                f = tar.extractfile(m)
                if f is not None:
                    yield m.name, json.loads(f.read())
    except tarfile.TarError as err:
        raise FleetsimInputError(p, "not a tar archive", f"give the weka .tar.xz or a "
                                 f"directory of trace_*.json ({err})") from None


def load_weka(path: str | os.PathLike[str], *, max_programs: int | None,
              max_context_tokens: int) -> list[Program]:
    """Up to ``max_programs`` conversations of the WEKA traces as programs (arrival 0: pair
    them with an arrival process)."""
    out: list[Program] = []
    for name, conv in iter_weka(path):
        if max_programs is not None and len(out) >= max_programs:
            break
        p = weka_program(conv, max_context_tokens, f"{os.fspath(path)}:{name}")
        if p is not None:
            out.append(p)
    if not out:
        raise FleetsimInputError(os.fspath(path), "no conversation fits",
                                 f"raise the model's context (now {max_context_tokens} tokens)")
    return out


# ---- tau-bench trajectories (sierra-research/tau-bench, MIT) ------------------------------
CHARS_PER_TOKEN = 4  # the common ~4 characters per English token rule of thumb


def _chars(message: dict[str, Any]) -> int:
    n = len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        n += len(json.dumps(call.get("function", call)))
    return n


def tau_program(trajectory: list[dict[str, Any]], tool_s: Iterator[float],
                user_gap_s: float) -> Program | None:
    """One tau-bench trajectory as a chain: each assistant message is a call whose prompt is
    every message before it (characters / 4) and whose output is the message itself; the
    trace has no timing, so a call ending in a tool call waits ``next(tool_s)`` seconds and
    one answered by the (LLM-simulated) customer ``user_gap_s``."""
    calls: list[Call] = []
    context = 0  # characters so far
    for m in trajectory:
        chars = _chars(m)
        if m.get("role") == "assistant":
            prompt = max(1, context // CHARS_PER_TOKEN)
            out = max(1, chars // CHARS_PER_TOKEN)
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
    data = json.loads(read_text(path, "tau-bench trajectories"))
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
        p = tau_program(traj, tool_s, user_gap_s)
        if p is not None:
            out.append(p)
    return out
