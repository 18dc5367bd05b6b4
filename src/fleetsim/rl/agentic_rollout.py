"""One rollout of a GRPO batch of agentic trajectories on a pool of workers, on the serving
engine: the batch's trajectories are programs (``rl.trajectories``) submitted step by step
(``ProgramSource``), the workers are replicas of one pool, and a driver between the two
keeps each trajectory's length prediction (``rl.trajectory_predictor``), refined after every
step, and, for Heddle, its placement (``rl.trajectory_placement``) and the migrations of its
KV during tool waits.

Systems (Heddle, arXiv 2603.28101, and its baselines) are combinations of three choices:
``scheduling`` (``fcfs`` or Heddle's ``progressive_priority``), ``placement``
(``least_requests``: slime; ``sticky``: verl; ``sticky_skew``: verl*; ``heddle``: presorted
DP grouping on the initial predictions) and ``migration`` (Heddle: after each step, a
trajectory whose refined prediction now falls in another worker's band moves there during
its tool wait: the KV its worker still caches crosses the KV link as the tool runs, is cached
at the destination when it lands, and the next step is submitted there once both the tool
and the copy are done).

With ``resource_manager`` on (Heddle's third mechanism, ``rl.resource_manager``), the GPU
budget is split into workers of different TP before the rollout: one pool per TP (each with
its own step model and KV capacity, ``build_pools``), highest TP first, so worker ``w`` is
replica ``w``, and the placement DP groups the trajectories onto them longest first.

The metric is rollout throughput: generated tokens over the time the last trajectory
finishes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetsim.config import ClusterConfig, EngineConfig, PoolConfig, SimConfig
from fleetsim.configutil import to_plain
from fleetsim.errors import FleetsimInputError
from fleetsim.memo import BoundedMemo
from fleetsim.models import get_model
from fleetsim.policies.routing import make_router
from fleetsim.policies.trajectories import TrajectoryPlan
from fleetsim.programs.runtime import call_timer
from fleetsim.programs.source import ProgramSource
from fleetsim.registry import PolicySpec
from fleetsim.rl.agentic_config import check_rollout_choices
from fleetsim.rl.resource_manager import (
    TP_CHOICES,
    Allocation,
    WorkerKind,
    allocate,
    check_split,
    fitting_tps,
)
from fleetsim.rl.trajectories import TrajectoryArgs, TrajectoryBatch, sample_batch
from fleetsim.rl.trajectory_placement import Placement
from fleetsim.rl.trajectory_predictor import (
    PredictorConfig,
    TrajectoryPredictor,
    quality_at_step,
)
from fleetsim.run import build_pools, engine_settings, make_batch_policy, make_ordering
from fleetsim.serving.cluster import Cluster, simulate
from fleetsim.serving.recorder import Records
from fleetsim.serving.request import Request
from fleetsim.serving.settings import PlugIns

ROUTERS = {"least_requests": "least_requests", "sticky": "sticky",
              "sticky_skew": "sticky_skew", "heddle": "trajectory_plan"}  # -> router
HASH_BLOCK_TOKENS = 64  # prefix-hash block of the program source (docs/programs.md)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgenticRolloutConfig:
    """One rollout: the batch, the workers and the system."""

    model: str = "qwen3-8b"
    """Catalog model (Heddle: Qwen3 8B, 14B, 32B)."""
    gpu: str = "h100-sxm"
    """GPU of every worker (Heddle: Hopper GPUs)."""
    num_gpus: int = 64
    """GPUs of the rollout pool (Heddle: 64)."""
    tp: int = 1
    """Tensor parallelism of every worker (homogeneous model parallelism)."""
    scheduling: str = "fcfs"
    """fcfs | progressive_priority: the order a worker serves queued steps in."""
    placement: str = "least_requests"
    """least_requests (slime) | sticky (verl) | sticky_skew (verl*) | heddle (presorted DP)."""
    migration: bool = False
    """Move a mispredicted trajectory's KV to its new worker during its tool wait (needs
    placement heddle)."""
    resource_manager: bool = False
    """Heddle's trajectory-adaptive resource manager: split the ``num_gpus`` into workers of
    different TP (``tp_choices``) by simulated annealing from the homogeneous split at
    ``tp`` (needs placement heddle). Off: every worker at ``tp``."""
    tp_choices: tuple[int, ...] = TP_CHOICES
    """TPs the resource manager may give a worker (powers of two within a node; those the
    model does not fit at are skipped)."""
    anneal_steps: int = 200
    """Moves the resource manager's annealing tries."""
    split_scoring: str = "dp"
    """How the resource manager scores splits: dp (the placement DP's predicted slowest
    worker, every trajectory at the batch's mean context) | replay (the DP's choice, up to
    ``num_replayed`` more of its best-scored splits and the start each replay the previous
    rollout, in that order, each stopped at the soonest finish so far, and the soonest
    finish wins)."""
    num_replayed: int = 3
    """replay: how many of the DP's best-scored splits are replayed besides the start and
    the DP's own choice."""
    split: tuple[int, ...] = ()
    """Workers' TPs, highest first, fixed for the rollout (an ablation holding another
    run's resource-manager split; needs placement heddle, no resource manager); empty:
    every worker at ``tp``, or the resource manager's split."""
    preemption_mode: str = "recompute"
    """What a preempted step's KV becomes: recompute (dropped, computed again: SGLang's
    retract) | swap (copied to host memory, ``engine.swap_space_gib``, and back)."""
    skew_threshold: float = 1.5
    """sticky_skew: load over mean above which a step leaves its sticky worker."""
    trajectories: TrajectoryArgs = field(default_factory=TrajectoryArgs)
    """The batch: prompts, samples per prompt, turn and length laws, tools."""
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    """The length predictor's quality per step."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Every worker's serving engine (vLLM's limits and defaults)."""
    seed: int = 0
    """Seeds the batch, the predictor's errors and routing (one stream each)."""

    def __post_init__(self) -> None:
        check_rollout_choices(self)
        if self.tp < 1 or self.num_gpus < self.tp or self.num_gpus % self.tp:
            raise ValueError(f"num_gpus must be a positive multiple of tp, got num_gpus "
                             f"{self.num_gpus} and tp {self.tp}")
        if self.resource_manager and self.tp not in TP_CHOICES:
            raise ValueError(f"tp must be one of {list(TP_CHOICES)} with resource_manager "
                             f"(the annealing starts from every worker at tp), got {self.tp}")
        if self.preemption_mode == "swap" and not self.engine.swap_space_gib > 0:
            raise ValueError("preemption_mode swap needs host memory: set "
                             "engine.swap_space_gib > 0")
        if self.split:
            check_split(self.split, self.num_gpus, TP_CHOICES)


@dataclass(frozen=True, slots=True, eq=False)
class AgenticRolloutResult:
    summary: dict[str, Any]
    config: dict[str, Any]
    records: Records
    driver: RolloutDriver
    """What happened per trajectory: its steps' request ids, the prediction each step was
    queued with, its migrations."""
    split: tuple[int, ...]
    """TP of each worker (replica ``w`` is worker ``w``)."""


# (the rollout's config without the resource manager's search, the split) -> _simulate's
# result: runs that differ only in how the split was chosen share one simulation
Simulations = dict[tuple[str, tuple[int, ...]], tuple[TrajectoryPredictor, tuple[Any, ...]]]


def run_agentic_rollout(cfg: AgenticRolloutConfig, simulations: Simulations | None = None
                        ) -> AgenticRolloutResult:
    """Simulate one rollout of ``cfg``'s batch; summary: throughput and what the mechanisms
    did. ``simulations``: a memo shared by the caller's runs (the rollout on a split depends
    on the split, not on how the manager chose it, so e.g. Heddle with replay scoring and
    its DP-scored ablation simulate once when they keep the same split)."""
    return AgenticRollouts(cfg).next(simulations)


class AgenticRollouts:
    """Successive rollouts of one config, as an RL job runs them, one per training step: each
    draws a fresh batch, predictor noise and routing from streams that carry on from the
    previous rollout, and the resource manager sizes each rollout's workers for the lengths
    the previous one generated (the first: for a batch drawn from its own stream). The first
    rollout is ``run_agentic_rollout``'s."""

    def __init__(self, cfg: AgenticRolloutConfig) -> None:
        self.cfg = cfg
        self.model = get_model(cfg.model)
        if cfg.trajectories.max_context_tokens > self.model.max_context_tokens:
            raise FleetsimInputError("trajectories.max_context_tokens",
                                     cfg.trajectories.max_context_tokens,
                                     f"at most {cfg.model}'s context, "
                                     f"{self.model.max_context_tokens}")
        batch_ss, predictor_ss, self.routing_ss, self.manager_ss = (
            np.random.SeedSequence(cfg.seed).spawn(4))
        self.batch_rng = np.random.default_rng(batch_ss)
        self.predictor_rng = np.random.default_rng(predictor_ss)
        self.routing_rng: np.random.Generator | None = None
        self.previous: TrajectoryBatch | None = None

    def next(self, simulations: Simulations | None = None) -> AgenticRolloutResult:
        """Simulate the next rollout (its own simulation: fresh workers, nothing cached)."""
        cfg, model = self.cfg, self.model
        batch = sample_batch(cfg.trajectories, self.batch_rng)
        predictor = TrajectoryPredictor(batch.output_tokens, cfg.predictor, self.predictor_rng)
        allocation = (_allocate(cfg, model, self.manager_ss, self.previous)
                      if cfg.resource_manager else None)
        replayed: list[dict[str, Any]] = []
        if allocation is not None and cfg.split_scoring == "replay":
            allocation, replayed = _replay(cfg, model, self.manager_ss, allocation,
                                           self.previous)
        split = (allocation.split if allocation is not None
                 else cfg.split or (cfg.tp,) * (cfg.num_gpus // cfg.tp))
        key = (repr(to_plain(replace(cfg, tp=1, resource_manager=False, split=(),
                                     split_scoring="dp", num_replayed=1, anneal_steps=0,
                                     tp_choices=TP_CHOICES))), split)
        # The memo holds first rollouts only: later ones continue this object's streams.
        memo = simulations if self.previous is None else None
        kept = memo.get(key) if memo is not None else None
        if kept is None:
            # The routing stream carries on across rollouts (a generator made once from
            # its seed sequence: the first rollout routes as a fresh one would).
            if self.routing_rng is None:
                self.routing_rng = np.random.default_rng(self.routing_ss)
            kept = predictor, _simulate(cfg, model, batch, predictor, split, self.routing_rng)
            if memo is not None:
                memo[key] = kept
        predictor, run = kept  # the predictor holds what it predicted during that run
        self.previous = batch
        summary = _summary(cfg, batch, predictor, *run)
        if allocation is not None:
            summary["resource_manager"] = {
                "split": list(allocation.split), "cost_s": allocation.cost_s,
                "start": list(allocation.start), "start_cost_s": allocation.start_cost_s,
                "num_evaluated": allocation.num_evaluated,
                "num_accepted": allocation.num_accepted, "scoring": cfg.split_scoring,
                "replayed": replayed}
        return AgenticRolloutResult(summary, to_plain(cfg), run[1], run[0], split)


def _simulate(cfg: AgenticRolloutConfig, model: Any, batch: TrajectoryBatch,
              predictor: TrajectoryPredictor, split: tuple[int, ...],
              routing_ss: np.random.SeedSequence | np.random.Generator,
              until_s: float = 1e15) -> tuple[Any, ...]:
    """One rollout of ``batch`` on workers of ``split``, simulated up to ``until_s``:
    (driver, records, cluster, router, pool infos, placement), as ``_summary`` takes them."""
    initial = [predictor.predict(i, 0, 0) for i in range(len(batch.programs))]
    pool_cfgs = _pool_configs(cfg, split)
    scfg = SimConfig(seed=cfg.seed, model=cfg.model, engine=cfg.engine, cluster=ClusterConfig(
        pools=pool_cfgs))
    pools, infos = build_pools(scfg, model)
    placement = None
    if cfg.placement == "heddle":
        kinds = [_per_token_s(pool, batch, initial, cfg.engine) for pool in pools]
        workers = [kinds[k] for k, pool in enumerate(pools) for _ in range(pool.num_replicas)]
        placement = (Placement(initial, len(workers), *workers[0]) if len(pools) == 1
                     else Placement(initial, len(workers), *workers[0], workers=workers))
    eng = cfg.engine
    timer = call_timer(pools, model, eng.max_batched_tokens, scfg.cluster.link.latency_s,
                       [_alone_cache(cfg, p.tp) for p in pool_cfgs])
    driver = RolloutDriver(ProgramSource(batch.programs, timer, HASH_BLOCK_TOKENS), batch,
                           predictor, placement, cfg.migration,
                           float(model.kv_bytes_per_token()))
    router_args = {"skew_threshold": cfg.skew_threshold} if cfg.placement == "sticky_skew" else {}
    router = make_router(PolicySpec(name=ROUTERS[cfg.placement], args=router_args))
    batching = PolicySpec(name=cfg.scheduling if cfg.scheduling != "fcfs" else "token_budget",
                          args=({"preemption_mode": "swap"} if cfg.preemption_mode == "swap"
                                else {}))
    # A finite end either way (1e15 s: never reached) so windows are cut the same way in a
    # bounded replay as in the rollout: what finishes before ``until_s`` finishes alike.
    settings = replace(engine_settings(scfg, model), until_s=until_s, timeline=(0.0, 60.0))
    plugins = PlugIns(make_batch_policy=lambda: make_batch_policy(batching),
                      order_key=make_ordering("fcfs"), router=router,
                      rng=np.random.default_rng(routing_ss))
    records, cluster = simulate(driver.calls_workload(), pools, settings, plugins, source=driver)
    return driver, records, cluster, router, infos, placement


# (model, GPU, engine, TP) -> a call's standalone seconds on one such worker, keyed (prompt,
# hit, output tokens): ``_simulate`` builds its step models from exactly these (its
# ``SimConfig`` sets nothing else), so every rollout of the process on such a worker shares
# them (``CallTimer.alone_caches``); bounded, oldest dropped first.
_ALONE_S: BoundedMemo[tuple[str, str, str, int], dict[tuple[int, int, int], float]] = (
    BoundedMemo(64))


def _alone_cache(cfg: AgenticRolloutConfig, tp: int) -> dict[tuple[int, int, int], float]:
    key = (cfg.model, cfg.gpu, repr(to_plain(cfg.engine)), tp)
    cache = _ALONE_S.get(key)
    return cache if cache is not None else _ALONE_S.put(key, {})


def replay_candidates(allocation: Allocation, num_replayed: int) -> list[tuple[int, ...]]:
    """The splits the replay scores, in the order it replays them: the DP's own choice
    (the likeliest winner, so it sets the bound first), its ``num_replayed`` next
    best-scored splits, then the start (the manager never keeps a split worse than it)."""
    candidates = [allocation.split]
    for split, _ in allocation.ranked:
        if len(candidates) > num_replayed:
            break
        if split not in candidates and split != allocation.start:
            candidates.append(split)
    if allocation.start not in candidates:
        candidates.append(allocation.start)
    return candidates


def _fresh(seeds: np.random.SeedSequence) -> np.random.SeedSequence:
    """The manager's own streams again, every rollout alike (spawning advances a seed
    sequence); what changes between rollouts is the history it sizes for."""
    return np.random.SeedSequence(seeds.entropy, spawn_key=seeds.spawn_key)


def _history(cfg: AgenticRolloutConfig, seeds: np.random.SeedSequence,
             previous: TrajectoryBatch | None) -> tuple[TrajectoryBatch, np.random.SeedSequence]:
    """(the batch the manager sizes for, its annealing stream)."""
    history_ss, anneal_ss = _fresh(seeds).spawn(2)
    if previous is None:
        previous = sample_batch(cfg.trajectories, np.random.default_rng(history_ss))
    return previous, anneal_ss


def _replay(cfg: AgenticRolloutConfig, model: Any, seeds: np.random.SeedSequence,
            allocation: Allocation, previous: TrajectoryBatch | None = None
            ) -> tuple[Allocation, list[dict[str, Any]]]:
    """Score the DP's ``num_replayed`` best splits and the start by replaying the previous
    rollout on each (the batch ``_allocate`` sized the workers for, its own predictor and
    routing streams, this system on that split) and keep the split whose replay finished
    soonest [R: what a system that runs rollout after rollout can measure; the paper's own
    scoring is not recoverable]. The DP still proposes: it shortlists, the replay decides.

    Branch and bound: a replay stops at the soonest finish so far (``cut_at_s``), since a
    split that has not finished by then cannot win; only the splits that set a new best run
    to the end. The choice is the one full replays would make (ties keep the earlier
    candidate either way), at the cost of one replay plus the losers' runs up to the bound,
    instead of every loser's whole rollout (a crowded split's thrashing tail included)."""
    history, _ = _history(cfg, seeds, previous)  # the batch ``_allocate`` sized for
    replay_ss = _fresh(seeds).spawn(3)[2]
    predictor_ss, routing_ss = replay_ss.spawn(2)
    replayed: list[dict[str, Any]] = []
    best_s, best = 1e15, allocation.split
    for split in replay_candidates(allocation, cfg.num_replayed):
        predictor = TrajectoryPredictor(history.output_tokens, cfg.predictor,
                                        np.random.default_rng(predictor_ss))
        driver = _simulate(cfg, model, history, predictor, split, routing_ss, until_s=best_s)[0]
        finish = np.asarray(driver.finish_s, dtype=float)
        if np.isnan(finish).any():  # not done by the best so far: it cannot win
            replayed.append({"split": list(split), "rollout_s": None, "cut_at_s": best_s})
            continue
        rollout_s = float(finish.max())
        replayed.append({"split": list(split), "rollout_s": rollout_s})
        if rollout_s < best_s:
            best_s, best = rollout_s, split
    cost = dict(allocation.ranked).get(best, allocation.start_cost_s)
    return replace(allocation, split=best, cost_s=cost), replayed


def _pool_configs(cfg: AgenticRolloutConfig, split: tuple[int, ...]) -> tuple[PoolConfig, ...]:
    """One pool per TP of ``split``, highest first (its replicas are the workers of that
    TP, in the order the placement numbers them)."""
    tps = sorted(set(split), reverse=True)
    name = (lambda tp: "rollout") if len(tps) == 1 else (lambda tp: f"rollout-tp{tp}")
    return tuple(PoolConfig(name=name(tp), gpu=cfg.gpu, num_replicas=split.count(tp), tp=tp)
                 for tp in tps)


def _allocate(cfg: AgenticRolloutConfig, model: Any, seeds: np.random.SeedSequence,
              previous: TrajectoryBatch | None = None) -> Allocation:
    """The resource manager's split for this rollout. It runs between rollouts
    ("periodically"), so it cannot know this batch's trajectories: it sizes the workers for
    the lengths the previous rollout of the same workload generated (``previous``, or for
    the first a batch drawn from its own stream, its lengths as measured when it finished)
    [R]. One single-replica pool per TP the model fits at gives each kind's step model and
    KV capacity (the engine's own). A first rollout's split is kept for the process
    (``_SPLITS``): systems that differ only in how they then score splits share it."""
    key = None
    if previous is None:
        key = (repr(to_plain(replace(cfg, split_scoring="dp"))), seeds.entropy,
               seeds.spawn_key)
        kept = _SPLITS.get(key)
        if kept is not None:
            return kept
    allocation = _search(cfg, model, seeds, previous)
    return _SPLITS.put(key, allocation) if key is not None else allocation


# (the config but its split scoring, the manager's seed sequence) -> a first rollout's
# ``_allocate``: what it reads (the history batch drawn from those seeds, the worker kinds'
# step models and engine, the annealing) is fixed by these; bounded, oldest dropped first.
_SPLITS: BoundedMemo[tuple[object, ...], Allocation] = BoundedMemo(16)


def _search(cfg: AgenticRolloutConfig, model: Any, seeds: np.random.SeedSequence,
            previous: TrajectoryBatch | None) -> Allocation:
    history, anneal_ss = _history(cfg, seeds, previous)
    lengths = sorted((float(x) for x in history.output_tokens), reverse=True)
    kinds: dict[int, WorkerKind] = {}

    def fits(tp: int) -> bool:
        if tp not in cfg.tp_choices and tp != cfg.tp:
            return False
        probe = SimConfig(seed=cfg.seed, model=cfg.model, engine=cfg.engine,
                          cluster=ClusterConfig(pools=(PoolConfig(
                              name="probe", gpu=cfg.gpu, num_replicas=1, tp=tp),)))
        try:
            pool = build_pools(probe, model)[0][0]
        except FleetsimInputError:  # the weights do not fit at this TP
            if tp == cfg.tp:  # the start itself: the user's tp is wrong, say so
                raise
            return False
        kinds[tp] = WorkerKind(tp, *_per_token_s(pool, history, lengths, cfg.engine))
        return True

    fitting_tps(cfg.num_gpus, fits)
    return allocate(lengths, kinds, cfg.num_gpus, cfg.tp, np.random.default_rng(anneal_ss),
                    cfg.anneal_steps)


def _per_token_s(pool: Any, batch: TrajectoryBatch, predicted: list[float],
                 eng: EngineConfig) -> tuple[Any, int]:
    """T(b) for the placement DP, seconds per decoded token with ``b`` trajectories
    decoding on a worker, each at the batch's mean mid-rollout context (first prompt plus
    about its predicted tokens: half its outputs and the tool results between them); and how
    many such contexts a worker holds at once (its KV blocks, ``max_running``)."""
    prompt = float(np.mean([p.calls[0].num_prompt_tokens for p in batch.programs]))
    ctx = prompt + float(np.mean(predicted))
    per_seq_blocks = max(1, math.ceil(ctx / eng.block_size))
    fits = max(1, min(eng.max_running, pool.num_kv_blocks // per_seq_blocks))

    def per_token_s(b: int) -> float:
        return float(pool.step_model.step_time_s((), b, int(b * ctx)))

    return per_token_s, fits


class RolloutDriver:
    """A ``RequestSource`` around the program source: keeps each trajectory's prediction and
    worker in its program's ``policy`` slot (``TrajectoryPlan``), refines the prediction
    after every step, and migrates KV during tool waits (Heddle)."""

    wants_finishes = True

    def __init__(self, inner: ProgramSource, batch: TrajectoryBatch,
                 predictor: TrajectoryPredictor, placement: Placement | None, migration: bool,
                 kv_bytes_per_token: float) -> None:
        self.inner = inner
        self.batch = batch
        self.predictor = predictor
        self.placement = placement
        self.migration = migration
        self.kv_bytes_per_token = kv_bytes_per_token
        n = len(batch.programs)
        self.plans = [TrajectoryPlan(predictor.predict(i, 0, 0),
                                     placement.worker_of[i] if placement is not None else None)
                      for i in range(n)]
        self.num_steps_done = [0] * n
        self.num_tokens_done = [0] * n
        # trajectory -> predicted tokens it has left, kept as its prediction and tokens
        # change: a migration check reads it for every trajectory on the destination
        self.remaining = [max(0.0, plan.predicted_tokens) for plan in self.plans]
        self.worker_of_last = [-1] * n  # where each trajectory's last step ran
        self.request_ids: list[list[int]] = [[] for _ in range(n)]
        self.predicted_by_step: list[list[float]] = [[] for _ in range(n)]
        """The prediction each of a trajectory's steps was queued with."""
        self._moving: dict[int, tuple[int, int, float]] = {}  # trajectory -> (src, dst, t0)
        self._held: dict[int, tuple[float, Request]] = {}  # trajectory -> its next step
        self.cluster: Cluster | None = None
        self.finish_s = [math.nan] * n
        self.migrations: list[dict[str, float]] = []
        self.num_migrations_skipped = 0  # no KV cached at the source: nothing to move

    @property
    def num_requests(self) -> int | None:
        return self.inner.num_requests

    def calls_workload(self) -> Any:
        from fleetsim.programs.runtime import calls_workload

        return calls_workload(self.batch.programs, HASH_BLOCK_TOKENS, "agentic-rollout")

    # ---- the source protocol ---------------------------------------------------------
    def start(self, ctx: Any) -> None:
        self.cluster = ctx
        self.inner.start(self)

    def on_arrival(self, req: Request, ctx: Any) -> None:
        self.inner.on_arrival(req, self)

    def on_finish(self, req: Request, ctx: Any) -> None:
        traj = req.program.program.id
        self.num_steps_done[traj] += 1
        self.num_tokens_done[traj] += req.num_output_tokens
        self.worker_of_last[traj] = self._replica_of(req)
        plan = self.plans[traj]
        if self.num_steps_done[traj] == self.batch.programs[traj].num_calls:
            self.finish_s[traj] = req.finish_s
            if self.placement is not None:
                self.placement.finished(traj)
        else:
            plan.predicted_tokens = self.predictor.predict(
                traj, self.num_steps_done[traj], self.num_tokens_done[traj])
            self.remaining[traj] = max(0.0, plan.predicted_tokens - self.num_tokens_done[traj])
            if self.migration and self.placement is not None:
                dst = self.placement.move_for(traj, plan.predicted_tokens,
                                              self.remaining.__getitem__)
                if dst is not None:
                    self._moving[traj] = (self.worker_of_last[traj], dst, req.finish_s)
                    self.placement.moved(traj, dst)
                    plan.worker = dst
        self.inner.on_finish(req, self)

    # ---- the context the program source sees ------------------------------------------
    @property
    def now_s(self) -> float:
        assert self.cluster is not None
        return self.cluster.now_s

    def new_request_id(self) -> int:
        assert self.cluster is not None
        return self.cluster.new_request_id()

    def submit_at(self, at_s: float, req: Request) -> None:
        """A step is ready at ``at_s`` (its tool's end): hold it while its KV moves."""
        assert self.cluster is not None
        traj = req.program.program.id
        req.program.program.policy = self.plans[traj]
        self.request_ids[traj].append(req.id)
        self.predicted_by_step[traj].append(self.plans[traj].predicted_tokens)
        move = self._moving.pop(traj, None)
        if move is None:
            self.cluster.submit_at(at_s, req)
            return
        self._start_migration(traj, move, at_s, req)

    # ---- migration -------------------------------------------------------------------
    def _start_migration(self, traj: int, move: tuple[int, int, float], at_s: float,
                         req: Request) -> None:
        cluster = self.cluster
        assert cluster is not None
        src, dst, t0 = move
        placement = cluster.kv_placement
        ids = req.hash_ids
        m = placement.num_cached(src, ids)
        if m == 0:  # nothing cached at the source: the step just goes to its new worker
            self.num_migrations_skipped += 1
            cluster.submit_at(at_s, req)
            return
        self._held[traj] = (at_s, req)
        placement.copy_prefix(src, dst, ids[:m], lambda installed, num_bytes: self._landed(
            traj, src, dst, m, num_bytes, t0, installed))

    def _landed(self, traj: int, src: int, dst: int, num_entries: int, num_bytes: float,
                t0: float, installed: int) -> None:
        cluster = self.cluster
        assert cluster is not None
        at_s, req = self._held.pop(traj)
        now = cluster.now_s
        self.migrations.append({"trajectory": traj, "src": src, "dst": dst, "start_s": t0,
                                "bytes": num_bytes, "transfer_s": now - t0,
                                "tool_s": at_s - t0, "num_entries": num_entries,
                                "num_installed": installed, "request_id": req.id})
        cluster.submit_at(max(at_s, now), req)

    @staticmethod
    def _replica_of(req: Request) -> int:
        assert req.replica_id is not None
        return req.replica_id


def _trajectory_wait_s(req: dict[str, Any], driver: RolloutDriver, traj: int) -> float:
    """Seconds the steps of trajectory ``traj`` waited in queues before first being
    scheduled (the paper's longest-trajectory queueing delay)."""
    ids = set(driver.request_ids[traj])
    mask = np.fromiter((int(r) in ids for r in req["request_id"]), dtype=bool,
                       count=len(req["request_id"]))
    return float(np.sum(req["first_scheduled_s"][mask] - req["arrival_s"][mask]))


def _summary(cfg: AgenticRolloutConfig, batch: TrajectoryBatch, predictor: TrajectoryPredictor,
             driver: RolloutDriver, records: Records, cluster: Cluster, router: Any,
             infos: list[dict], placement: Placement | None) -> dict[str, Any]:
    finish = np.asarray(driver.finish_s, dtype=np.float64)
    if np.isnan(finish).any():
        raise RuntimeError(f"{int(np.isnan(finish).sum())} trajectories did not finish")
    makespan = float(finish.max())
    tokens = int(batch.output_tokens.sum())
    req = records.requests
    waits = req["first_scheduled_s"] - req["arrival_s"]
    longest = int(np.argmax(batch.output_tokens))
    moved = driver.migrations
    pearson0, recall0 = quality_at_step(predictor, 0)
    pearson2, recall2 = quality_at_step(predictor, 2)
    out: dict[str, Any] = {
        "system": {"scheduling": cfg.scheduling, "placement": cfg.placement,
                   "migration": cfg.migration},
        "pools": infos,
        "num_trajectories": len(batch.programs),
        "num_steps": int(sum(p.num_calls for p in batch.programs)),
        "num_generated_tokens": tokens,
        "rollout_s": makespan,
        "tokens_per_s": tokens / makespan,
        "trajectory_tokens": {"mean": float(batch.output_tokens.mean()),
                              "p50": float(np.median(batch.output_tokens)),
                              "max": int(batch.output_tokens.max())},
        "longest_trajectory": {"tokens": int(batch.output_tokens[longest]),
                               "finish_s": float(finish[longest])},
        # No order or placement finishes the batch before its slowest trajectory alone on an
        # idle worker (standalone critical path, docs/programs.md): the bound of every
        # system with this model parallelism.
        "critical_path_s": max(st.standalone_s for st in driver.inner.states
                               if st is not None),
        "num_preemptions": int(req["num_preemptions"].sum()),
        "num_recomputed_tokens": int(req["num_recomputed_tokens"].sum()),
        "num_swaps": int(req["num_swaps"].sum()),
        "num_prefix_hit_tokens": int(req["num_prefix_hit_tokens"].sum()),
        "predictor": {"correlation_by_step": list(cfg.predictor.correlation_by_step),
                      "step0": {"pearson": pearson0, "tail20_recall": recall0},
                      "step2": {"pearson": pearson2, "tail20_recall": recall2}},
        "migration": {"num_migrations": len(moved),
                      "num_skipped_nothing_cached": driver.num_migrations_skipped,
                      "bytes": float(sum(m["bytes"] for m in moved)),
                      "num_hidden": sum(1 for m in moved if m["transfer_s"] <= m["tool_s"]),
                      "max_transfer_s": max((m["transfer_s"] for m in moved), default=0.0)},
    }
    out["queueing"] = {"mean_wait_s": float(np.mean(waits)),
                       "longest_trajectory_wait_s": _trajectory_wait_s(req, driver, longest)}
    if placement is not None:
        out["placement"] = {"group_sizes": placement.sizes, "dp_cost_s": placement.cost}
    report = getattr(router, "report", None)
    if report is not None:
        out["router"] = report()
    return out
