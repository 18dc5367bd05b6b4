"""Rollout generation on the serving engine: the generation pool's replicas as a ``Cluster``
on the job's simulator, a ``RequestSource`` that submits each step's samples and hears of
every finish, a router that sends each sample where the dispatcher put it, and StreamRL's
skewness-aware dispatcher.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from fleetsim.config import ClusterConfig, PoolConfig, SimConfig
from fleetsim.core.simulator import Simulator
from fleetsim.models import ModelSpec
from fleetsim.perf.scaled import AttentionScaledStepModel
from fleetsim.rl.config import RLConfig
from fleetsim.rl.lengths import StepBatch
from fleetsim.run import build_pools, engine_settings, make_batch_policy, make_ordering
from fleetsim.serving.cluster import PoolSetup, build_cluster
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request
from fleetsim.serving.settings import PlugIns


def generation_sim_config(cfg: RLConfig, model_name: str = "rl-actor") -> SimConfig:
    """The serving config of the generation pool: what ``fleetsim run`` would simulate."""
    pool = cfg.pool_of("generation")
    num_replicas = pool.num_gpus // cfg.generation.tp
    return SimConfig(
        seed=cfg.seed, model=model_name, engine=cfg.generation.engine,
        cluster=ClusterConfig(pools=(PoolConfig(name=pool.name, gpu=pool.gpu,
                                                num_replicas=num_replicas,
                                                tp=cfg.generation.tp),)),
        perf_backend=cfg.perf_backend)


class RolloutSource:
    """Submits samples when told (``submit``) and reports each finish to ``on_sample_done``."""

    wants_finishes = True
    num_requests = None

    def __init__(self, on_sample_done: Callable[[Request], None]) -> None:
        self.on_sample_done = on_sample_done
        self.ctx: Any = None

    def start(self, ctx: Any) -> None:
        self.ctx = ctx

    def on_arrival(self, req: Request, ctx: Any) -> None:
        return None

    def on_finish(self, req: Request, ctx: Any) -> None:
        self.on_sample_done(req)


class AssignedRouter:
    """Sends each request to the replica the dispatcher chose (``replica_by_request``)."""

    def __init__(self) -> None:
        self.replica_by_request: dict[int, int] = {}  # request id -> replica id

    def route(self, view: Any, req: Request, now_s: float) -> int:
        rid = self.replica_by_request.pop(req.id)
        replicas = view.replicas
        if rid < len(replicas) and replicas[rid].replica_id == rid:
            return rid
        return next(i for i, r in enumerate(replicas) if r.replica_id == rid)


class GenerationPool:
    """The generation replicas on ``sim``."""

    def __init__(self, sim: Simulator, cfg: RLConfig, model: ModelSpec,
                 on_sample_done: Callable[[Request], None]) -> None:
        self.cfg = cfg
        scfg = generation_sim_config(cfg)
        setups, self.infos = build_pools(scfg, model)
        sysc = cfg.system
        if sysc.rollout_decode_attention_slowdown != 1.0 or (
                sysc.rollout_prefill_attention_slowdown != 1.0):
            setups = [_scaled(p, sysc.rollout_decode_attention_slowdown,
                              sysc.rollout_prefill_attention_slowdown) for p in setups]
        self.setup = setups[0]
        self.recorder = Recorder(0.0, math.inf)
        self.router = AssignedRouter()
        settings = replace(engine_settings(scfg, model), timeline=(0.0, math.inf))
        plugins = PlugIns(
            make_batch_policy=lambda: make_batch_policy(scfg.policy.batching),
            order_key=make_ordering(scfg.policy.ordering), router=self.router,
            rng=np.random.default_rng(cfg.seed))
        self.cluster = build_cluster(sim, setups, settings, plugins, recorder=self.recorder)
        self.source = RolloutSource(on_sample_done)
        self.cluster.attach_source(self.source)
        self.num_replicas = len(self.cluster.replicas)
        self.step_model = self.setup.step_model
        self.num_kv_blocks = self.setup.num_kv_blocks

    def submit(self, requests: list[Request], replica_of: list[int]) -> None:
        """Submit ``requests`` now, each to its replica (in list order: the queue order)."""
        for req, rid in zip(requests, replica_of, strict=True):
            self.router.replica_by_request[req.id] = rid
            self.cluster.submit_at(self.cluster.now_s, req)

    def new_request(self, prompt: int, response: int) -> Request:
        return Request(id=self.cluster.new_request_id(), arrival_s=self.cluster.now_s,
                       num_prompt_tokens=prompt, max_output_tokens=response)


def _scaled(setup: PoolSetup, decode: float, prefill: float) -> PoolSetup:
    return replace(setup, step_model=AttentionScaledStepModel(setup.step_model, decode=decode,
                                                              prefill=prefill))


# ---- dispatch ----------------------------------------------------------------------------
def round_robin(num_samples: int, num_replicas: int) -> tuple[list[int], list[int]]:
    """Samples in order, replicas in turn (fleetsim's ``round_robin`` router)."""
    order = list(range(num_samples))
    return order, [i % num_replicas for i in order]


def skewness_aware(batch: StepBatch, cfg: RLConfig, pool: GenerationPool,
                   rng: np.random.Generator) -> tuple[list[int], list[int], dict[str, Any]]:
    """StreamRL's Alg. 2: the ranker flags the long-tail prompts, which go to dedicated
    instances, longest predicted first (LPT); the split of instances minimises the larger of
    the two groups' estimated latencies. Returns (sample order, replica per sample, info)."""
    sysc = cfg.system
    n_prompts, g = cfg.num_prompts_per_step, cfg.samples_per_prompt
    resp = batch.response_tokens.reshape(n_prompts, g)
    truth = resp.mean(axis=1)  # what the ranker ranks: a prompt's expected length
    num_long = max(1, round(sysc.long_tail_fraction * n_prompts))
    flagged = _ranker(truth, num_long, sysc.ranker_recall, rng)
    # Longest predicted first: the ranker orders what it flagged (by the true mean here; its
    # errors are in what it flags, see docs/rl.md).
    flagged = sorted(flagged, key=lambda p: -truth[p])
    regular = [p for p in range(n_prompts) if p not in set(flagged)]
    lengths = np.sort(batch.response_tokens)
    l_long = float(np.percentile(lengths, 90))  # L_alpha = P90(D)
    l_reg = float(np.percentile(lengths, 50))  # L_r = P50(D)
    prompt = float(batch.prompt_tokens.mean())
    n = pool.num_replicas
    best: tuple[float, int] | None = None
    for n_long in range(1, n):
        t_long = _instance_latency_s(pool, len(flagged) * g / n_long, l_long, prompt)
        t_reg = _instance_latency_s(pool, len(regular) * g / (n - n_long), l_reg, prompt)
        cand = (max(t_long, t_reg), n_long)
        if best is None or cand < best:
            best = cand
    n_long = best[1] if best is not None else 0
    order: list[int] = []
    replica: list[int] = []
    for k, p in enumerate(flagged):
        for j in range(g):
            order.append(p * g + j)
            replica.append((k * g + j) % n_long if n_long else (k * g + j) % n)
    for k, p in enumerate(regular):
        for j in range(g):
            order.append(p * g + j)
            replica.append(n_long + (k * g + j) % (n - n_long) if n_long else (k * g + j) % n)
    info = {"num_long_tail_instances": n_long, "num_long_tail_prompts": len(flagged),
            "ranker_recall": _recall(flagged, truth, num_long)}
    return order, replica, info


def _ranker(truth: np.ndarray, k: int, recall: float, rng: np.random.Generator) -> list[int]:
    """Flag ``k`` prompts: ``round(recall * k)`` of the true top ``k``, the rest drawn from the
    others (a ranker of the given top-k recall)."""
    top = np.argsort(-truth, kind="stable")
    hits = int(round(recall * k))
    true_top, rest = top[:k], top[k:]
    chosen = list(rng.choice(true_top, size=hits, replace=False)) if hits else []
    misses = k - hits
    if misses and len(rest):
        chosen += list(rng.choice(rest, size=min(misses, len(rest)), replace=False))
    return [int(p) for p in chosen]


def _recall(flagged: list[int], truth: np.ndarray, k: int) -> float:
    top = set(np.argsort(-truth, kind="stable")[:k].tolist())
    return len(top & set(flagged)) / k if k else 1.0


def _instance_latency_s(pool: GenerationPool, num_samples: float, length: float,
                        prompt: float) -> float:
    """StreamRL's instance latency ``PTL(BS) * L * ceil(M / BS)``: the batch is capped by
    max_running and by the KV cache."""
    if num_samples <= 0:
        return 0.0
    eng = pool.cfg.generation.engine
    per_seq_blocks = math.ceil((prompt + length) / eng.block_size)
    bs = max(1, min(eng.max_running, pool.num_kv_blocks // per_seq_blocks,
                    math.ceil(num_samples)))
    kv = int(bs * (prompt + length / 2))
    ptl = pool.step_model.step_time_s((), bs, kv)
    return ptl * length * math.ceil(num_samples / bs)
