"""An RL post-training job on a simulated cluster: each step generates rollouts on the serving
engine, scores them with forward passes, trains, and pushes new weights to the generators.

Two stories (processes on the one event kernel, ``core/process.py``):

- **colocated** (verl's hybrid engine): one pool runs every stage in turn: weight resharding
  to the rollout layout, generation, the inference passes, training. Stages never overlap on
  the GPUs, and the step time is their sum.
- **disaggregated** (StreamRL): a generation pool and a trainer pool run concurrently. The
  generator waits for weights at most ``staleness`` steps old, generates, and starts again;
  the trainer scores and trains each step's samples, as they finish (``streaming``) or once
  the batch is done, then ships the weights over the network (the transfer service).

Every stage is timed by the performance model: generation by the serving engine itself
(continuous batching, KV limits, the long tail) through the job's generation source
(``rl.sources``: single-turn responses, or agentic multi-turn trajectories), inference and
training by ``fleetsim.perf.training`` on the same measured tables.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetsim.core.process import Event, Kernel, Process, Timeout
from fleetsim.core.simulator import Simulator
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec, get_gpu
from fleetsim.models import ModelSpec, get_model
from fleetsim.perf.training import (
    ForwardModel,
    Layout,
    PassModel,
    PassResult,
    training_state_bytes_per_gpu,
)
from fleetsim.rl.config import ParallelConfig, PoolSpec, RLConfig, check_fits_model
from fleetsim.rl.fusion import FusedTraining, migrate_tail
from fleetsim.rl.generation import GenerationPool
from fleetsim.rl.lengths import StepBatch
from fleetsim.rl.results import RLResult, summarize
from fleetsim.rl.sources import GenerationSource, make_source

TRAINER_ENDPOINT = -(10**9)  # the transfer service's id for the trainer pool's NICs
BROADCAST_CHUNK_BYTES = 64 * 2**20  # relay granularity of the weight broadcast (assumption)
MEMORY_HEADROOM = 0.9  # share of HBM training states may take (activations, fragmentation)


@dataclass(slots=True)
class StageRow:
    """One stage on one lane (a generation replica, or a whole pool) over [start, end)."""

    step: int
    stage: str
    pool: str
    lane: str
    start_s: float
    end_s: float
    num_gpus: int


@dataclass(slots=True)
class Samples:
    """Per-sample record of one step (arrays indexed by sample)."""

    batch: StepBatch
    version: int = 0
    """Weights version the step was generated with (version v = after v training steps)."""
    gen_start_s: float = math.nan
    finish_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    replica: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_generated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_scored: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_trained: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    trained_version: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    group_done: list[int] = field(default_factory=list)
    """Prompts whose whole group has finished, in finish order."""
    group_left: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    num_left: int = 0
    done: Event | None = None
    """Fires when every sample has finished."""
    wake: Event | None = None
    """Fires at the next group finish (a streaming trainer waits on it)."""
    request_id: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    lane_end_s: dict[int, float] = field(default_factory=dict)
    """Generation replicas freed before the batch ended (tail migration) -> when."""
    tail: Event | None = None
    """Fires when only ``tail_at`` samples are left (RLHFuse's tail migration)."""
    tail_at: int = -1
    rounds: list[tuple[list[int], list[int]]] = field(default_factory=list)
    """Static generation rounds still to submit: (samples, replica of each)."""
    round_left: int = 0


@dataclass(slots=True)
class _Passes:
    """The forward-only passes over a step's samples and the training passes."""

    inference: list[tuple[str, PassModel]]
    training: list[tuple[str, PassModel]]


class RLJob:
    """Build with an ``RLConfig``; ``run()`` simulates ``num_steps`` steps."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.sim = Simulator()
        self.kernel = Kernel(self.sim)
        self.rows: list[StageRow] = []
        self.steps: list[Samples] = []
        self.rng = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(2)[0])
        self.dispatch_rng = np.random.default_rng(np.random.SeedSequence(cfg.seed).spawn(2)[1])
        self.actor = self._model("actor", cfg.actor)
        check_fits_model(cfg, self.actor.max_context_tokens, self.actor.name)
        self.gpus = {p.name: self._gpu(i, p) for i, p in enumerate(cfg.pools)}
        self._check_layouts()
        self.gen_pool = cfg.pool_of("generation")
        try:
            self.gen = GenerationPool(self.sim, cfg, self.actor,
                                      lambda req: self.source.on_sample_done(req))
        except FleetsimInputError as err:
            i = cfg.pools.index(self.gen_pool)
            raise FleetsimInputError(f"rl.pools[{i}] ({self.gen_pool.name}) generation",
                                     err.value, err.fix) from None
        self.source: GenerationSource = make_source(cfg.generation.source, self)
        # (model, gpu, tp, LM head) -> its forward model, shared by every pass of this job
        # that runs it, so that each micro-batch is timed once (``ForwardModel``'s memo).
        self._forward_models: dict[tuple[ModelSpec, GPUSpec, int, bool], ForwardModel] = {}
        self.passes = self._build_passes()
        sysc = cfg.system
        self.fused = FusedTraining(cfg.training.pp, sysc.fusion_iterations, cfg.seed) if (
            sysc.fuse_training) else None
        self.migrations: list[dict[str, Any]] = []
        self.weight_version = 0
        self.weights_ready: dict[int, Event] = {0: self.kernel.event()}
        self.weights_ready[0].succeed()
        self.dispatch_info: list[dict[str, Any]] = []

    # ---- set-up --------------------------------------------------------------------------
    def _model(self, role: str, name: str) -> ModelSpec:
        try:
            return get_model(name)
        except FleetsimInputError as err:
            raise FleetsimInputError(f"rl.{role}", name, err.fix) from None

    def _gpu(self, i: int, pool: PoolSpec) -> GPUSpec:
        try:
            return get_gpu(pool.gpu)
        except FleetsimInputError as err:
            raise FleetsimInputError(f"rl.pools[{i}].gpu", pool.gpu, err.fix) from None

    def _layout(self, stage: str, par: ParallelConfig, num_gpus: int | None = None) -> Layout:
        gpus = self.cfg.pool_of(stage).num_gpus if num_gpus is None else num_gpus
        return Layout(tp=par.tp, pp=par.pp, dp=max(1, gpus // (par.tp * par.pp)),
                      micro_batch_tokens=par.micro_batch_tokens, recompute=par.recompute,
                      overlap_grad_reduce=par.overlap_grad_reduce, zero3=par.zero3)

    def _check_layouts(self) -> None:
        cfg = self.cfg
        checks = [("training", "training", cfg.training),
                  ("inference", "inference" if cfg.inference else "training",
                   cfg.inference_layout)]
        for stage, field_name, par in checks:
            pool = cfg.pool_of(stage)
            i = cfg.pools.index(pool)
            gpu = self.gpus[pool.name]
            need = par.tp * par.pp
            if need > pool.num_gpus:
                raise FleetsimInputError(
                    f"rl.{field_name}.pp", par.pp,
                    f"tp {par.tp} x pp {par.pp} = {need} GPUs (pipeline stages x tensor "
                    f"parallel) but pool {pool.name!r} (rl.pools[{i}]) has {pool.num_gpus}; "
                    f"lower tp or pp, or give the pool more GPUs")
            if par.tp > gpu.num_gpus_per_node:
                raise FleetsimInputError(
                    f"rl.{field_name}.tp", par.tp,
                    f"tensor parallelism stays inside a node of {gpu.num_gpus_per_node} "
                    f"{gpu.name} GPUs; use pp for the rest")
            if par.pp > self.actor.num_layers:
                raise FleetsimInputError(
                    f"rl.{field_name}.pp", par.pp,
                    f"more pipeline stages than the {self.actor.num_layers} layers of "
                    f"{self.actor.name}; lower pp")
        gen = cfg.pool_of("generation")
        if cfg.generation.tp > gen.num_gpus:
            i = cfg.pools.index(gen)
            raise FleetsimInputError(
                "rl.generation.tp", cfg.generation.tp,
                f"a generation replica needs {cfg.generation.tp} GPUs but pool {gen.name!r} "
                f"(rl.pools[{i}]) has {gen.num_gpus}; lower tp or give the pool more GPUs")
        train = cfg.pool_of("training")
        lay = self._layout("training", cfg.training)
        need_bytes = training_state_bytes_per_gpu(self.actor, lay)
        gpu = self.gpus[train.name]
        if need_bytes > gpu.hbm_bytes * MEMORY_HEADROOM:
            i = cfg.pools.index(train)
            raise FleetsimInputError(
                f"rl.pools[{i}].num_gpus", train.num_gpus,
                f"pool {train.name!r} is too small to train {self.actor.name}: its weights, "
                f"gradients and Adam state need {need_bytes / 1e9:.0f} GB per GPU at tp "
                f"{lay.tp} x pp {lay.pp} x dp {lay.dp}, more than {MEMORY_HEADROOM:.0%} of a "
                f"{gpu.name}'s {gpu.hbm_bytes / 1e9:.0f} GB; add GPUs or raise rl.training.tp/pp")

    def _pass_model(self, stage: str, par: ParallelConfig, model: ModelSpec, *, head: bool,
                    train: bool, num_gpus: int | None = None) -> PassModel:
        cfg = self.cfg
        gpu = self.gpus[cfg.pool_of(stage).name]
        key = (model, gpu, par.tp, head)
        fwd = self._forward_models.get(key)
        if fwd is None:
            # AReaL-TIK's unified kernels slow the attention of training-side passes too.
            fwd = self._forward_models[key] = ForwardModel(
                model, gpu, par.tp, backend=cfg.perf_backend, lm_head=head,
                attention_scale=cfg.system.rollout_prefill_attention_slowdown)
        return PassModel(fwd, self._layout(stage, par, num_gpus), train=train)

    def _inference_passes(self, num_gpus: int | None = None) -> list[tuple[str, PassModel]]:
        """The forward-only passes, over the inference pool or over ``num_gpus`` of it."""
        cfg = self.cfg
        inf = cfg.inference_layout

        def pm(model: ModelSpec, head: bool) -> PassModel:
            return self._pass_model("inference", inf, model, head=head, train=False,
                                    num_gpus=num_gpus)

        inference: list[tuple[str, PassModel]] = []
        if cfg.system.recompute_logprobs:
            inference.append(("old_logprob", pm(self.actor, True)))
        if cfg.use_reference:
            inference.append(("reference", pm(self._model("reference",
                                                          cfg.reference or cfg.actor), True)))
        if cfg.algorithm == "ppo":
            reward = self._model("reward", cfg.reward or cfg.critic or cfg.actor)
            inference.append(("reward", pm(reward, False)))
            inference.append(("critic_values", pm(self._model("critic", cfg.critic or cfg.actor),
                                                  False)))
        return inference

    def _build_passes(self) -> _Passes:
        cfg = self.cfg
        tr = cfg.training
        training: list[tuple[str, PassModel]] = []
        if cfg.algorithm == "ppo":
            critic = self._model("critic", cfg.critic or cfg.actor)
            training.append(("critic_train", self._pass_model("training", tr, critic,
                                                              head=False, train=True)))
        training.append(("actor_train", self._pass_model("training", tr, self.actor, head=True,
                                                         train=True)))
        return _Passes(self._inference_passes(), training)

    # ---- generation ----------------------------------------------------------------------
    def new_record(self, batch: StepBatch) -> Samples:
        """The record of the step whose rollouts start now (appended to ``steps``)."""
        cfg = self.cfg
        n = batch.num_samples
        rec = Samples(batch=batch, version=self.weight_version, gen_start_s=self.sim.now_s,
                      finish_s=np.full(n, math.nan), replica=np.zeros(n, dtype=np.int64),
                      num_generated=np.zeros(n, dtype=np.int64),
                      num_scored=np.zeros(n, dtype=np.int64),
                      num_trained=np.zeros(n, dtype=np.int64),
                      trained_version=np.full(n, -1, dtype=np.int64),
                      done=self.kernel.event())
        rec.group_left = np.full(cfg.num_prompts_per_step, cfg.samples_per_prompt)
        rec.num_left = n
        self.steps.append(rec)
        return rec

    def sample_finished(self, k: int, i: int, finish_s: float) -> None:
        """Sample ``i`` of step ``k`` finished generating at ``finish_s`` (now)."""
        rec = self.steps[k]
        rec.finish_s[i] = finish_s
        rec.num_generated[i] += 1
        group = int(rec.batch.group[i])
        rec.group_left[group] -= 1
        if rec.group_left[group] == 0:
            rec.group_done.append(group)
            wake = rec.wake
            if wake is not None and not wake.fired:
                wake.succeed()
        rec.num_left -= 1
        if rec.tail is not None and rec.num_left <= rec.tail_at and not rec.tail.fired:
            rec.tail.succeed()
        if rec.num_left == 0:
            assert rec.done is not None
            rec.done.succeed()

    def _generation_rows(self, k: int, rec: Samples) -> None:
        for lane, start, end, gpus in self.source.lanes(k, rec):
            self.rows.append(StageRow(k, "generation", self.gen_pool.name, lane, start, end,
                                      gpus))

    # ---- scoring and training ------------------------------------------------------------
    def _seq_lens(self, rec: Samples, groups: list[int]) -> list[int]:
        g = self.cfg.samples_per_prompt
        b = rec.batch
        idx = [p * g + j for p in groups for j in range(g)]
        return (b.prompt_tokens[idx] + b.response_tokens[idx]).tolist()

    def _sample_idx(self, groups: list[int]) -> np.ndarray:
        g = self.cfg.samples_per_prompt
        return np.asarray([p * g + j for p in groups for j in range(g)], dtype=np.int64)

    def score(self, k: int, rec: Samples, groups: list[int], *,
               freed_gpus: int | None = None) -> Process:
        """The inference passes over ``groups`` of step ``k``, one after another, on the
        inference pool, or on ``freed_gpus`` of it while the tail generates (their rows are
        stage ``overlapped_inference``: they overlap generation, so no step-time share)."""
        seqs = self._seq_lens(rec, groups)
        pool = self.cfg.pool_of("inference")
        passes = (self.passes.inference if freed_gpus is None
                  else self._inference_passes(freed_gpus))
        for name, pm in passes:
            r = pm.run(seqs)
            if freed_gpus is None:
                yield from self._stage(k, name, pool, r.time_s, r)
            else:
                start = self.sim.now_s
                yield Timeout(r.time_s)
                self.rows.append(StageRow(k, "overlapped_inference", pool.name,
                                          f"freed:{name}", start, self.sim.now_s, freed_gpus))
        rec.num_scored[self._sample_idx(groups)] += 1

    def _train(self, k: int, rec: Samples, groups: list[int], *, last: bool) -> Process:
        """Forward-backward over ``groups``; the mini-batch's gradient reduction and optimizer
        step when ``last``."""
        seqs = self._seq_lens(rec, groups)
        pool = self.cfg.pool_of("training")
        # Gradients are reduced and applied once the mini-batch is complete.
        results = [(name, pm.run(seqs, optimizer_step=last, reduce_grads=last))
                   for name, pm in self.passes.training]
        if self.fused is not None:
            (_, critic), (_, actor) = results
            time_s, idle_s = self.fused.time_s(actor, critic)
            yield from self._stage(k, "actor_critic_train", pool, time_s)
            self.bubble_s += idle_s
            self.bubble_gpu_s += idle_s * pool.num_gpus
        else:
            for name, r in results:
                yield from self._stage(k, name, pool, r.time_s, r)
        idx = self._sample_idx(groups)
        rec.num_trained[idx] += 1
        rec.trained_version[idx] = k

    def _stage(self, k: int, stage: str, pool: PoolSpec, duration_s: float,
               result: PassResult | None = None) -> Process:
        start = self.sim.now_s
        if duration_s > 0:
            yield Timeout(duration_s)
        row = StageRow(k, stage, pool.name, pool.name, start, start + max(duration_s, 0.0),
                       pool.num_gpus)
        self.rows.append(row)
        if result is not None:
            self.bubble_s += result.bubble_s
            self.bubble_gpu_s += result.bubble_s * pool.num_gpus

    # ---- weights -------------------------------------------------------------------------
    def colocated_sync_s(self) -> float:
        """verl's switch to the rollout layout: the measured ``system.colocated_switch_s`` when
        given, else the resharding alone: every GPU gathers the bf16 weights over the pool
        (NVLink inside a node, the network beyond)."""
        if self.cfg.system.colocated_switch_s is not None:
            return self.cfg.system.colocated_switch_s
        pool = self.gen_pool
        gpu = self.gpus[pool.name]
        n = pool.num_gpus
        if n == 1:
            return 0.0
        bw = gpu.nvlink_bw_bytes_per_s if n <= gpu.num_gpus_per_node else (
            gpu.network_bw_bytes_per_s)
        return self.actor.weight_bytes_per_gpu(1) * (n - 1) / n / bw

    def _ship_weights(self, version: int) -> Process:
        """Disaggregated: the new weights leave the trainer's NICs once and are relayed from
        generation replica to replica in chunks (a pipelined broadcast chain, as StreamRL's
        topology-aware broadcast): the first replica's copy crosses the transfer service,
        each further replica adds one chunk's hop. Version ``version`` is then ready."""
        transfers = self.gen.cluster.transfers
        train = self.cfg.pool_of("training")
        if TRAINER_ENDPOINT not in transfers.egress_bw:
            bw = self.gpus[train.name].network_bw_bytes_per_s * train.num_gpus
            transfers.add_endpoint(TRAINER_ENDPOINT, bw, bw)
        start = self.sim.now_s
        num_bytes = float(self.actor.weight_bytes_per_gpu(1))
        first = self.kernel.event()
        transfers.start(TRAINER_ENDPOINT, 0, num_bytes, first.succeed)
        yield first
        replica_bw = self.gen.setup.link_bw_bytes_per_s
        hops = (self.gen.num_replicas - 1) * min(num_bytes, BROADCAST_CHUNK_BYTES) / replica_bw
        if hops > 0:
            yield Timeout(hops)
        self.rows.append(StageRow(version - 1, "weight_sync", train.name, train.name, start,
                                  self.sim.now_s, train.num_gpus))
        self._weights(version)

    def _weights(self, version: int) -> None:
        self.weight_version = version
        ev = self.weights_ready.setdefault(version, self.kernel.event())
        if not ev.fired:
            ev.succeed()

    def _weights_event(self, version: int) -> Event:
        return self.weights_ready.setdefault(version, self.kernel.event())

    # ---- the stories ---------------------------------------------------------------------
    def colocated(self) -> Process:
        """verl: sync weights, generate, score, train; every stage on every GPU, in turn."""
        cfg = self.cfg
        pool = self.gen_pool
        # ZeRO-3 with a hybrid engine (DeepSpeed-Chat) gathers the sharded weights into the
        # inference layout before every generate call: once per static round.
        syncs = cfg.system.generation_rounds if cfg.training.zero3 else 1
        for k in range(cfg.num_steps):
            yield from self._stage(k, "weight_sync", pool, syncs * self.colocated_sync_s())
            rec = self.source.start_step(k)
            scored: list[int] = []
            if cfg.system.tail_migration_fraction is not None:
                scored = yield from migrate_tail(self, k, rec)
            assert rec.done is not None
            yield rec.done
            self._generation_rows(k, rec)
            gen_end = float(rec.finish_s.max())
            if self.sim.now_s > gen_end:  # the overlapped passes outlasted the tail
                self.rows.append(StageRow(k, "fusion_wait", pool.name, pool.name, gen_end,
                                          self.sim.now_s, pool.num_gpus))
            groups = list(rec.group_done)
            done = set(scored)
            yield from self.score(k, rec, [p for p in groups if p not in done])
            yield from self._train_minibatches(k, rec, groups)
            self._weights(k + 1)
            self.step_end_s.append(self.sim.now_s)

    def _bounds(self) -> list[int]:
        """Mini-batch j holds the groups ``bounds[j]:bounds[j + 1]`` in finish order."""
        p, m = self.cfg.num_prompts_per_step, self.cfg.ppo_mini_batches
        return [round(j * p / m) for j in range(m + 1)]

    def _train_minibatches(self, k: int, rec: Samples, groups: list[int]) -> Process:
        bounds = self._bounds()
        for j in range(self.cfg.ppo_mini_batches):
            yield from self._train(k, rec, groups[bounds[j]:bounds[j + 1]], last=True)

    def generator(self) -> Process:
        """Disaggregated generation: wait for fresh-enough weights, generate, repeat."""
        cfg = self.cfg
        for k in range(cfg.num_steps):
            yield self._weights_event(max(0, k - cfg.system.staleness))
            rec = self.source.start_step(k)
            self.gen_started[k].succeed()
            assert rec.done is not None
            yield rec.done
            self._generation_rows(k, rec)

    def trainer(self) -> Process:
        """Disaggregated training: score and train each step's samples (streamed as groups
        finish, or once the batch is done), then ship the weights."""
        cfg = self.cfg
        bounds = self._bounds()
        for k in range(cfg.num_steps):
            yield self.gen_started[k]
            rec = self.steps[k]
            if not cfg.system.streaming:
                assert rec.done is not None
                yield rec.done
                groups = list(rec.group_done)
                yield from self.score(k, rec, groups)
                yield from self._train_minibatches(k, rec, groups)
            else:
                taken = 0
                for end in bounds[1:]:
                    while taken < end:
                        if len(rec.group_done) <= taken:
                            rec.wake = self.kernel.event()
                            yield rec.wake
                            continue
                        groups = rec.group_done[taken:min(len(rec.group_done), end)]
                        taken += len(groups)
                        yield from self.score(k, rec, groups)
                        yield from self._train(k, rec, groups, last=taken == end)
            self.step_end_s.append(self.sim.now_s)
            yield from self._ship_weights(k + 1)

    # ---- run -----------------------------------------------------------------------------
    def run(self) -> RLResult:
        self.step_end_s: list[float] = []
        self.bubble_s = 0.0
        self.bubble_gpu_s = 0.0
        if self.cfg.colocated:
            self.kernel.start(self.colocated())
        else:
            self.gen_started = [self.kernel.event() for _ in range(self.cfg.num_steps)]
            self.kernel.start(self.generator())
            self.kernel.start(self.trainer())
        self.sim.run()
        if len(self.step_end_s) != self.cfg.num_steps:
            raise RuntimeError(f"the job stopped after {len(self.step_end_s)} of "
                               f"{self.cfg.num_steps} steps (a process waits forever)")
        return RLResult(self, summarize(self))


def run_rl(cfg: RLConfig) -> RLResult:
    """Simulate ``cfg``; returns an ``RLResult`` (summary, stage rows, samples)."""
    return RLJob(cfg).run()
