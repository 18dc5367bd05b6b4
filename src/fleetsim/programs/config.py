"""The ``[programs]`` table of a run config: where programs come from and when they arrive.

    [programs]
    generator = "tool_chain"        # chain | tool_chain | lats | map_reduce | mixed | jsonl | weka
    num_programs = 200
    arrival = "poisson"             # poisson | constant | trace (the file's arrival_s)
    rate_per_s = 2.0
    args = { mean_calls = 8 }       # the generator's parameters (docs/programs.md)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.programs.dag import Program
from fleetsim.programs.formats import load_jsonl, load_tau_bench, load_weka
from fleetsim.programs.generators import (
    GENERATORS,
    MIXED,
    SIGMA_TOOL,
    MixedArgs,
    generate,
)
from fleetsim.programs.tools import resample_tool_times, tool_latencies

FILE_KINDS = ("jsonl", "weka", "tau_bench")
PROGRAM_ARRIVALS = ("poisson", "constant", "trace")
TOOL_KV = ("drop", "keep", "offload")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramWorkloadConfig:
    """Programs of LLM calls and tool waits (replaces ``[workload]`` when set)."""

    generator: str = "mixed"
    """chain | tool_chain | lats | map_reduce | mixed | jsonl (a file of programs) | weka
    (the WEKA Claude Code traces) | tau_bench (tau-bench trajectories)."""
    path: str | None = None
    """jsonl / weka / tau_bench: the file (weka: the .tar.xz or a directory of
    trace_*.json; tau_bench: a historical_trajectories JSON)."""
    num_programs: int | None = 100
    """Programs (files: the first ones; None: all of the file)."""
    arrival: str = "poisson"
    """poisson | constant (fixed rate) | trace (each program's arrival_s, jsonl only)."""
    rate_per_s: float = 1.0
    """Programs per second (poisson, constant)."""
    hash_block_tokens: int = 64
    """Prefix-hash block of the programs' prompts (the WEKA traces' 64; a multiple of
    engine.block_size). Smaller blocks reuse more of a parent's context, at more cost."""
    args: Mapping[str, Any] = field(default_factory=dict)
    """The generator's parameters (its dataclass in fleetsim.programs.generators)."""
    tool_trace: str | None = None
    """Resample every tool time from real tool latencies: the agentcgroup_swe traces
    (the ``experiments/*/attempt_1/trace.jsonl`` logs of ``yunwei37/agentcgroup`` on GitHub,
    AgentCgroup, arXiv 2602.09345; GPL-2.0: read from the user's copy, never shipped)."""
    tool_names: tuple[str, ...] = ()
    """With tool_trace: the tool types to draw from (e.g. ["Bash"]; empty: every tool)."""
    tool_kv: str = "drop"
    """A finished call's KV while its program waits on the tool before the next call: drop
    (the engines' default: prompt blocks stay as evictable prefix cache) | keep (pinned on
    the GPU for kv_ttl_s, Continuum) | offload (copied to host memory for kv_ttl_s and
    reloaded when the next call arrives; needs engine.swap_space_gib)."""
    kv_ttl_s: float = 2.0
    """Time-to-live of kept or offloaded KV, seconds (our choice: above the tool_chain
    generator's p90 tool latency, 1.4 s)."""

    def __post_init__(self) -> None:
        known = (*GENERATORS, MIXED, *FILE_KINDS)
        if self.generator not in known:
            raise ValueError(f"programs.generator must be one of {', '.join(known)}, got "
                             f"{self.generator!r}")
        if (self.generator in FILE_KINDS) != (self.path is not None):
            raise ValueError(f"programs.path is needed by generator = jsonl, weka or tau_bench "
                             f"and only by them (generator = {self.generator!r}, "
                             f"path = {self.path!r})")
        if self.arrival not in PROGRAM_ARRIVALS:
            raise ValueError(f"programs.arrival must be one of {', '.join(PROGRAM_ARRIVALS)}, "
                             f"got {self.arrival!r}")
        if self.arrival == "trace" and self.generator != "jsonl":
            raise ValueError("programs.arrival = \"trace\" takes arrival_s from a jsonl file; "
                             "use poisson or constant with other generators")
        if self.num_programs is not None and not 1 <= self.num_programs <= 10_000_000:
            raise ValueError(f"programs.num_programs must be in [1, 1e7], got "
                             f"{self.num_programs}")
        if self.num_programs is None and self.generator not in FILE_KINDS:
            raise ValueError("programs.num_programs may be unset only for a file")
        if not 1e-6 <= self.rate_per_s <= 1e6:
            raise ValueError(f"programs.rate_per_s must be in [1e-6, 1e6], got "
                             f"{self.rate_per_s}")
        if self.hash_block_tokens < 1:
            raise ValueError(f"programs.hash_block_tokens must be >= 1, got "
                             f"{self.hash_block_tokens}")
        if self.args and self.generator in FILE_KINDS:
            raise ValueError("programs.args is for generators; a file takes none")
        if self.tool_names and self.tool_trace is None:
            raise ValueError("programs.tool_names needs programs.tool_trace (the traces to "
                             "draw the tools' latencies from)")
        if self.tool_kv not in TOOL_KV:
            raise ValueError(f"programs.tool_kv must be one of {', '.join(TOOL_KV)}, got "
                             f"{self.tool_kv!r}")
        if not 0.0 <= self.kv_ttl_s <= 1e6:
            raise ValueError(f"programs.kv_ttl_s must be in [0, 1e6] s, got {self.kv_ttl_s}")
        generator_args(self)  # unknown or bad parameters fail here


def generator_args(cfg: ProgramWorkloadConfig) -> Any:
    """The generator's parameter dataclass built from ``cfg.args``."""
    if cfg.generator in FILE_KINDS:
        return None
    cls = MixedArgs if cfg.generator == MIXED else GENERATORS[cfg.generator][0]
    data = dict(cfg.args)
    if "weights" in data:
        data["weights"] = tuple(data["weights"])
    try:
        return cls(**data)
    except TypeError as err:
        raise ValueError(f"programs.args: {err}; see docs/programs.md for "
                         f"{cfg.generator}'s parameters") from None


def arrival_times(cfg: ProgramWorkloadConfig, n: int, rng: np.random.Generator) -> list[float]:
    """Program arrival times, seconds from 0."""
    if cfg.arrival == "constant":
        return (np.arange(n, dtype=np.float64) / cfg.rate_per_s).tolist()
    gaps = rng.exponential(1.0 / cfg.rate_per_s, size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


def build_programs(cfg: ProgramWorkloadConfig, rng: np.random.Generator,
                   max_context_tokens: int) -> list[Program]:
    """The programs of ``cfg``, arrival times set (seeded by ``rng``)."""
    if cfg.generator in GENERATORS or cfg.generator == MIXED:
        assert cfg.num_programs is not None
        programs = generate(cfg.generator, generator_args(cfg),
                            arrival_times(cfg, cfg.num_programs, rng), rng)
    else:
        assert cfg.path is not None
        if cfg.generator == "jsonl":
            programs = load_jsonl(cfg.path)[:cfg.num_programs]
        elif cfg.generator == "tau_bench":
            # No timing in the trace: tool calls take the tool_chain generator's lognormal
            # latency (median 0.5 s, p90 1.4 s: Heddle), drawn from the run's seed.
            tools = (float(0.5 * rng.lognormal(0, SIGMA_TOOL)) for _ in iter(int, 1))
            programs = load_tau_bench(cfg.path, max_programs=cfg.num_programs, tool_s=tools)
        else:
            programs = load_weka(cfg.path, max_programs=cfg.num_programs,
                                 max_context_tokens=max_context_tokens)
        if cfg.arrival != "trace":
            times = arrival_times(cfg, len(programs), rng)
            programs = [replace(p, arrival_s=t) for p, t in zip(programs, times, strict=True)]
    if cfg.tool_trace is not None:
        programs = resample_tool_times(programs, tool_latencies(cfg.tool_trace),
                                       cfg.tool_names, rng)
    for i, p in enumerate(programs):
        for j, c in enumerate(p.calls):
            if c.num_prompt_tokens + c.num_output_tokens > max_context_tokens:
                raise FleetsimInputError(
                    f"programs[{i}].calls[{j}]",
                    f"{c.num_prompt_tokens} prompt + {c.num_output_tokens} output tokens",
                    f"the model takes at most {max_context_tokens} tokens; shorten the "
                    f"program or pick a longer-context model")
    return programs
