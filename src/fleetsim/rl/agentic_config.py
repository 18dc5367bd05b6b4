"""``[rl.generation.agentic]``: the options of the agentic generation source (multi-turn
tool-using trajectories, Heddle's mechanisms; docs/rl.md). What the RL job already says (the
actor, the generation pool's GPUs and TP, its engine, prompts and samples per step, the length
run and scale, the seed) is not repeated here: the source takes it from the ``[rl]`` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetsim.programs.generators import SIGMA_TOOL
from fleetsim.rl.resource_manager import TP_CHOICES
from fleetsim.rl.trajectories import SEARCH_R1_TURN_SHARES, TrajectoryArgs
from fleetsim.rl.trajectory_predictor import PredictorConfig

SCHEDULINGS = ("fcfs", "progressive_priority")
PLACEMENTS = ("least_requests", "sticky", "sticky_skew", "heddle")


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
        if self.scheduling not in SCHEDULINGS:
            raise ValueError(f"scheduling must be one of {', '.join(SCHEDULINGS)}, got "
                             f"{self.scheduling!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got "
                             f"{self.placement!r}")
        for name in ("migration", "resource_manager"):
            if getattr(self, name) and self.placement != "heddle":
                raise ValueError(f"{name} needs placement heddle (its DP assigns "
                                 f"trajectories to workers), got placement {self.placement!r}")
        if self.split and (self.resource_manager or self.placement != "heddle"):
            raise ValueError(f"split {list(self.split)} fixes the workers: it needs placement "
                             f"heddle and resource_manager off")
        if not self.tp_choices or any(t not in TP_CHOICES for t in self.tp_choices):
            raise ValueError(f"tp_choices must be some of {list(TP_CHOICES)}, got "
                             f"{list(self.tp_choices)}")
        if self.anneal_steps < 0:
            raise ValueError(f"anneal_steps must be >= 0, got {self.anneal_steps}")
        if self.split_scoring not in ("dp", "replay"):
            raise ValueError(f"split_scoring must be dp or replay, got {self.split_scoring!r}")
        if not 1 <= self.num_replayed <= 64:
            raise ValueError(f"num_replayed must be in 1..64 splits, got {self.num_replayed}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be recompute or swap, got "
                             f"{self.preemption_mode!r}")
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
