"""A GRPO batch of multi-turn agentic trajectories (LLM turn, tool call, next turn, ...) as
program chains, for agentic RL rollout (Heddle, arXiv 2603.28101).

Each prompt draws one logged GRPO group of PolyTrace's DAPO Qwen2.5-32B run (the embedded
``polytrace_grpo_groups.csv``, shared with ``rl.lengths``); each of its samples is a
trajectory whose turns draw their output lengths from that group's logged lengths (with
replacement), scaled by ``length_scale``, so a hard prompt's samples are long together. Turns
per trajectory follow PolyTrace's Search-R1 multi-turn tool RL log (1 turn 7.7%, 2 43%, 3 34%,
4 11%, 5 5%; our count over ``search_r1/profile/multiturn_workload_log/`` of
``Zhou-jiecheng/PolyTrace``, Apache-2.0, arXiv 2509.25279). Between turns a tool runs
(lognormal, median 0.5 s, p90 1.4 s: Heddle's 0.4-1.4 s, the ``tool_chain`` generator's law)
and its result joins the context (lognormal, median 507 tokens, p99 1,453: Search-R1's tool
results). A turn's prompt is the whole context so far, so its KV extends the previous turn's;
a trajectory ends at its last turn or when its context reaches ``max_context_tokens`` (the
last turn is cut there: a truncated rollout).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.memo import BoundedMemo
from fleetsim.programs.dag import Call, Program
from fleetsim.programs.generators import SIGMA_TOOL
from fleetsim.rl.lengths import polytrace_groups

# PolyTrace Search-R1 (Qwen2.5-7B, 2,048 trajectories per step): share of trajectories by
# number of LLM turns, 1 to 5 (our count over the public PolyTrace logs
# Zhou-jiecheng/PolyTrace search_r1/profile/multiturn_workload_log/, Apache-2.0).
SEARCH_R1_TURN_SHARES = (0.077, 0.43, 0.34, 0.11, 0.05)
TOOL_RESULT_MEDIAN_TOKENS = 507.0  # Search-R1 tool result p50
TOOL_RESULT_SIGMA = math.log(1453 / 507) / 2.3263  # lognormal through p50 507 and p99 1,453


@dataclass(frozen=True, slots=True, kw_only=True)
class TrajectoryArgs:
    """The shape of one rollout batch of agentic trajectories."""

    num_prompts: int = 64
    """Prompts per batch."""
    samples_per_prompt: int = 16
    """GRPO group size (Heddle: 16 samples per prompt)."""
    length_run: str = "dapo-qwen2.5-32b"
    """PolyTrace run whose GRPO groups give the turn lengths."""
    length_scale: float = 2.0
    """Multiply each turn's logged length: 40,960 / 20,480, Heddle's maximum over DAPO's (the
    convention of the StreamRL reproduction: the experiment's cap plays the run's)."""
    turn_shares: tuple[float, ...] = SEARCH_R1_TURN_SHARES
    """Share of trajectories with 1, 2, ... turns."""
    tool_median_s: float = 0.5
    """Median tool latency, seconds (Heddle: 0.4-1.4 s)."""
    tool_sigma: float = SIGMA_TOOL
    """Lognormal sigma of tool latency (p90 1.4 s)."""
    max_context_tokens: int = 40960
    """A trajectory's context cap (Heddle: 40K max tokens; Qwen3's 40,960)."""
    max_turn_tokens: int | None = None
    """Cap on each turn's output (a generate call's ``max_tokens``: an RL job's
    ``max_response_tokens``); None: only the context cap."""

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.samples_per_prompt < 1:
            raise ValueError(f"num_prompts and samples_per_prompt must be >= 1, got "
                             f"{self.num_prompts} and {self.samples_per_prompt}")
        if not self.length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        if not self.turn_shares or any(not s >= 0 for s in self.turn_shares) or not math.isclose(
                sum(self.turn_shares), 1.0, abs_tol=0.01):
            raise ValueError(f"turn_shares must be >= 0 and sum to 1 (within 0.01: published "
                             f"shares are rounded; they are normalised), got "
                             f"{self.turn_shares}")
        if not self.tool_median_s >= 0 or not self.tool_sigma >= 0:
            raise ValueError("tool_median_s and tool_sigma must be >= 0")
        if self.max_context_tokens < 2:
            raise ValueError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {self.max_turn_tokens}")


@dataclass(frozen=True, slots=True)
class TrajectoryBatch:
    """A batch: one program (a chain of turns) per trajectory, all arriving at 0."""

    programs: tuple[Program, ...]
    group: NDArray[np.int64]
    """Prompt index of each trajectory."""
    output_tokens: NDArray[np.int64]
    """Tokens each trajectory generates over all its turns (what a predictor predicts)."""


# (args, the generator's state before the draw) -> (the batch, the state after it): a batch
# is a function of exactly these, so a process's simulations share it (the Heddle entry draws
# the same batch 39 times: each rollout's and each resource manager's history); bounded, oldest
# dropped first. Shared batches are immutable (frozen programs, read-only arrays).
_BATCHES: BoundedMemo[tuple[object, ...], tuple[TrajectoryBatch, Mapping[str, Any]]] = (
    BoundedMemo(16))


def sample_batch(args: TrajectoryArgs, rng: np.random.Generator) -> TrajectoryBatch:
    """Draw one batch of ``num_prompts * samples_per_prompt`` trajectories; ``rng`` is left
    where the draw leaves it, whether the batch is drawn or is the process's earlier draw of
    the same ``args`` from the same state."""
    bit_generator = rng.bit_generator
    key = (args, _frozen(bit_generator.state))
    kept = _BATCHES.get(key)
    if kept is not None:
        bit_generator.state = kept[1]
        return kept[0]
    batch = _draw_batch(args, rng)
    batch.group.flags.writeable = False
    batch.output_tokens.flags.writeable = False
    _BATCHES.put(key, (batch, bit_generator.state))
    return batch


def _frozen(state: object) -> object:
    """A bit generator's state (nested dicts of ints, strings and arrays) as a hashable."""
    if isinstance(state, dict):
        return tuple((k, _frozen(v)) for k, v in sorted(state.items()))
    if isinstance(state, np.ndarray):
        return state.dtype.str, state.shape, state.tobytes()
    return state


def _draw_batch(args: TrajectoryArgs, rng: np.random.Generator) -> TrajectoryBatch:
    groups = polytrace_groups(args.length_run)
    shares = np.asarray(args.turn_shares, dtype=np.float64)
    shares = shares / shares.sum()
    programs: list[Program] = []
    group_of: list[int] = []
    outputs: list[int] = []
    for p in range(args.num_prompts):
        prompt, lens = groups[int(rng.integers(0, len(groups)))]
        logged = np.asarray(lens, dtype=np.float64) * args.length_scale
        for _ in range(args.samples_per_prompt):
            turns = 1 + int(rng.choice(len(shares), p=shares))
            out = np.maximum(1, np.rint(rng.choice(logged, size=turns))).astype(np.int64)
            if args.max_turn_tokens is not None:  # after the draws: the streams stay put
                out = np.minimum(out, args.max_turn_tokens)
            tool_s = rng.lognormal(math.log(max(args.tool_median_s, 1e-12)), args.tool_sigma,
                                   size=turns) if args.tool_median_s > 0 else np.zeros(turns)
            result = np.maximum(1, np.rint(rng.lognormal(
                math.log(TOOL_RESULT_MEDIAN_TOKENS), TOOL_RESULT_SIGMA, size=turns)))
            calls = _chain(int(prompt), out.tolist(), tool_s.tolist(),
                           result.astype(np.int64).tolist(), args.max_context_tokens)
            programs.append(Program(arrival_s=0.0, calls=tuple(calls), kind="trajectory"))
            group_of.append(p)
            outputs.append(sum(c.num_output_tokens for c in calls))
    return TrajectoryBatch(tuple(programs), np.asarray(group_of, dtype=np.int64),
                           np.asarray(outputs, dtype=np.int64))


def _chain(prompt: int, outputs: list[int], tool_s: list[float], results: list[int],
           max_context: int) -> list[Call]:
    """Turns as a chain: each prompt is the context so far (previous prompt, its output and
    the tool's result); cut where the context reaches ``max_context``."""
    calls: list[Call] = []
    context = min(prompt, max_context - 1)
    for k, out in enumerate(outputs):
        out = min(out, max_context - context)
        last = k == len(outputs) - 1 or context + out + results[k] >= max_context
        calls.append(Call(num_prompt_tokens=context, num_output_tokens=out,
                          parents=(k - 1,) if k else (),
                          tool_s=0.0 if last else float(tool_s[k])))
        if last:
            break
        context += out + results[k]
    return calls
