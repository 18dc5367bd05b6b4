"""Generation sources: how an RL job's step generates its rollouts (``rl.generation.source``).

A source starts a step's rollouts on the generation pool and tells the job of every sample's
finish (``RLJob.sample_finished``) at the simulated time it happens; the job's stories
(colocated, disaggregated, streaming) wait on those finishes and then score, train and sync
weights as for any source. Two sources:

- ``single_turn``: each sample is one response, submitted to the job's generation replicas
  on the job's own simulator (dispatch, static rounds, padding and RLHFuse's tail migration
  act on it);
- ``agentic``: each sample is a multi-turn trajectory (LLM turn, tool wait, next turn), the
  step's batch rolled out by ``rl.agentic_rollout`` with Heddle's mechanisms or a baseline's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fleetsim.core.process import Process, Timeout
from fleetsim.rl.agentic_rollout import AgenticRolloutConfig, AgenticRollouts
from fleetsim.rl.generation import round_robin, skewness_aware
from fleetsim.rl.lengths import StepBatch, sample_step
from fleetsim.serving.request import Request

if TYPE_CHECKING:
    from fleetsim.rl.job import RLJob, Samples


class GenerationSource(Protocol):
    """Generates each step's rollouts for ``job`` (built with the job, one per job)."""

    num_lane_gpus: int
    """GPUs of the generation lanes (their idle share at a step's tail is reported)."""

    def start_step(self, k: int) -> Samples:
        """Start step ``k``'s rollouts now; returns its record (the job is told of each
        sample's finish through ``RLJob.sample_finished``)."""
        ...

    def on_sample_done(self, req: Request) -> None:
        """A request on the job's generation replicas (``job.gen``) finished."""
        ...

    def lanes(self, k: int, rec: Samples) -> list[tuple[str, float, float, int]]:
        """Step ``k``'s generation lanes once its samples have all finished: (lane, start_s,
        end_s, num_gpus), one per worker that generated."""
        ...

    def busy_gpu_s(self) -> float:
        """GPU-seconds the generation lanes computed over the whole job."""
        ...

    def report(self, mean_response_tokens: float, max_response_tokens: int) -> dict[str, Any]:
        """The summary's ``generation`` section."""
        ...


GENERATION_SOURCES: dict[str, type[GenerationSource]] = {}


def register_source(name: str) -> Any:
    def deco(cls: type[GenerationSource]) -> type[GenerationSource]:
        if name in GENERATION_SOURCES:
            raise ValueError(f"duplicate generation source {name!r}")
        GENERATION_SOURCES[name] = cls
        return cls
    return deco


def make_source(name: str, job: RLJob) -> GenerationSource:
    return GENERATION_SOURCES[name](job)  # type: ignore[call-arg]


@register_source("single_turn")
class SingleTurnSource:
    """One response per sample on the job's generation replicas (verl's rollout)."""

    def __init__(self, job: RLJob) -> None:
        self.job = job
        self._req_sample: dict[int, tuple[int, int]] = {}  # request id -> (step, sample)
        self.num_lane_gpus = job.gen.num_replicas * job.cfg.generation.tp

    def start_step(self, k: int) -> Samples:
        """Draw step ``k``'s batch and submit it now."""
        job = self.job
        cfg = job.cfg
        gen = job.gen
        batch = sample_step(cfg, job.rng)
        rec = job.new_record(batch)
        n = batch.num_samples
        if cfg.system.dispatch == "skewness_aware" and gen.num_replicas > 1:
            order, replica, info = skewness_aware(batch, cfg, gen, job.dispatch_rng)
            job.dispatch_info.append(info)
        else:
            order, replica = round_robin(n, gen.num_replicas)
        rec.replica[order] = replica
        rec.request_id = np.full(n, -1, dtype=np.int64)
        if cfg.system.tail_migration_fraction is not None:
            rec.tail = job.kernel.event()
            rec.tail_at = math.ceil(cfg.system.tail_migration_fraction * n)
        # Static rounds (DeepSpeed-Chat): whole groups per round, in dispatch order.
        rounds = cfg.system.generation_rounds
        g = cfg.samples_per_prompt
        bounds = [round(j * cfg.num_prompts_per_step / rounds) * g for j in range(rounds + 1)]
        rec.rounds = [(order[a:b], replica[a:b]) for a, b in zip(bounds, bounds[1:],
                                                                   strict=False)][::-1]
        if cfg.system.pad_to_longest:
            # A static batch computes every row until its longest ends (padding tokens).
            resp = batch.response_tokens.copy()
            for idx, _ in rec.rounds:
                rows = np.asarray(idx, dtype=np.int64)
                if len(rows):
                    resp[rows] = resp[rows].max()
            rec.batch = StepBatch(batch.prompt_tokens, resp, batch.group)
        self.submit_round(k, rec)
        return rec

    def submit_round(self, k: int, rec: Samples) -> None:
        order, replica = rec.rounds.pop()
        reqs = []
        for i in order:
            req = self.job.gen.new_request(int(rec.batch.prompt_tokens[i]),
                                           int(rec.batch.response_tokens[i]))
            self._req_sample[req.id] = (k, i)
            rec.request_id[i] = req.id
            reqs.append(req)
        rec.round_left = len(reqs)
        self.job.gen.submit(reqs, replica)

    def on_sample_done(self, req: Request) -> None:
        k, i = self._req_sample.pop(req.id)
        self.job.sample_finished(k, i, req.finish_s)
        # (the job's waiters resume through the kernel, so the next round is in before them)
        rec = self.job.steps[k]
        rec.round_left -= 1
        if rec.round_left == 0 and rec.rounds:
            self.submit_round(k, rec)

    def lanes(self, k: int, rec: Samples) -> list[tuple[str, float, float, int]]:
        gpus = self.job.cfg.generation.tp
        out = []
        for r in range(self.job.gen.num_replicas):
            mask = rec.replica == r
            end = rec.lane_end_s.get(r, float(rec.finish_s[mask].max()) if mask.any() else None)
            if end is not None:
                out.append((f"gen-{r}", rec.gen_start_s, end, gpus))
        return out

    def busy_gpu_s(self) -> float:
        # (the recorder's own dict: ``records()`` would sort and copy every request's row)
        busy = self.job.gen.recorder.busy_s_by_replica
        return self.job.cfg.generation.tp * sum(busy.values())

    def report(self, mean_response_tokens: float, max_response_tokens: int) -> dict[str, Any]:
        job = self.job
        records = job.gen.recorder.records()
        return {"num_replicas": job.gen.num_replicas, "tp": job.cfg.generation.tp,
                "num_kv_blocks": job.gen.num_kv_blocks,
                "mean_response_tokens": mean_response_tokens,
                "max_response_tokens": max_response_tokens,
                "num_preemptions": int(np.sum(records.requests.get("num_preemptions", 0))),
                "dispatch": job.dispatch_info[:1],
                "perf_sources": job.gen.infos[0].get("perf_sources", {})}


@register_source("agentic")
class AgenticSource:
    """Each step's batch as multi-turn trajectories (``rl.agentic_rollout``), rolled out on
    the generation pool's GPUs split into workers (every worker at ``generation.tp``, a
    fixed ``split``, or Heddle's resource manager's per step).

    Each rollout is simulated on its own (the serving engine's ``simulate``, fresh workers)
    and its trajectories' finishes are then replayed into the job's clock from the step's
    start. That is exact for the step's timing: the rollout holds the generation pool's GPUs
    alone (the job's stories never share them with another stage during generation), and
    nothing it cached survives the step (the next step's weights invalidate the KV). The
    mechanisms that reshape a single-turn batch (skewness-aware dispatch, static rounds,
    padding, tail migration) are rejected by the config, not ignored."""

    def __init__(self, job: RLJob) -> None:
        self.job = job
        self.num_lane_gpus = job.gen_pool.num_gpus
        self.rollouts = AgenticRollouts(rollout_config(job.cfg))
        self.summaries: list[dict[str, Any]] = []
        self.splits: list[tuple[int, ...]] = []
        self._busy_gpu_s = 0.0
        self._lane_end_s: list[dict[int, float]] = []  # per step: worker -> its last finish

    def start_step(self, k: int) -> Samples:
        job = self.job
        result = self.rollouts.next()
        driver, programs = result.driver, result.driver.batch.programs
        first = np.asarray([p.calls[0].num_prompt_tokens for p in programs], dtype=np.int64)
        # A trajectory's training sequence is its whole final context: the first prompt,
        # every turn's output and every tool result between them.
        final = np.asarray([p.calls[-1].num_prompt_tokens + p.calls[-1].num_output_tokens
                            for p in programs], dtype=np.int64)
        rec = job.new_record(StepBatch(prompt_tokens=first, response_tokens=final - first,
                                       group=driver.batch.group.copy()))
        rec.replica[:] = driver.worker_of_last
        req = result.records.requests
        ends: dict[int, float] = {}
        for rid, end in zip(req["replica_id"].tolist(), req["finish_s"].tolist(), strict=True):
            ends[rid] = max(end, ends.get(rid, 0.0))
        self._lane_end_s.append(ends)
        self.splits.append(result.split)
        self.summaries.append(result.summary)
        self._busy_gpu_s += sum(result.split[w] * s
                                for w, s in result.records.busy_s_by_replica.items())
        job.kernel.start(self._finishes(k, np.asarray(driver.finish_s, dtype=np.float64)))
        return rec

    def on_sample_done(self, req: Request) -> None:
        raise RuntimeError(f"request {req.id} finished on the job's generation replicas: the "
                           f"agentic source rolls out on its own workers and submits none")

    def _finishes(self, k: int, finish_s: np.ndarray) -> Process:
        """Tell the job of each trajectory's finish at the step's start plus its time in the
        rollout, in finish order (ties by trajectory)."""
        sim = self.job.sim
        start = sim.now_s
        for i in np.argsort(finish_s, kind="stable").tolist():
            wait = start + float(finish_s[i]) - sim.now_s
            if wait > 0:
                yield Timeout(wait)
            self.job.sample_finished(k, i, sim.now_s)

    def lanes(self, k: int, rec: Samples) -> list[tuple[str, float, float, int]]:
        split = self.splits[k]
        return [(f"gen-{w}", rec.gen_start_s, rec.gen_start_s + end, split[w])
                for w, end in sorted(self._lane_end_s[k].items())]

    def busy_gpu_s(self) -> float:
        return self._busy_gpu_s

    def report(self, mean_response_tokens: float, max_response_tokens: int) -> dict[str, Any]:
        keys = ("rollout_s", "num_generated_tokens", "tokens_per_s", "num_preemptions",
                "critical_path_s")
        return {"source": "agentic",
                "num_replicas": [len(s) for s in self.splits],
                "split_by_step": [list(s) for s in self.splits],
                "mean_response_tokens": mean_response_tokens,
                "max_response_tokens": max_response_tokens,
                "num_preemptions": sum(s["num_preemptions"] for s in self.summaries),
                "rollout_by_step": [{k: s[k] for k in keys}
                                    | {"num_migrations": s["migration"]["num_migrations"]}
                                    for s in self.summaries],
                "perf_sources": self.job.gen.infos[0].get("perf_sources", {})}


def rollout_config(cfg: Any) -> AgenticRolloutConfig:
    """The agentic rollout of one step of the RL job ``cfg`` (an ``RLConfig``): its actor on
    the generation pool, the job's batch shape and lengths, ``generation.agentic``'s system;
    each turn capped at ``max_response_tokens`` (a generate call's ``max_tokens``)."""
    opts, gen = cfg.generation.agentic, cfg.generation
    pool = cfg.pool_of("generation")
    return AgenticRolloutConfig(
        model=cfg.actor, gpu=pool.gpu, num_gpus=pool.num_gpus, tp=gen.tp,
        scheduling=opts.scheduling, placement=opts.placement, migration=opts.migration,
        resource_manager=opts.resource_manager, tp_choices=opts.tp_choices,
        anneal_steps=opts.anneal_steps, split_scoring=opts.split_scoring,
        num_replayed=opts.num_replayed, split=opts.split, preemption_mode=opts.preemption_mode,
        skew_threshold=opts.skew_threshold,
        trajectories=opts.trajectory_args(cfg.num_prompts_per_step, cfg.samples_per_prompt,
                                          cfg.lengths.run, cfg.lengths.scale,
                                          cfg.max_response_tokens),
        predictor=opts.predictor, engine=gen.engine, seed=cfg.seed)
