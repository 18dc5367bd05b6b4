"""FastServe's iteration-level preemptive scheduler: skip-join MLFQ with proactive KV swapping.

Wu et al., "FastServe: Iteration-Level Preemptive Scheduling for Large Language Model
Inference", NSDI'26 (arXiv:2305.05920). Defaults follow its public code (LLMServe/FastServe,
``fastserve/scheduler.py``, read only: it has no licence):

- queue k has quantum ``base_quantum_s * quantum_ratio**k`` (code: 0.01 s, threshold 2);
- skip-join: an arriving job joins the first queue whose quantum covers its prefill time at
  batch size 1 (profiled in the code; here asked of the replica's step model);
- after each iteration a job whose attained service at its level exceeds the level's quantum
  is demoted one level (its service at the new level starts from zero);
- every ``starvation_period`` iterations (1,000), a job not run for ``starvation_limit_s``
  (3 s) goes back to the top queue;
- a batch takes jobs from the highest non-empty queue down, at most ``max_batch_size`` (16),
  whole prompts under the step's token budget (2,048 in the paper); jobs left out keep their
  KV on the GPU, paused; no new prefill starts when the host tier is 90% full;
- proactive KV management: keep ``max(max_batch_size, min_free_blocks)`` GPU blocks free by
  swapping out the lowest-priority resident jobs that are not in the batch; when nothing was
  swapped out, swap in host-resident jobs in priority order (at most ``max_batch_size``).

``scheduler = "fcfs"`` (the paper's FastGen-FCFS: the same engine, arrival order) and
``"srpt"`` (oracle remaining output tokens: the upper bound) are the same planner with
another priority. Attained service comes from the engine (``Request.service_s``), and a job's
level lives in ``Request.policy_state``; the planner orders the engine's queues by level
(``order_key``) and names the jobs whose level changed in ``StepPlan.rekey``.

Fast-forward: a plan that only decodes its batch (no prefill, no swap) carries a repeat
rule (``Repeat``, ``StepPlan.repeat_rule``): the engine runs it as an exact window over the
batch, the other resident jobs paused, until a batch job would be demoted (its attained
service summed step by step over the window's end times), the next starvation check, or the
batch's new blocks would break into the free-block reserve; the planner then counts the
steps it did not plan as iterations (``_repeated``). Results equal planning every iteration
bit for bit (``tests/property/test_fastserve_windows.py``).

Differences from the code, by design: a demoted job goes to its new queue by arrival order
(the code pushes it to the front), and preemption happens at iteration boundaries of one GPU
(no pipeline parallelism).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.policies.batching import register_batch
from fleetsim.policies.fastserve_steps import (
    JobState,
    choose_batch,
    decodes_only,
    fcfs_order,
    mlfq_order,
    ran_since_checked,
    steps_before_demotion,
    swap_in_highest,
    swap_out_lowest,
    update_levels,
)
from fleetsim.serving.contract import StepPlan
from fleetsim.serving.request import RUNNING, Request
from fleetsim.serving.views import ReplicaView

SCHEDULERS = ("mlfq", "fcfs", "srpt")
MIN_HOST_FULL_SHARE = 1e-6


def mlfq_key(req: Request, now_s: float) -> tuple[float, ...]:
    """Queue order: level, then arrival (a job not yet seen by the planner: level 0)."""
    state = req.policy_state
    level = state.level if isinstance(state, JobState) else 0
    return (level, req.arrival_s, req.id)


@register_batch("fastserve")
@dataclass(slots=True)
class FastServePlanner:
    """Skip-join MLFQ with proactive swapping (see the module docstring for every rule)."""

    scheduler: str = "mlfq"
    """mlfq (FastServe) | fcfs (the same engine in arrival order) | srpt (oracle lengths)."""
    base_quantum_s: float = 0.01
    """Quantum of the top queue, seconds (code: base_quantum = 0.01)."""
    quantum_ratio: float = 2.0
    """Each queue's quantum over the previous one's (code: threshold = 2)."""
    skip_join: bool = True
    """Join the first queue whose quantum covers the job's prefill time (else queue 0)."""
    starvation_period: int = 1000
    """Iterations between starvation checks (code: 1,000)."""
    starvation_limit_s: float = 3.0
    """A job not run for this long is promoted to the top queue (code: 3 s)."""
    max_batch_size: int = 16
    """Jobs per iteration (the paper: 16, also 64 and 128)."""
    proactive_swap: bool = True
    """Keep free GPU blocks by swapping low-priority jobs out, and swap ahead of need."""
    min_free_blocks: int = 0
    """Free-block reserve floor (code: num_min_free_blocks_threshold); the reserve is
    ``max(max_batch_size, min_free_blocks)``. A reserve that leaves no room to swap a job back
    stops the run with a one-line error naming the argument (the code would hang)."""
    host_full_share: float = 0.9
    """No new prefill starts while the host tier is this full (code: free CPU blocks < 10%);
    in [1e-6, 1]."""
    _iterations: int = field(default=0, init=False, repr=False)
    _prefill_s: dict[int, float] = field(default_factory=dict, init=False, repr=False)
    _quanta: list[float] = field(default_factory=list, init=False, repr=False)
    # The last plan's batch, and ``ReplicaView.num_entered`` when it was planned (None: no
    # plan yet): between starvation checks, only its jobs can have changed level since.
    _batch: list[Request] = field(default_factory=list, init=False, repr=False)
    _num_entered: int | None = field(default=None, init=False, repr=False)

    splits_prompts = False  # whole prompts, as FastServe's engine runs them

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got "
                             f"{self.scheduler!r}")
        if not self.base_quantum_s > 0:
            raise ValueError(f"base_quantum_s must be > 0 seconds, got {self.base_quantum_s}")
        if not self.quantum_ratio > 1:
            raise ValueError(f"quantum_ratio must be > 1, got {self.quantum_ratio}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.starvation_period < 1 or not self.starvation_limit_s > 0:
            raise ValueError("starvation_period must be >= 1 and starvation_limit_s > 0")
        # (below 1e-6, 1 - share rounds to 1 and no prefill could start even with the host
        # tier empty: the admission test is free > (1 - share) x total, as the code's)
        if not MIN_HOST_FULL_SHARE <= self.host_full_share <= 1:
            raise ValueError(f"host_full_share must be in [{MIN_HOST_FULL_SHARE:g}, 1], got "
                             f"{self.host_full_share}")

    @property
    def order_key(self):  # type: ignore[no-untyped-def]
        """The engine's queues follow the planner's priority (levels change as jobs run)."""
        return mlfq_key if self.scheduler == "mlfq" else None

    # ---- priorities ------------------------------------------------------------------
    def _quantum_s(self, level: int) -> float:
        """Queue ``level``'s quantum (kept per level: asked for every job at every plan)."""
        quanta = self._quanta
        while len(quanta) <= level:
            quanta.append(self.base_quantum_s * self.quantum_ratio ** len(quanta))
        return quanta[level]

    def _join_level(self, view: ReplicaView, req: Request) -> int:
        """Skip-join: the first queue whose quantum covers the prefill at batch size 1."""
        if not self.skip_join:
            return 0
        n = req.num_prompt_tokens
        prefill_s = self._prefill_s.get(n)
        if prefill_s is None:
            prefill_s = self._prefill_s[n] = view.step_time_s([(n, 0)], 0, 0)
        return max(0, math.ceil(math.log(prefill_s / self.base_quantum_s, self.quantum_ratio)
                                - 1e-12))

    def _update_levels(self, view: ReplicaView, jobs: list[Request], now_s: float) -> list[int]:
        """Join, demote and (every starvation period) promote ``jobs`` (every job here);
        returns the ids whose level changed (``fastserve_steps.update_levels``).

        Between starvation checks, when no job came in since the last plan, only that plan's
        batch can have run (``ran_since_checked``): it alone is looked at, which finds the
        same changes (``update_levels`` passes over a job whose service did not change)."""
        starving = self._iterations % self.starvation_period == 0
        entered = view.num_entered
        looked = None
        if not starving and entered == self._num_entered:
            looked = ran_since_checked(self._batch)
        self._num_entered = entered
        return update_levels(jobs if looked is None else looked, starving, now_s,
                             self.starvation_limit_s, self._quanta, self._quantum_s,
                             lambda req: self._join_level(view, req))

    def _priority(self, req: Request) -> tuple[float, ...]:
        if self.scheduler == "srpt":
            return (req.max_output_tokens - req.num_output_tokens, req.arrival_s, req.id)
        if self.scheduler == "fcfs":
            return (req.arrival_s, req.id)
        return mlfq_key(req, 0.0)

    # ---- the plan --------------------------------------------------------------------
    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        self._iterations += 1
        running, waiting, swapped = view.running, view.waiting, view.swapped
        rekey: list[int] = []
        order: Callable[[Request], Any]
        if self.scheduler == "mlfq":
            rekey = self._update_levels(view, [*running, *waiting, *swapped], now_s)
            order = mlfq_order  # every job has its JobState now
        elif self.scheduler == "fcfs":
            order = fcfs_order
        else:
            order = self._priority
        # Resident and waiting jobs by priority (keys are unique: they end with the id). The
        # swapped ones never enter a batch (they must come back first): they are sorted
        # only when some may be swapped in. Under the MLFQ the engine keeps each queue in
        # this order (``order_key``, unless a controller set another), so with no level
        # changed and one queue empty the other is the order already.
        jobs: list[Request]
        if (order is mlfq_order and not rekey and not (running and waiting)
                and view.order_key is mlfq_key):
            jobs = list(running or waiting)
        else:
            jobs = sorted([*running, *waiting], key=order)
        kv = view.kv
        slots = view.max_running - len(running) - view.num_swapping_in
        host_free = view.num_free_host_blocks
        host_total = view.num_host_blocks
        admit_ok = host_total == 0 or host_free > (1 - self.host_full_share) * host_total
        tokens: dict[int, int] = {}
        batch: dict[int, Request] = {}
        available, slots = choose_batch(jobs, kv, view.max_batched_tokens,
                                        kv.num_available_blocks, slots, admit_ok,
                                        self.max_batch_size, now_s, tokens, batch)
        swap_out: list[int] = []
        swap_in: list[int] = []
        if self.proactive_swap and host_total:
            reserve = max(self.max_batch_size, self.min_free_blocks)
            coming = view.num_blocks_swapping_out
            # Lowest priority first: resident jobs left out of this batch (most plans keep
            # the reserve and look at none).
            if available + coming < reserve:
                swap_out = swap_out_lowest(jobs, batch, kv, available, coming, reserve,
                                           host_free)
            # A job coming back needs at least one block beyond the reserve (and a slot):
            # without them nothing is swapped in, so the swapped jobs need no sort.
            if not swap_out and swapped and available - reserve > 0 and slots > 0:
                swap_in = swap_in_highest(sorted(swapped, key=order), kv, available, reserve,
                                          slots, self.max_batch_size)
            if swapped and not (tokens or running or swap_out or swap_in or view.num_swapping_in
                                or view.num_blocks_swapping_out):
                self._check_reserve(view, swapped, reserve)
        self._batch = list(batch.values())
        preempt: tuple[int, ...] = ()
        if not tokens and not swap_out and not swap_in and running and not (
                view.num_swapping_in or view.num_blocks_swapping_out):
            # Nothing can move (KV full, host full or no swapping): recompute the
            # lowest-priority resident job so the others can grow.
            preempt = (next(r.id for r in reversed(jobs) if r.state == RUNNING),)
        rule = None
        if tokens and not swap_out and not swap_in and decodes_only(batch, tokens):
            # Without a swap the reserve held: the steps after this one may take the blocks
            # above it (when it did not hold, no job could go out, nor can one later).
            max_new_blocks = NO_LIMIT
            if self.proactive_swap and host_total and available + coming >= reserve:
                max_new_blocks = available + coming - reserve
            rule = Repeat(self, max_new_blocks)
        return StepPlan(tokens, preempt, swap_out=tuple(swap_out), swap_in=tuple(swap_in),
                        rekey=tuple(rekey), repeat_rule=rule)

    def _check_reserve(self, view: ReplicaView, swapped: Sequence[Request],
                       reserve: int) -> None:
        """Nothing runs or moves and the swapped jobs wait for room. When even the whole
        cache less the free-block reserve cannot hold the smallest of them, none can ever come
        back and the run could not go on (FastServe's code would hang): a bad argument, named
        with the numbers that make it so. (Otherwise the room may come: blocks held for
        others are given back.)"""
        need = min(view.kv.num_blocks_for(r.num_computed_tokens + 1) for r in swapped)
        blocks = view.num_kv_blocks
        if reserve + need <= blocks:
            return
        field = "min_free_blocks" if self.min_free_blocks > self.max_batch_size else (
            "max_batch_size")
        raise FleetsimInputError(
            f"policy.batching.args.{field}", getattr(self, field),
            f"fastserve keeps max(max_batch_size, min_free_blocks) = {reserve:,} KV blocks "
            f"free, which leaves no room of the replica's {blocks:,} to swap back a job "
            f"needing {need:,}: keep it below {max(blocks - need, 1):,}")

    # ---- fast-forward ------------------------------------------------------------------
    def _repeat_steps(self) -> int:
        """Steps a plan may repeat before the next starvation check (plans between
        checks look only at the jobs that ran)."""
        if self.scheduler != "mlfq":
            return NO_LIMIT
        return self.starvation_period - self._iterations % self.starvation_period

    def _repeated(self, num_steps: int, last_start_s: float) -> None:
        """The last plan ran ``num_steps`` times, the last from ``last_start_s``: count the
        plans not made, and note when the batch last ran (starvation)."""
        self._iterations += num_steps - 1
        if num_steps > 1 and self.scheduler == "mlfq":
            for req in self._batch:
                req.policy_state.last_run_s = last_start_s


NO_LIMIT = 1 << 62  # (steps or blocks: more than any window takes)


class Repeat:
    """When a FastServe plan that only decodes its batch repeats (``RepeatRule``): the plan
    of every later step is the same while no job of the batch is demoted (its attained
    service past its level's quantum: ``steps_before_demotion``), no starvation check comes
    (``_repeat_steps``) and the batch's new blocks leave the free-block reserve in place
    (``max_new_blocks``); arrivals, finishes and swaps done cut the window. Why nothing
    else changes: the jobs passed over were passed over for want of blocks, budget, slots
    or host room, and within a window the blocks only shrink while the rest stays."""

    __slots__ = ("max_new_blocks", "max_steps", "planner")
    per_step = True  # (skip-join MLFQ demotes on attained service)

    def __init__(self, planner: FastServePlanner, max_new_blocks: int) -> None:
        self.planner = planner
        self.max_steps = planner._repeat_steps()
        self.max_new_blocks = max_new_blocks

    def steps_within(self, decodes: Sequence[Request], start_s: float,
                     ends_s: Sequence[float]) -> int:
        planner = self.planner
        if planner.scheduler != "mlfq":
            return len(ends_s)
        batch = planner._batch
        for req in batch:  # (every level a job of the batch is at has its quantum listed)
            planner._quantum_s(req.policy_state.level)
        return steps_before_demotion(batch, planner._quanta, start_s, list(ends_s))

    def ran(self, num_steps: int, last_start_s: float) -> None:
        self.planner._repeated(num_steps, last_start_s)
