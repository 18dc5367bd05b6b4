"""Tool latencies measured in real agent runs, per tool type, for resampling a program's tool
times: the headless Claude Code runs on SWE-rebench tasks (AgentCgroup, arXiv 2602.09345;
the session logs ``experiments/all_images_{haiku,local}/<task>/attempt_1/trace.jsonl`` of the
GitHub repository ``yunwei37/agentcgroup``).

That set is GPL-2.0: fleetsim never ships or copies it. It is read at run time from the path
the user gives (a ``.tar.xz`` of those logs or the unpacked ``experiments/`` folder); only the
latencies (tool_result timestamp minus tool_use timestamp) are kept in memory.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import read_bytes
from fleetsim.programs.dag import Program


def _session_lines(path: str) -> Iterator[bytes]:
    if os.path.isdir(path):
        for root, _, files in sorted(os.walk(path)):
            for name in sorted(files):
                if name.endswith(".jsonl"):
                    with open(os.path.join(root, name), "rb") as f:
                        yield from f
        return
    try:
        with tarfile.open(fileobj=io.BytesIO(read_bytes(path, "tool traces"))) as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                f = tar.extractfile(m) if m.name.endswith(".jsonl") else None
                if f is not None:
                    yield from f.read().splitlines()
    except tarfile.TarError as err:
        raise FleetsimInputError(path, "not a tar archive", f"give the agentcgroup .tar.xz "
                                 f"or its unpacked folder ({err})") from None


def tool_latencies(path: str | os.PathLike[str]) -> dict[str, list[float]]:
    """Tool name -> latencies in seconds of every tool call of the sessions under ``path``."""
    started: dict[str, tuple[str, datetime]] = {}  # tool_use id -> (name, time)
    out: dict[str, list[float]] = {}
    for line in _session_lines(os.fspath(path)):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        message = event.get("message") if isinstance(event, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or "timestamp" not in event:
            continue
        at = datetime.fromisoformat(event["timestamp"])
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                started[block.get("id", "")] = (str(block.get("name")), at)
            elif block.get("type") == "tool_result":
                use = started.pop(block.get("tool_use_id", ""), None)
                if use is not None and at >= use[1]:
                    out.setdefault(use[0], []).append((at - use[1]).total_seconds())
    if not out:
        raise FleetsimInputError(os.fspath(path), "no tool calls",
                                 "give the agentcgroup_swe traces (tool_use/tool_result events)")
    return out


def resample_tool_times(programs: Sequence[Program], latencies: dict[str, list[float]],
                        tools: Sequence[str], rng: np.random.Generator) -> list[Program]:
    """``programs`` with every non-zero tool time replaced by a latency drawn uniformly from
    the measured calls of ``tools`` (all tools when empty)."""
    names = list(tools) or sorted(latencies)
    unknown = [t for t in names if t not in latencies]
    if unknown:
        raise FleetsimInputError("programs.tool_names", unknown[0],
                                 f"tools in the traces: {', '.join(sorted(latencies))}")
    pool = np.array([x for t in names for x in latencies[t]], dtype=np.float64)
    out = []
    for p in programs:
        calls = tuple(replace(c, tool_s=float(pool[rng.integers(len(pool))])) if c.tool_s > 0
                      else c for c in p.calls)
        out.append(replace(p, calls=calls))
    return out
