"""FastServe's per-iteration loops (``policies/fastserve.py``): plain functions over the
engine's requests, compiled with the engine by ``make native`` (the planner class stays
interpreted so users can subclass it), as ``batch_steps.py`` is for the token-budget planners.
They run once per iteration over the resident, waiting and swapped jobs (hundreds under
load), most of a FastServe run's cost when interpreted."""

from __future__ import annotations

from collections.abc import Callable

from fleetsim.serving.request import ABORTED, FINISHED, RUNNING, SWAPPED, WAITING, Request
from fleetsim.serving.views import KVView


class JobState:
    """FastServe's per-job state (kept in ``Request.policy_state``)."""

    __slots__ = ("last_run_s", "level", "level_entry_service_s", "seen_service_s")

    def __init__(self, level: int, service_s: float, now_s: float) -> None:
        self.level = level
        self.level_entry_service_s = service_s  # attained service when it entered the level
        self.last_run_s = now_s  # last time it was in a batch (starvation)
        self.seen_service_s = service_s  # attained service when its level was last checked


def mlfq_order(req: Request) -> tuple[int, float, int]:
    """The MLFQ's queue order for a job the planner has seen: level, then arrival."""
    state: JobState = req.policy_state
    return (state.level, req.arrival_s, req.id)


def fcfs_order(req: Request) -> tuple[float, int]:
    return (req.arrival_s, req.id)


def update_levels(jobs: list[Request], starving: bool, now_s: float, starvation_limit_s: float,
                  quanta: list[float], quantum_s: Callable[[int], float],
                  join_level: Callable[[Request], int]) -> list[int]:
    """Join new jobs (``join_level``), demote the jobs past their level's quantum
    (``quanta[level]``, or ``quantum_s(level)`` past the list) and, when ``starving``,
    promote those not run for ``starvation_limit_s``; returns the ids whose level changed.

    Between starvation checks a job whose attained service did not change since its level
    was last checked is passed over: a check leaves it within its level's quantum (demoted,
    its service at the new level starts from zero), so only running can take it out again.
    The rules look at every job after each iteration; this finds the same ones."""
    changed: list[int] = []
    for req in jobs:
        state = req.policy_state
        if not isinstance(state, JobState):
            req.policy_state = JobState(join_level(req), req.service_s, req.arrival_s)
            changed.append(req.id)
            continue
        service_s = req.service_s
        if not starving and service_s == state.seen_service_s:
            continue
        level = state.level
        quantum = quanta[level] if level < len(quanta) else quantum_s(level)
        if service_s - state.level_entry_service_s > quantum:
            state.level = level + 1
            state.level_entry_service_s = service_s
        if starving and now_s - state.last_run_s >= starvation_limit_s:
            state.level = 0
            state.level_entry_service_s = service_s
        state.seen_service_s = service_s
        if state.level != level:
            changed.append(req.id)
    return changed


def ran_since_checked(batch: list[Request]) -> list[Request] | None:
    """The jobs of the last plan's ``batch`` still running: between starvation checks and
    while no job came in (``ReplicaView.num_entered``), the only ones whose attained service
    can have changed since ``update_levels`` last looked (only batches run). None when one
    left the batch for another queue (a full pass is needed: it may be there)."""
    out: list[Request] = []
    for req in batch:
        state = req.state
        if state == RUNNING:
            out.append(req)
        elif state != FINISHED and state != ABORTED:
            return None
    return out


def choose_batch(jobs: list[Request], kv: KVView, budget: int, available: int, slots: int,
                 admit_ok: bool, max_batch_size: int, now_s: float,
                 tokens: dict[int, int], batch: dict[int, Request]) -> tuple[int, int]:
    """Fill ``tokens`` and ``batch`` (id -> job) from ``jobs`` (highest priority first):
    resident jobs run unless their KV cannot grow, waiting ones are admitted whole while
    ``admit_ok`` and ``slots`` allow; a job that does not fit the budget or the blocks is
    passed over (jobs behind it may fit). Returns the blocks and running slots left."""
    for req in jobs:
        if len(batch) == max_batch_size or budget <= 0:
            break
        state = req.state
        if state == RUNNING:  # resident: it runs unless its KV cannot grow
            num_new = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
            needed = kv.blocks_needed(req, num_new)
        elif state == WAITING and admit_ok and slots > 0:  # a whole prompt
            num_new = req.num_tokens - kv.num_prefix_hit_tokens(req)
            needed = kv.admission_blocks(req, num_new)
        else:  # no room to admit
            continue
        if num_new > budget or needed > available:
            continue
        tokens[req.id] = num_new
        budget -= num_new
        available -= needed
        batch[req.id] = req
        if state == WAITING:
            slots -= 1
        job = req.policy_state
        if isinstance(job, JobState):
            job.last_run_s = now_s
    return available, slots


def swap_out_lowest(jobs: list[Request], batch: dict[int, Request], kv: KVView, available: int,
                    coming: int, reserve: int, host_free: int) -> list[int]:
    """Resident jobs left out of ``batch``, lowest priority first, to swap out until the
    free blocks plus those already on their way out reach ``reserve`` (each while it fits
    the host's ``host_free`` blocks)."""
    out: list[int] = []
    for i in range(len(jobs) - 1, -1, -1):
        if available + coming >= reserve:
            break
        req = jobs[i]
        if req.state != RUNNING or req.id in batch or req.num_computed_tokens == 0:
            continue
        blocks = kv.num_blocks_for(req.num_computed_tokens)
        if blocks <= host_free:
            out.append(req.id)
            host_free -= blocks
            coming += kv.reclaimable_blocks(req)
    return out


def swap_in_highest(swapped: list[Request], kv: KVView, available: int, reserve: int,
                    slots: int, max_jobs: int) -> list[int]:
    """Swapped jobs (``swapped``: highest priority first) to bring back while their blocks
    (and one more token each) leave ``reserve`` free, at most ``max_jobs`` and ``slots``."""
    out: list[int] = []
    for req in swapped:
        if len(out) == max_jobs or slots <= 0:
            break
        if req.state != SWAPPED:
            continue
        need = kv.num_blocks_for(req.num_computed_tokens + 1)
        if need > available - reserve:
            break
        out.append(req.id)
        available -= need
        slots -= 1
    return out


def decodes_only(batch: dict[int, Request], tokens: dict[int, int]) -> bool:
    """Does the batch only decode (every job resident, one token each, past its prompt)?"""
    for rid, req in batch.items():
        if tokens[rid] != 1 or req.state != RUNNING or req.num_output_tokens == 0:
            return False
    return True


def steps_before_demotion(batch: list[Request], quanta: list[float], start_s: float,
                          ends_s: list[float]) -> int:
    """Steps (of those ending at ``ends_s``, from ``start_s``) that run before the plan after
    one of them demotes a job of ``batch`` (``quanta[level]``: every level is in the list):
    the first step after which a job's attained service, added one step at a time as the
    engine adds it, is past its level's quantum (that step included); all when none is."""
    k = len(ends_s)
    for req in batch:
        state: JobState = req.policy_state
        limit_s = quanta[state.level]
        entry_s = state.level_entry_service_s
        service_s = req.service_s
        prev_s = start_s
        for j in range(k):
            end_s = ends_s[j]
            service_s += end_s - prev_s
            prev_s = end_s
            if service_s - entry_s > limit_s:
                k = j + 1
                break
    return k
