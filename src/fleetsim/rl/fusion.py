"""RLHFuse's two fusions (arXiv:2409.13221; docs/rl.md), as the RL job uses them.

- **Inter-stage** (generation -> inference): once only ``tail_migration_fraction`` of the
  samples is still generating, the fewest instances that can hold them keep generating (the
  ones with the most samples left, so the least KV moves; enough that decode is no slower
  than it was for the full batch) and the others' samples move there with their KV
  (``Cluster.migrate``); the freed GPUs run the inference passes of the samples
  already finished while the tail generates. ``plan_tail_migration`` chooses,
  ``migrate_tail`` does it.
- **Intra-stage** (actor and critic training): the two models' pipelines fused on shared
  stages, their schedule found by simulated annealing (``fused_pipeline.anneal``).
  ``FusedTraining`` times a mini-batch so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from fleetsim.core.process import Timeout
from fleetsim.perf.training import PassResult
from fleetsim.rl.fused_pipeline import (
    FusedResult,
    PipelineWork,
    Schedule,
    anneal,
    evaluate,
    plain_schedule,
)

TAIL_POLL_S = 0.005  # how often the job looks whether the migrated tail has left its instances


@dataclass(frozen=True, slots=True)
class TailPlan:
    keep: tuple[int, ...]
    """Generation replicas that keep generating."""
    moves: dict[int, list[int]]
    """Destination replica -> samples (indices into the step's batch) that move there."""


def plan_tail_migration(unfinished: np.ndarray, replica: np.ndarray, final_tokens: np.ndarray,
                        *, num_replicas: int, max_running: int, num_kv_blocks: int,
                        block_size: int, decode_step_s: Callable[[int, int], float],
                        reference_step_s: float) -> TailPlan | None:
    """Where the tail goes. ``unfinished``: the samples still generating; ``replica``: each
    sample's replica; ``final_tokens``: each sample's prompt + response tokens (what its KV
    will grow to). RLHFuse keeps enough instances that decode does not slow down and the
    survivors' KV fits: here, the fewest whose batch fits ``max_running``, whose blocks hold
    the survivors' final KV (fleetsim knows the lengths; the paper uses its length model), and
    whose decode step (``decode_step_s(batch, kv_tokens)``) is no slower than
    ``reference_step_s`` (a decode step of the full batch at the start of generation). None
    when no instance would be freed."""
    if not len(unfinished):
        return None
    blocks = int(np.sum(-(-final_tokens[unfinished] // block_size)))
    need = max(1, math.ceil(len(unfinished) / max_running), math.ceil(blocks / num_kv_blocks))
    mean_kv = float(final_tokens[unfinished].mean())
    while need < num_replicas:
        batch = math.ceil(len(unfinished) / need)
        if decode_step_s(batch, int(batch * mean_kv)) <= reference_step_s:
            break
        need += 1
    if need >= num_replicas:
        return None
    left = np.bincount(replica[unfinished], minlength=num_replicas)
    # Most samples left first (least KV to move), lower id on ties.
    keep = tuple(sorted(range(num_replicas), key=lambda r: (-left[r], r))[:need])
    load = {r: int(left[r]) for r in keep}
    moves: dict[int, list[int]] = {r: [] for r in keep}
    for i in unfinished:
        if int(replica[i]) in load:
            continue
        dst = min(keep, key=lambda r: (load[r], r))
        moves[dst].append(int(i))
        load[dst] += 1
    return TailPlan(keep, {r: v for r, v in moves.items() if v})


def migrate_tail(job: Any, k: int, rec: Any) -> Generator[Any, Any, list[int]]:
    """Inter-stage fusion in step ``k`` of an ``RLJob`` (``rec``: the step's samples), run
    inside its colocated story while the engine keeps generating: wait for the tail, move the
    survivors onto the kept instances, wait until they have left the others and their KV has
    arrived, then score the finished groups on the freed GPUs. Returns the groups it scored."""
    assert rec.tail is not None
    yield rec.tail
    gen = job.gen
    unfinished = np.flatnonzero(np.isnan(rec.finish_s))
    b = rec.batch
    eng = job.cfg.generation.engine

    def decode_step_s(batch: int, kv_tokens: int) -> float:
        return float(gen.step_model.step_time_s((), batch, kv_tokens))

    # A decode step of an instance's share of the whole batch, halfway through the mean
    # response: what the kept instances must not be slower than.
    share = math.ceil(b.num_samples / gen.num_replicas)
    full_batch_step_s = decode_step_s(share, int(share * float(
        (b.prompt_tokens + b.response_tokens / 2).mean())))
    plan = plan_tail_migration(unfinished, rec.replica, b.prompt_tokens + b.response_tokens,
                               num_replicas=gen.num_replicas, max_running=eng.max_running,
                               num_kv_blocks=gen.num_kv_blocks, block_size=eng.block_size,
                               decode_step_s=decode_step_s, reference_step_s=full_batch_step_s)
    if plan is None:
        return []
    moved = [i for v in plan.moves.values() for i in v]
    for dst, samples in plan.moves.items():
        gen.cluster.migrate([int(rec.request_id[i]) for i in samples], dst)
        rec.replica[samples] = dst
    freed = [r for r in range(gen.num_replicas) if r not in plan.keep]
    replicas = gen.cluster.replicas
    start = job.sim.now_s
    # Freed once the survivors have left (a step boundary) and their KV has arrived.
    while any(replicas[r].holds(int(rec.request_id[i])) for i in moved for r in freed) or any(
            replicas[d].view.num_incoming for d in plan.moves):
        yield Timeout(TAIL_POLL_S)
    for r in freed:
        rec.lane_end_s[r] = job.sim.now_s
    freed_gpus = len(freed) * job.cfg.generation.tp
    job.migrations.append({"step": k, "num_left": len(unfinished), "num_moved": len(moved),
                           "kept_instances": len(plan.keep), "freed_gpus": freed_gpus,
                           "migration_s": job.sim.now_s - start})
    groups = list(rec.group_done)
    par = job.cfg.inference_layout
    if groups and freed_gpus >= par.tp * par.pp:
        yield from job.score(k, rec, groups, freed_gpus=freed_gpus)
        return groups
    return []


@dataclass(slots=True)
class FusedTraining:
    """Actor and critic training of a mini-batch in one fused pipeline schedule. A schedule is
    searched once per pair of micro-batch counts and reused for later mini-batches of the same
    shape (timed with their own micro-batches); the plain fused order is the fallback when it
    is faster for them."""

    num_stages: int
    iterations: int
    seed: int
    schedules: dict[tuple[int, int], Schedule] = field(default_factory=dict)
    searches: list[dict[str, float]] = field(default_factory=list)

    def time_s(self, actor: PassResult, critic: PassResult) -> tuple[float, float]:
        """(seconds of the fused training pass, its pipeline idle time). ``actor`` and
        ``critic`` are the two models' unfused results over the same mini-batch: their
        pipeline part is replaced by the fused schedule's makespan; activation hops, exposed
        gradient reduction and the optimizer steps stay as they were. Never slower than the
        two unfused passes one after the other."""
        works = [PipelineWork("actor", *_split(actor)), PipelineWork("critic", *_split(critic))]
        key = (works[0].num_micro_batches, works[1].num_micro_batches)
        schedule = self.schedules.get(key)
        if schedule is None:
            res = _search(self.num_stages, tuple(works), self.iterations, self.seed)
            self.schedules[key] = schedule = [list(s) for s in res.schedule]
            self.searches.append({"actor_micro_batches": key[0], "critic_micro_batches": key[1],
                                  "fused_s": res.makespan_s, "sequential_1f1b_s":
                                  res.sequential_s, "lower_bound_s": res.lower_bound_s})
        cost = evaluate(schedule, works)
        plain = evaluate(plain_schedule(self.num_stages, works), works)
        assert plain is not None
        makespan = min(cost[0], plain[0]) if cost is not None else plain[0]
        unfused = actor.compute_s + actor.bubble_s + critic.compute_s + critic.bubble_s
        makespan = min(makespan, unfused)
        rest = (actor.time_s - actor.compute_s - actor.bubble_s) + (
            critic.time_s - critic.compute_s - critic.bubble_s)
        busy = sum(works[0].fwd_s) + sum(works[0].bwd_s) + sum(works[1].fwd_s) + sum(
            works[1].bwd_s)
        return makespan + rest, max(0.0, makespan - busy)


@lru_cache(maxsize=256)
def _search(num_stages: int, works: tuple[PipelineWork, ...], iterations: int, seed: int
            ) -> FusedResult:
    """``anneal`` of exactly these inputs, once per process: the search is deterministic, and
    the runs of a comparison search the same mini-batches again (RLHFuse's entry: the systems
    with and without tail migration share their first mini-batches, 43 distinct searches of
    81)."""
    return anneal(num_stages, works, iterations=iterations, seed=seed)


def _split(result: PassResult) -> tuple[tuple[float, ...], tuple[float, ...]]:
    mbs = result.micro_batches_s or ((0.0, 0.0),)
    return tuple(f for f, _ in mbs), tuple(b for _, b in mbs)
