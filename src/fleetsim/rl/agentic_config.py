"""``[rl.generation.agentic]``: the options of the agentic generation source (multi-turn
tool-using trajectories, Heddle's mechanisms; docs/rl.md). What the RL job already says (the
actor, the generation pool's GPUs and TP, its engine, prompts and samples per step, the length
run and scale, the seed) is not repeated here: the source takes it from the ``[rl]`` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from fleetsim.programs.generators import SIGMA_TOOL
from fleetsim.rl.resource_manager import TP_CHOICES
from fleetsim.rl.trajectories import SEARCH_R1_TURN_SHARES, TrajectoryArgs
from fleetsim.rl.trajectory_predictor import PredictorConfig

SCHEDULINGS = ("fcfs", "progressive_priority")
PLACEMENTS = ("least_requests", "sticky", "sticky_skew", "heddle")


class RolloutChoices(Protocol):
    """The system's choices, as both the ``[rl.generation.agentic]`` table and one rollout's
    config hold them."""

    @property
    def scheduling(self) -> str: ...
    @property
    def placement(self) -> str: ...
    @property
    def migration(self) -> bool: ...
    @property
    def resource_manager(self) -> bool: ...
    @property
    def split(self) -> tuple[int, ...]: ...
    @property
    def tp_choices(self) -> tuple[int, ...]: ...
    @property
    def anneal_steps(self) -> int: ...
    @property
    def split_scoring(self) -> str: ...
    @property
    def num_replayed(self) -> int: ...
    @property
    def preemption_mode(self) -> str: ...


def check_rollout_choices(c: RolloutChoices) -> None:
    """Raise ``ValueError`` naming the field for a choice no rollout can run: one check for the
    RL job's table and the rollout's own config, which hold the same choices."""
    if c.scheduling not in SCHEDULINGS:
        raise ValueError(f"scheduling must be one of {', '.join(SCHEDULINGS)}, got "
                         f"{c.scheduling!r}")
    if c.placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got "
                         f"{c.placement!r}")
    if c.migration and c.placement != "heddle":
        raise ValueError(f"migration needs placement heddle (its bands say where a "
                         f"trajectory belongs), got placement {c.placement!r}")
    if c.resource_manager and c.placement != "heddle":
        raise ValueError(f"resource_manager needs placement heddle (its DP assigns the "
                         f"trajectories to the workers), got placement {c.placement!r}")
    if c.split and (c.resource_manager or c.placement != "heddle"):
        raise ValueError(f"split {list(c.split)} fixes the workers: it needs placement "
                         f"heddle and resource_manager off")
    if not c.tp_choices or any(t not in TP_CHOICES for t in c.tp_choices):
        raise ValueError(f"tp_choices must be some of {list(TP_CHOICES)} (powers of two "
                         f"within a node), got {list(c.tp_choices)}")
    if c.anneal_steps < 0:
        raise ValueError(f"anneal_steps must be >= 0, got {c.anneal_steps}")
    if c.split_scoring not in ("dp", "replay"):
        raise ValueError(f"split_scoring must be dp or replay, got {c.split_scoring!r}")
    if not 1 <= c.num_replayed <= 64:
        raise ValueError(f"num_replayed must be in 1..64 splits, got {c.num_replayed}")
    if c.preemption_mode not in ("recompute", "swap"):
        raise ValueError(f"preemption_mode must be recompute or swap, got "
                         f"{c.preemption_mode!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgenticConfig:
    """How each step's agentic rollout runs: the trajectories' turns and tools, and the
    system (Heddle, arXiv 2603.28101, and its baselines slime, verl, verl*)."""

    scheduling: str = "fcfs"
    """fcfs | progressive_priority: the order a worker serves queued steps in."""
    placement: str = "least_requests"
    """least_requests (slime) | sticky (verl) | sticky_skew (verl*) | heddle (presorted DP)."""
    migration: bool = False
    """Move a mispredicted trajectory's KV to its new worker during its tool wait (needs
    placement heddle and the engine's prefix cache, which holds the KV that moves)."""
    resource_manager: bool = False
    """Heddle's resource manager: split the generation pool's GPUs into workers of different
    TP (tp_choices) by simulated annealing from every worker at generation.tp, sized for
    the previous step's lengths (needs placement heddle)."""
    tp_choices: tuple[int, ...] = TP_CHOICES
    """TPs the resource manager may give a worker (those the actor does not fit at are
    skipped)."""
    anneal_steps: int = 200
    """Moves the resource manager's annealing tries."""
    split_scoring: str = "dp"
    """dp (the placement DP's predicted slowest worker) | replay (the best-scored splits
    replay the previous rollout; the soonest finish wins)."""
    num_replayed: int = 3
    """replay: how many of the DP's best splits are replayed besides the start and its
    choice."""
    split: tuple[int, ...] = ()
    """Workers' TPs, highest first, fixed for every step (placement heddle, no resource
    manager); empty: every worker at generation.tp, or the resource manager's split."""
    preemption_mode: str = "recompute"
    """recompute | swap (a preempted step's KV to host memory, generation.engine.
    swap_space_gib, and back)."""
    skew_threshold: float = 1.5
    """sticky_skew: load over mean above which a step leaves its sticky worker."""
    turn_shares: tuple[float, ...] = SEARCH_R1_TURN_SHARES
    """Share of trajectories with 1, 2, ... LLM turns (PolyTrace Search-R1)."""
    tool_median_s: float = 0.5
    """Median tool latency between turns, seconds (Heddle: 0.4-1.4 s); 0: no waits."""
    tool_sigma: float = SIGMA_TOOL
    """Lognormal sigma of tool latency (p90 1.4 s)."""
    max_context_tokens: int = 40960
    """A trajectory's context cap (Heddle: 40K; Qwen3's 40,960); the last turn is cut there."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The trajectory-length predictor's quality per finished turn."""

    def __post_init__(self) -> None:
        check_rollout_choices(self)
        # The trajectory fields' own checks (shares summing to 1, latencies >= 0).
        self.trajectory_args(1, 1, "dapo-qwen2.5-32b", 1.0, None)

    def trajectory_args(self, num_prompts: int, samples_per_prompt: int, length_run: str,
                        length_scale: float, max_turn_tokens: int | None) -> TrajectoryArgs:
        """The batch shape, the job's counts and lengths with this table's turns and tools."""
        return TrajectoryArgs(num_prompts=num_prompts, samples_per_prompt=samples_per_prompt,
                              length_run=length_run, length_scale=length_scale,
                              turn_shares=self.turn_shares, tool_median_s=self.tool_median_s,
                              tool_sigma=self.tool_sigma,
                              max_context_tokens=self.max_context_tokens,
                              max_turn_tokens=max_turn_tokens)
