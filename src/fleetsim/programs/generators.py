"""Synthetic agent programs: multi-turn chains, tool-use chains, LATS trees, map-reduce and a
mix of the four. Each generator's parameters are a frozen dataclass with cited defaults.

Token counts: a call's prompt is its first parent's context (prompt + output) plus new text
(the tool result and the next message); ``dag.assign_hash_ids`` then shares the parent's
blocks. Sources of the defaults (public datasets and papers; the percentiles of the tau-bench
and PolyTrace files are our own statistics over those public files):

- chat turns: prompt and output lengths resampled from the embedded ShareGPT lengths (the
  etalon ShareGPT sample, Llama-2 tokenizer); turns per conversation geometric with mean 3.95
  (the GitHub Copilot coding-agent dataset card in ``Azure/AzurePublicDataset``, Liu et al.,
  arXiv 2608.00101: 3.95 turns per session);
- tool-use chains (BFCL/tau-bench-like): LLM calls per chain geometric with mean 11 (tau-bench,
  ``sierra-research/tau-bench`` ``historical_trajectories/gpt-4o-airline.json``, MIT:
  assistant calls p50 11), system prompt 1,539 tokens (6,155 characters / 4), each step's new
  text lognormal with median 167 tokens (tool result p50 667 characters / 4), outputs lognormal
  with median 53 tokens (assistant message p50 213 characters / 4);
- tool latency: lognormal, median 0.5 s and p90 1.4 s (Heddle, arXiv 2603.28101: 0.4-1.4 s for
  code, search and math tools, from a secondary summary of the paper; Search-R1's p50 0.16 /
  p90 1.13 s in PolyTrace, ``Zhou-jiecheng/PolyTrace``
  ``search_r1/profile/multiturn_workload_log/``, arXiv 2509.25279);
- LATS: 5 children per expansion (LATS, Zhou et al. 2023, n = 5 on HotpotQA), depth 3 (our
  choice, to keep a tree near 16 calls), each child followed by an environment step;
- map-reduce: fan-out 8 (the Copilot card's 7.83 LLM calls per turn), one reducer.
Lognormal shapes (the sigma of every length) are our assumption where a p90 is not published.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fleetsim.programs.dag import Call, Program, check_program
from fleetsim.workloads.distributions import Empirical

_SHAREGPT = "embedded:sharegpt_lengths"
SIGMA_TOOL = float(np.log(1.4 / 0.5) / 1.2816)  # lognormal with median 0.5 s and p90 1.4 s


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainArgs:
    """Multi-turn chat chains (ShareGPT-like): each turn extends the conversation."""

    mean_turns: float = 3.95
    """Mean turns per conversation, geometric (Copilot dataset card: 3.95 per session)."""
    max_turns: int = 16
    """Cap on turns (keeps contexts within the model's window)."""
    max_turn_tokens: int = 1024
    """Resample only ShareGPT prompt/output lengths up to this (vLLM's benchmark filter)."""
    gap_s: float = 0.0
    """Seconds between a reply and the next user turn (0: back to back, as HexAGenT's
    ShareGPT workflows)."""

    def __post_init__(self) -> None:
        if not self.mean_turns >= 1 or self.max_turns < 1 or self.max_turn_tokens < 1:
            raise ValueError("mean_turns must be >= 1, max_turns and max_turn_tokens >= 1")
        if not self.gap_s >= 0:
            raise ValueError(f"gap_s must be >= 0 seconds, got {self.gap_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepArgs:
    """The lengths and tool times of tool-use steps, shared by tool chains, LATS trees and
    map-reduce (tau-bench-like; each generator adds its shape)."""

    system_tokens: int = 1539
    """First prompt: the system prompt and tool schemas (tau-bench: 6,155 characters)."""
    step_tokens_median: float = 167.0
    """Median new tokens per step: the tool result (tau-bench p50 667 characters)."""
    output_tokens_median: float = 53.0
    """Median output tokens (tau-bench assistant message p50 213 characters)."""
    length_sigma: float = 0.8
    """Lognormal sigma of the lengths (our assumption)."""
    tool_median_s: float = 0.5
    """Median tool latency (Heddle: 0.4-1.4 s)."""
    tool_sigma: float = SIGMA_TOOL
    """Lognormal sigma of tool latency (p90 1.4 s)."""

    def __post_init__(self) -> None:
        if self.system_tokens < 1:
            raise ValueError(f"system_tokens must be >= 1, got {self.system_tokens}")
        for name in ("step_tokens_median", "output_tokens_median", "tool_median_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not (self.length_sigma >= 0 and self.tool_sigma >= 0):
            raise ValueError("length_sigma and tool_sigma must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolChainArgs(StepArgs):
    """Tool-use chains (BFCL multi-turn / tau-bench-like): call, tool, call, ..."""

    mean_calls: float = 11.0
    """Mean LLM calls per chain, geometric (tau-bench airline: p50 11)."""
    max_calls: int = 30
    """Cap (tau-bench airline: at most 30)."""

    def __post_init__(self) -> None:
        StepArgs.__post_init__(self)
        if not self.mean_calls >= 1 or self.max_calls < 1:
            raise ValueError("mean_calls >= 1 and max_calls >= 1 required")


@dataclass(frozen=True, slots=True, kw_only=True)
class LatsArgs(StepArgs):
    """LATS tree search: from the selected node, ``breadth`` children in parallel, each
    followed by an environment step; the next level expands one of them (chosen at run
    time, here at random), ``depth`` levels. Lengths and tools as the tool-use chain's."""

    breadth: int = 5
    """Children per expansion (LATS: n = 5)."""
    depth: int = 3
    """Expansion levels (our choice: 1 + 5 x 3 = 16 calls)."""

    def __post_init__(self) -> None:
        StepArgs.__post_init__(self)
        if self.breadth < 1 or self.depth < 1:
            raise ValueError(f"breadth and depth must be >= 1, got {self.breadth}, {self.depth}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MapReduceArgs(StepArgs):
    """Fan-out/fan-in: a planner call, ``fan_out`` workers on its context (each with a tool
    call), one reducer over all of them. Lengths and tools as the tool-use chain's."""

    fan_out: int = 8
    """Workers (Copilot card: 7.83 LLM calls per turn)."""

    def __post_init__(self) -> None:
        StepArgs.__post_init__(self)
        if self.fan_out < 1:
            raise ValueError(f"fan_out must be >= 1, got {self.fan_out}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedArgs:
    """An equal mix of the four shapes, each with its defaults."""

    weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    """Shares of chain, tool_chain, lats, map_reduce."""

    def __post_init__(self) -> None:
        if len(self.weights) != 4 or min(self.weights) < 0 or sum(self.weights) <= 0:
            raise ValueError(f"weights must be 4 shares >= 0 with a positive sum, got "
                             f"{self.weights}")


class _Lengths:
    """Lognormal lengths and tool times of one generator."""

    def __init__(self, args: StepArgs, rng: np.random.Generator) -> None:
        self.a, self.rng = args, rng

    def step(self) -> int:
        return max(1, int(self.a.step_tokens_median * self.rng.lognormal(0, self.a.length_sigma)))

    def output(self) -> int:
        return max(1, int(self.a.output_tokens_median
                          * self.rng.lognormal(0, self.a.length_sigma)))

    def tool(self) -> float:
        return float(self.a.tool_median_s * self.rng.lognormal(0, self.a.tool_sigma))


def _geometric(rng: np.random.Generator, mean: float, cap: int) -> int:
    return int(min(cap, rng.geometric(1.0 / mean)))


def _context(call: Call) -> int:
    return call.num_prompt_tokens + call.num_output_tokens


def chain(args: ChainArgs, rng: np.random.Generator, _cache: dict[str, Empirical] = {}  # noqa: B006
          ) -> list[Call]:
    if "p" not in _cache:  # one read of the embedded file per process
        _cache["p"] = Empirical.from_file(_SHAREGPT, "num_prefill_tokens")
        _cache["o"] = Empirical.from_file(_SHAREGPT, "num_decode_tokens")
    p = _cache["p"].values[_cache["p"].values <= args.max_turn_tokens]
    o = _cache["o"].values[_cache["o"].values <= args.max_turn_tokens]
    calls: list[Call] = []
    for t in range(_geometric(rng, args.mean_turns, args.max_turns)):
        new = int(p[rng.integers(len(p))])
        out = int(o[rng.integers(len(o))])
        prompt = new + (_context(calls[-1]) if calls else 0)
        calls.append(Call(prompt, out, (t - 1,) if t else (), args.gap_s))
    return calls


def tool_chain(args: ToolChainArgs, rng: np.random.Generator) -> list[Call]:
    ln = _Lengths(args, rng)
    calls: list[Call] = []
    for t in range(_geometric(rng, args.mean_calls, args.max_calls)):
        prompt = (_context(calls[-1]) + ln.step()) if calls else args.system_tokens
        calls.append(Call(prompt, ln.output(), (t - 1,) if t else (), ln.tool()))
    return calls


def lats(args: LatsArgs, rng: np.random.Generator) -> list[Call]:
    ln = _Lengths(args, rng)
    calls = [Call(args.system_tokens, ln.output(), (), ln.tool())]
    selected = 0
    for _ in range(args.depth):
        first = len(calls)
        for _ in range(args.breadth):
            prompt = _context(calls[selected]) + ln.step()
            calls.append(Call(prompt, ln.output(), (selected,), ln.tool()))
        selected = first + int(rng.integers(args.breadth))
    return calls


def map_reduce(args: MapReduceArgs, rng: np.random.Generator) -> list[Call]:
    ln = _Lengths(args, rng)
    calls = [Call(args.system_tokens, ln.output(), (), 0.0)]
    for _ in range(args.fan_out):
        calls.append(Call(_context(calls[0]) + ln.step(), ln.output(), (0,), ln.tool()))
    workers = tuple(range(1, args.fan_out + 1))
    reduce_prompt = _context(calls[1]) + sum(c.num_output_tokens for c in calls[2:]) + ln.step()
    calls.append(Call(reduce_prompt, ln.output(), workers, 0.0))
    return calls


GENERATORS: dict[str, tuple[type, Callable[..., list[Call]]]] = {
    "chain": (ChainArgs, chain),
    "tool_chain": (ToolChainArgs, tool_chain),
    "lats": (LatsArgs, lats),
    "map_reduce": (MapReduceArgs, map_reduce),
}
"""Generator name -> (its parameters, the function drawing one program's calls)."""
MIXED = "mixed"


def generate(name: str, args: object, arrival_s: list[float], rng: np.random.Generator
             ) -> list[Program]:
    """One program per arrival time from generator ``name`` (or ``mixed``) with ``args``."""
    if name == MIXED:
        assert isinstance(args, MixedArgs)
        names = list(GENERATORS)
        w = np.asarray(args.weights, dtype=np.float64)
        picks = rng.choice(len(names), size=len(arrival_s), p=w / w.sum())
        defaults = {n: GENERATORS[n][0]() for n in names}
        out = []
        for t, k in zip(arrival_s, picks.tolist(), strict=True):
            n = names[k]
            out.append(Program(t, tuple(GENERATORS[n][1](defaults[n], rng)), n))
    else:
        draw = GENERATORS[name][1]
        out = [Program(t, tuple(draw(args, rng)), name) for t in arrival_s]
    for i, p in enumerate(out):
        check_program(p.calls, f"programs[{i}]")
    return out
