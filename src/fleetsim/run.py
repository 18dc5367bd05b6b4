"""``run(config)``: build the replica a ``SimConfig`` describes, simulate it, summarize.

Writing files is the CLI's job; this returns everything in memory, config included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetsim.config import PoolConfig, SimConfig
from fleetsim.configutil import to_plain
from fleetsim.errors import FleetsimInputError
from fleetsim.esp.cost import EspCostModel, EspStepModel
from fleetsim.expert_pool import shared_expert_pools
from fleetsim.hardware import GPUSpec, get_gpu
from fleetsim.metrics.overload import overload_check
from fleetsim.metrics.summary import distribution, summarize, timeline_bins
from fleetsim.models import ModelSpec, get_model
from fleetsim.models.quantization import quantize
from fleetsim.models.speculative import SpeculativeConfig, tokens_per_step
from fleetsim.moe.serving import EpStepModel, PoolEpConfig
from fleetsim.moe.wide_ep import DpAttentionStepModel, wide_ep_kv_capacity_blocks
from fleetsim.native import engine_build
from fleetsim.perf import TableStepModel, kv_capacity_blocks
from fleetsim.perf.base import StepTimeModel
from fleetsim.perf.pipeline import (
    PipelineStepModel,
    pipeline_kv_capacity_blocks,
    stage_layer_ranges,
    stage_spec,
)
from fleetsim.perf.plugins import make_step_model
from fleetsim.perf.speculative import speculative_step_model
from fleetsim.policies import make_batch_policy, make_group_planner, make_ordering
from fleetsim.policies.eviction import make_eviction
from fleetsim.policies.planners import make_planner, make_trigger
from fleetsim.policies.routing import make_router
from fleetsim.programs.metrics import program_summary
from fleetsim.programs.runtime import program_source
from fleetsim.registry import plugin_error
from fleetsim.serving.agent_flows import AgentTrafficSource, agent_frame, agent_summary
from fleetsim.serving.cluster import PoolSetup, ProgressFn, simulate
from fleetsim.serving.elastic_control import (
    ControlSettings,
    ElasticController,
    GpuChange,
    elastic_pools,
)
from fleetsim.serving.groups import GroupSetup
from fleetsim.serving.kv_keep import KVRetention
from fleetsim.serving.recorder import Records
from fleetsim.serving.replay import WindowReplayer
from fleetsim.serving.settings import EngineSettings, PlugIns
from fleetsim.serving.sources import ClosedLoopSource, TrackingSource, WorkloadSource
from fleetsim.serving.speculative import Emission
from fleetsim.soc_pools import soc_pools
from fleetsim.workloads import Workload, build_workload
from fleetsim.workloads.transforms import fit_context

PROGRAM_HORIZON_S = 1e15
"""The end of a program run without ``until_s`` (see ``run``): far beyond any simulation."""


@dataclass(frozen=True, slots=True, eq=False)
class RunResult:
    """What a run produced: the resolved config, the summary and the per-request records."""

    config: dict[str, Any]
    summary: dict[str, Any]
    records: Records
    workload: Workload
    unfinished: list[Any] = field(default_factory=list)
    """Requests that arrived but had not finished when the run stopped (``until_s``)."""
    programs: dict[str, Any] | None = None
    """Program runs: one row per program (``ProgramSource.records``: JCT, T_w, ...)."""


def seed_streams(seed: int, names: tuple[str, ...]) -> dict[str, np.random.Generator]:
    """One independent generator per named stream, derived from one seed in a fixed order."""
    children = np.random.SeedSequence(seed).spawn(len(names))
    return {name: np.random.default_rng(child) for name, child in zip(names, children, strict=True)}


def check_fits(workload: Workload, model: ModelSpec, num_kv_blocks: int, block_size: int) -> None:
    """Every request must fit the model's context and, alone, the largest KV cache it can be
    routed to (``num_kv_blocks``)."""
    total = workload.num_prompt_tokens + workload.num_output_tokens
    too_long = np.flatnonzero(total > model.max_context_tokens)
    if too_long.size:
        i = int(too_long[0])
        raise FleetsimInputError(
            f"workload request {i} (row {i + 1} after slicing)",
            f"{int(workload.num_prompt_tokens[i])} prompt + "
            f"{int(workload.num_output_tokens[i])} output tokens",
            f"the model {model.name} takes at most {model.max_context_tokens} tokens; "
            f"filter the trace or pick a longer-context model",
        )
    blocks = -(-total // block_size)
    too_big = np.flatnonzero(blocks > num_kv_blocks)
    if too_big.size:
        i = int(too_big[0])
        raise FleetsimInputError(
            f"workload request {i}", f"{int(total[i])} tokens ({int(blocks[i])} KV blocks)",
            f"the replica holds only {num_kv_blocks} blocks; raise hardware.tp, use a GPU "
            f"with more memory, or set engine.num_kv_blocks",
        )


def _largest_reachable_blocks(pools: list[PoolSetup]) -> int:
    """KV blocks of the largest replica every request can reach: routers skip replicas too
    small for a request, so it must fit the largest entry replica and, with P/D, the largest
    decode replica."""
    largest = max(p.num_kv_blocks for p in pools if p.role != "decode")
    decode = [p.num_kv_blocks for p in pools if p.role == "decode"]
    return min(largest, max(decode)) if decode else largest


def _check_budget_covers_prompts(config: SimConfig, workload: Workload) -> None:
    """A planner that never splits a prompt needs every prompt (plus outputs, recomputed after
    a preemption) to fit one step's token budget."""
    if getattr(make_batch_policy(config.policy.batching), "splits_prompts", True):
        return
    budget = config.engine.max_batched_tokens
    total = workload.num_prompt_tokens + workload.num_output_tokens
    worst = int(np.argmax(total))
    if total[worst] > budget:
        raise FleetsimInputError(
            f"workload request {worst}", f"{int(total[worst])} tokens",
            f"policy {config.policy.batching.name!r} never splits a prompt, so "
            f"engine.max_batched_tokens ({budget}) must cover it; raise it or enable "
            f"chunked prefill")


def _pool_error(where: str, err: FleetsimInputError) -> FleetsimInputError:
    if err.where.startswith("engine."):  # an engine limit, the same for every pool
        return err
    return FleetsimInputError(f"{where}: {err.where}", err.value, err.fix)


def pool_step_model(config: SimConfig, model: ModelSpec, gpu: GPUSpec, tp: int, pp: int = 1,
                    *, speculate: bool = True) -> StepTimeModel:
    """The step model ``config.engine`` names, for one replica of ``tp`` x ``pp`` ``gpu``s
    (``speculate=False``: without ``engine.speculative``, for a caller that wraps more first)."""
    eng = config.engine
    model = quantize(model, config.quantization, eng.kv_cache_dtype)
    step_model = make_step_model(eng.step_model.name, eng.step_model.args, model, gpu, tp,
                                 backend=config.perf_backend,
                                 step_overhead_s=eng.step_overhead_s,
                                 step_overhead_per_seq_s=eng.step_overhead_per_seq_s,
                                 kernel_time_scale=eng.kernel_time_scale,
                                 async_scheduling=eng.async_scheduling,
                                 async_step_gap_s=eng.async_step_gap_s, pp=pp)
    if eng.speculative is not None and speculate:
        step_model = speculative_step_model(step_model, model, eng.speculative)
    return step_model


def speculative_emission(spec: SpeculativeConfig | None) -> Emission | None:
    """The engine's emission schedule for ``engine.speculative`` (None: off)."""
    if spec is None:
        return None
    tau = tokens_per_step(spec)
    return Emission(tau.numerator, tau.denominator, spec.num_speculative_tokens,
                    spec.uses_draft_kv)


def engine_settings(config: SimConfig, model: ModelSpec) -> EngineSettings:
    """The engine ``config.engine`` describes, as every replica of the cluster shares it (the
    run's own options, such as ``until_s`` or kept KV, are added by the caller)."""
    eng = config.engine
    return EngineSettings(
        block_size=eng.block_size, max_batched_tokens=eng.max_batched_tokens,
        max_running=eng.max_running, enable_prefix_caching=eng.enable_prefix_caching,
        fast_forward=eng.fast_forward, debug=eng.debug,
        kv_bytes_per_token=float(model.kv_bytes_per_token()),
        link_latency_s=config.cluster.link.latency_s,
        speculative=speculative_emission(eng.speculative))


def build_pools(config: SimConfig, model: ModelSpec) -> tuple[list[PoolSetup], list[dict]]:
    """Runtime pools (step model, KV blocks, link bandwidth) and their descriptions."""
    if config.cluster.soc is not None:
        return soc_pools(config, model)
    eng, link = config.engine, config.cluster.link
    model = quantize(model, config.quantization, eng.kv_cache_dtype)
    setups: list[PoolSetup] = []
    infos: list[dict] = []
    gpus = {}
    for i, pool in enumerate(config.pools):
        where = f"cluster.pools[{i}] ({pool.name})" if config.cluster.pools else "hardware"
        try:
            gpu = get_gpu(pool.gpu, config.hardware.catalog)
            # Step models wrap one another: speculation goes outermost, so that its verify
            # pass is priced through the pipeline's stages and the EP model's experts.
            step_model = pool_step_model(config, model, gpu, pool.tp, pool.pp, speculate=False)
            if pool.dp_attention > 1:
                step_model, num_kv_blocks = wide_ep_pool(config, model, gpu, pool, step_model)
            elif pool.ep is not None and pool.pp > 1:
                step_model = pipeline_with_ep(config, model, gpu, pool, step_model)
            elif pool.ep is not None:
                step_model = EpStepModel(step_model, model, gpu, pool.tp, pool.ep,
                                         seed=config.seed)
            if eng.speculative is not None:  # dp_attention refused it above
                step_model = speculative_step_model(step_model, model, eng.speculative)
            if pool.dp_attention > 1:
                pass  # wide_ep_pool sized the ranks' KV
            elif pool.pp > 1:
                num_kv_blocks = eng.num_kv_blocks or pipeline_kv_capacity_blocks(
                    model, gpu, pool.tp, pool.pp, eng.block_size, eng.gpu_memory_utilization,
                    max_batched_tokens=eng.max_batched_tokens)
            else:
                num_kv_blocks = eng.num_kv_blocks or kv_capacity_blocks(
                    model, gpu, pool.tp, eng.block_size, eng.gpu_memory_utilization,
                    max_batched_tokens=eng.max_batched_tokens)
        except FleetsimInputError as err:
            raise _pool_error(where, err) from None
        gpus[pool.name] = gpu
        per_gpu_bw = link.bw_bytes_per_s or (
            gpu.nvlink_bw_bytes_per_s if link.placement == "intra_node"
            else gpu.network_bw_bytes_per_s)
        # a replica's GPUs: every one sends its KV shard
        num_gpus = pool.tp * pool.pp * pool.dp_attention
        setups.append(PoolSetup(
            name=pool.name, role=pool.role, num_replicas=pool.num_replicas,
            step_model=step_model, num_kv_blocks=num_kv_blocks,
            link_bw_bytes_per_s=per_gpu_bw * num_gpus,
            num_host_kv_blocks=host_kv_blocks(model, pool.tp, eng.block_size,
                                              eng.swap_space_gib, pool.pp),
            host_bw_bytes_per_s=(eng.host_link_bw_bytes_per_s
                                 or gpu.pcie_bw_bytes_per_s) * num_gpus,
            host_latency_s=(eng.host_link_latency_s if eng.host_link_latency_s is not None
                            else gpu.pcie_latency_s)))
        infos.append({
            "name": pool.name, "gpu": gpu.name, "role": pool.role,
            "num_replicas": pool.num_replicas, "tp": pool.tp,
            **({"pp": pool.pp} if pool.pp > 1 else {}),  # default output reads as it did
            **({"dp_attention": pool.dp_attention} if pool.dp_attention > 1 else {}),
            "num_kv_blocks": num_kv_blocks,
            "usd_per_hour": gpu.price_per_hour_usd * num_gpus * pool.num_replicas,
            "perf_sources": dict(getattr(step_model, "sources", {})),
            **({"ep_balance_ratio": step_model.balance_ratio}
               if isinstance(step_model, EpStepModel | DpAttentionStepModel) else {}),
            **({"ep_balance_ratio": step_model.ep_balance_ratio}
               if getattr(step_model, "ep_balance_ratio", None) is not None else {}),
        })
    _check_link_reachable(config, gpus)
    if config.cluster.expert_pool is not None:
        _check_expert_pool_alone(config)
        setups = shared_expert_pools(config, model, setups, infos)
    return setups, infos


def _check_expert_pool_alone(config: SimConfig) -> None:
    """A shared expert pool prices its pools' steps with its own cost model
    (``moe/expertplex.py``), so a setting that changes how a step is priced or which replicas
    exist would be silently dropped: refuse it in one line instead."""
    clashes = (
        ("engine.speculative", config.engine.speculative is not None
         and config.engine.speculative.method),
        ("hardware.pp", next((p.pp for p in config.pools if p.pp > 1), None)),
        ("hardware.dp_attention", next((p.dp_attention for p in config.pools
                                        if p.dp_attention > 1), None)),
        ("elastic", config.elastic is not None and "[elastic]"),
        ("group", config.group is not None and "[group]"),
    )
    for where, value in clashes:
        if value:
            raise FleetsimInputError(where, value, "cluster.expert_pool prices its own steps "
                                     f"and keeps its pools fixed; remove {where} or "
                                     "cluster.expert_pool")


def wide_ep_pool(config: SimConfig, model: ModelSpec, gpu: GPUSpec, pool: PoolConfig,
                 step_model: StepTimeModel) -> tuple[StepTimeModel, int]:
    """The step model and KV blocks of a replica of ``dp_attention`` attention ranks with its
    experts over all their GPUs (``moe/wide_ep.py``); ``hardware.ep`` tunes the balancer."""
    eng = config.engine
    if eng.speculative is not None:
        # Each attention rank's decode is priced from the one-token-per-sequence terms
        # (decode_terms_s) that the wide-EP model balances across ranks; a verify pass of
        # k + 1 positions has no such terms yet.
        raise FleetsimInputError("engine.speculative", eng.speculative.method,
                                 "speculative decoding is not priced with dp_attention: the "
                                 "wide-EP model prices a rank's decode at one position per "
                                 "sequence; remove dp_attention or engine.speculative")
    if not hasattr(step_model, "decode_terms_s"):
        raise FleetsimInputError("dp_attention", pool.dp_attention, "attention data "
                                 "parallelism needs the table step model; unset "
                                 "engine.step_model")
    # The layout is expert-parallel by definition; without an ep table, vLLM's default for
    # --enable-expert-parallel: static placement, no redundant experts (EPLB is opt-in).
    ep = pool.ep or PoolEpConfig(balancer="none", num_spare_slots_per_gpu=0)
    # the EP grid covers the largest step the engine can form (beyond it, linear)
    max_tokens = max(16384, eng.max_batched_tokens, eng.max_running)
    out = DpAttentionStepModel(step_model, model, gpu, pool.tp, pool.dp_attention, ep,
                               max_tokens=max_tokens, seed=config.seed)
    blocks = eng.num_kv_blocks or wide_ep_kv_capacity_blocks(
        model, gpu, pool.tp, pool.dp_attention, eng.block_size, eng.gpu_memory_utilization,
        max_batched_tokens=eng.max_batched_tokens,
        num_spare_slots_per_gpu=ep.num_spare_slots_per_gpu)
    return out, blocks


def pipeline_with_ep(config: SimConfig, model: ModelSpec, gpu: GPUSpec, pool: PoolConfig,
                     pipeline: StepTimeModel) -> StepTimeModel:
    """A pipeline replica whose stages spread their experts over their ``tp`` GPUs (vLLM's
    expert parallelism with PP: the EP group is a stage's TP group, inside a node): the EP
    model of the whole replica priced once, each stage taking its share of the MoE layers."""
    if not isinstance(pipeline, PipelineStepModel):  # make_step_model refuses plug-ins at pp>1
        raise FleetsimInputError("pp", pool.pp, "expert parallelism with pp needs the table "
                                 "step model")
    whole = EpStepModel(pool_step_model(config, model, gpu, pool.tp, speculate=False), model,
                        gpu, pool.tp, pool.ep, seed=config.seed)
    out = pipeline.with_moe_delta(whole._moe_delta_s, model.num_moe_layers,
                                  whole.sources["moe"] + " (per stage, its MoE layers)")
    out.ep_balance_ratio = whole.balance_ratio
    return out


def group_setup(config: SimConfig, model: ModelSpec, pools: list[PoolSetup]) -> GroupSetup:
    """The instance group ``config.group`` describes over the one pool's replicas: its
    planner, and members of k instances priced by the ESP step model over the pool's own."""
    group = config.group
    assert group is not None
    pool = config.pools[0]
    step = pools[0].step_model
    if not isinstance(step, TableStepModel):
        raise FleetsimInputError("group.step_model", group.step_model,
                                 "esp prices a member from the built-in table step model; "
                                 "unset engine.step_model, hardware.ep, hardware.pp and "
                                 "engine.speculative")
    cost = EspCostModel(model, get_gpu(pool.gpu, config.hardware.catalog), pool.tp, step=step)
    by_degree: dict[int, EspStepModel] = {}

    def step_model_for(k: int) -> EspStepModel:
        if k not in by_degree:
            by_degree[k] = EspStepModel(cost, k, group.min_compute_bound_batch)
        return by_degree[k]

    return GroupSetup(planner=make_group_planner(group.planner), step_model_for=step_model_for,
                      kv_move_s=cost.migration_s,
                      step_model_key=("esp", cost.key, group.min_compute_bound_batch))


def _check_swap_space(config: SimConfig) -> None:
    """A planner that swaps needs a host tier."""
    policy = make_batch_policy(config.policy.batching)
    if getattr(policy, "preemption_mode", "recompute") == "swap" and (
            config.engine.swap_space_gib <= 0):
        raise FleetsimInputError(
            "engine.swap_space_gib", config.engine.swap_space_gib,
            "policy.batching.args.preemption_mode = \"swap\" needs host memory for the KV it "
            "swaps out; set engine.swap_space_gib (vLLM's default is 4)")


def _kv_retention(config: SimConfig) -> KVRetention | None:
    """How replicas keep a program call's KV across its tool wait (``programs.tool_kv``)."""
    programs = config.programs
    if programs is None or programs.tool_kv == "drop":
        return None
    if not config.engine.enable_prefix_caching:
        raise FleetsimInputError(
            "programs.tool_kv", programs.tool_kv,
            "kept KV is reused through the prefix cache; set engine.enable_prefix_caching = "
            "true or use tool_kv = \"drop\"")
    if programs.tool_kv == "offload" and config.engine.swap_space_gib <= 0:
        raise FleetsimInputError(
            "programs.tool_kv", "offload",
            "offloaded KV goes to host memory; set engine.swap_space_gib (vLLM's default is "
            "4) or use tool_kv = \"keep\"")
    return KVRetention(mode=programs.tool_kv, ttl_s=programs.kv_ttl_s)


def host_kv_blocks(model: ModelSpec, tp: int, block_size: int, swap_space_gib: float,
                   pp: int = 1) -> int:
    """KV blocks of a replica's host tier: ``swap_space_gib`` per GPU, as vLLM sizes its
    swap space (each GPU swaps its own shard of every block: its heads of its stage's
    layers, the largest stage's setting the count)."""
    if pp > 1:
        a, b = max(stage_layer_ranges(model.num_layers, pp), key=lambda r: r[1] - r[0])
        model = stage_spec(model, a, b)
    block_bytes_per_gpu = model.kv_bytes_per_token_per_gpu(tp) * block_size
    return int(swap_space_gib * 2**30 // block_bytes_per_gpu)


def _check_link_reachable(config: SimConfig, gpus: dict) -> None:
    """NVLink joins GPUs of one node only: P and D replicas must share a node's type and fit
    in it together."""
    if config.cluster.link.placement != "intra_node":
        return
    pre = [p for p in config.pools if p.role == "prefill"]
    dec = [p for p in config.pools if p.role == "decode"]
    for p in pre:
        for d in dec:
            gp, gd = gpus[p.name], gpus[d.name]
            if gp.name != gd.name or p.tp * p.pp + d.tp * d.pp > gp.num_gpus_per_node:
                raise FleetsimInputError(
                    "cluster.link.placement", "intra_node",
                    f"pools {p.name} ({gp.name} x{p.tp}) and {d.name} ({gd.name} x{d.tp}) "
                    f"cannot share one NVLink node; use placement = \"inter_node\"")


def run(config: SimConfig, progress: Callable[..., None] | None = None, *,
        workload: Workload | None = None) -> RunResult:
    """Simulate ``config``; ``progress`` (optional) is called now and then with the
    simulated time, the first and the last arrival time (s).

    ``workload`` (optional): requests built in memory, which stand in for the trace or
    generator ``config.workload`` names (its ``rate_scale``, slicing and ``over_long`` still
    apply, as to a trace file holding them; their arrival times are kept as they are, where a
    trace file's are rebased to start at 0 s); the result's config then names it under
    ``workload.given``."""
    if workload is not None and config.programs is not None:
        raise ValueError("run(): pass either a workload or a config with programs, not both "
                         "(programs make their own requests)")
    given = workload
    streams = seed_streams(config.seed, ("workload", "routing"))
    eng = config.engine
    model = quantize(get_model(config.model), config.quantization, eng.kv_cache_dtype)
    pools, pool_infos = build_pools(config, model)
    source: Any = None
    num_over_long = 0
    if config.programs is not None:  # programs replace the workload (their calls stand in)
        source, workload = program_source(config.programs, streams["workload"], model, pools,
                                          eng.max_batched_tokens, config.cluster.link.latency_s)
    elif config.agent_traffic is not None:  # the source makes the requests, as they finish
        traffic = config.agent_traffic.traffic(config.seed)
        source, workload = AgentTrafficSource(traffic), agent_frame(traffic)
    else:
        workload = build_workload(config.workload, streams["workload"], given)
    if config.programs is None and config.workload.over_long != "error":
        workload, num_over_long = fit_context(workload, model.max_context_tokens,
                                              config.workload.over_long)
        if not len(workload):
            raise FleetsimInputError("workload.over_long", "drop",
                                     f"every request exceeds the {model.max_context_tokens:,}"
                                     f"-token context of {model.name}; use clip")
    if workload.hash_ids is not None and workload.hash_block_tokens % eng.block_size:
        raise FleetsimInputError(
            "engine.block_size", eng.block_size,
            f"must divide the trace's hash block of {workload.hash_block_tokens} tokens")
    group = group_setup(config, model, pools) if config.group is not None else None
    if group is not None:  # members: the one pool's instances, each step model the group's
        pools = [replace(pools[0], step_model=group.step_model_for(1))]
    reachable = (pools[0].num_kv_blocks * pools[0].num_replicas if group is not None
                 else _largest_reachable_blocks(pools))
    check_fits(workload, model, reachable, eng.block_size)
    _check_budget_covers_prompts(config, workload)
    _check_swap_space(config)
    kv_retention = _kv_retention(config)
    if config.policy.ordering == "priority" and workload.priority is None:
        raise FleetsimInputError("policy.ordering", "priority", "the workload has no priority "
                                 "column; add one to the trace or use fcfs")
    until_s = config.until_s if config.until_s is not None else math.inf
    if config.programs is not None and until_s == math.inf:
        # A program's next call waits for its parents' finishes, so the source must hear of
        # each when it happens: give program runs a far end (the engine's idle windows also
        # stop at finishes whenever a source listens to them).
        until_s = PROGRAM_HORIZON_S
    if source is None:
        source = (ClosedLoopSource(workload, config.workload.max_concurrency)
                  if config.workload.max_concurrency is not None else WorkloadSource(workload))
    tracker = TrackingSource(source) if until_s < math.inf and config.programs is None else None
    router = make_router(config.cluster.router)
    decode_router = make_router(config.cluster.decode_router, "cluster.decode_router")
    try:
        settings = replace(
            engine_settings(config, model), track_itl=eng.track_itl,
            frontend_overhead_s=config.cluster.frontend_overhead_s, kv_retention=kv_retention,
            until_s=until_s)
        plugins = PlugIns(
            make_batch_policy=lambda: make_batch_policy(config.policy.batching),
            order_key=make_ordering(config.policy.ordering), router=router,
            decode_router=decode_router, eviction_key=make_eviction(config.policy.eviction),
            rng=streams["routing"])
        elastic = _elastic_controller(config, model, pools, float(workload.arrival_s[0]))
        if elastic is not None:
            _bind_replayer(config, elastic, pools, settings, plugins)
        records, cluster = simulate(workload, pools, settings, plugins,
                                    progress=_progress(progress, workload),
                                    source=tracker or source, group=group,
                                    controllers=[elastic] if elastic is not None else ())
    except Exception as err:  # a user plug-in that raised: name the config field that loaded it
        raise plugin_error(err, _plugin_names(config)) or err from None
    if config.programs is not None:
        num_arrived = source.num_arrived(until_s)
    elif config.agent_traffic is not None:  # every request issued runs to its end
        num_arrived = len(records.requests["request_id"])
    else:
        num_arrived = tracker.num_arrived if tracker is not None else len(workload)
    replica_pool = cluster.pool_of
    # (the summary's timeline and the one pool's are merged from the same recorded bins)
    timeline_cache: dict = {}
    summary = summarize(
        records,
        num_arrived=num_arrived,
        first_arrival_s=float(workload.arrival_s[0]),
        slo=config.slo,
        # (an instance group's members change size: each instance's own blocks count)
        num_kv_blocks_by_replica={
            r.replica_id: (cluster.group.blocks_per_instance if cluster.group is not None
                           else r.kv.num_blocks) for r in cluster.replicas},
        timeline_cache=timeline_cache,
    )
    summary["pools"] = pool_summaries(records, summary, pool_infos, replica_pool,
                                      float(workload.arrival_s[0]), timeline_cache)
    usd_per_hour = sum(p["usd_per_hour"] for p in pool_infos)
    thr = summary["throughput"]
    tokens_per_s = thr["input_tokens_per_s"] + thr["output_tokens_per_s"]
    summary["cost"] = {
        "usd_per_hour": usd_per_hour,
        "usd_per_million_tokens": _per_million(usd_per_hour, tokens_per_s),
        "usd_per_million_output_tokens": _per_million(usd_per_hour, thr["output_tokens_per_s"]),
    }
    summary["workload_fit"] = {"over_long": config.workload.over_long,
                               "num_over_long": num_over_long,
                               "max_context_tokens": model.max_context_tokens}
    if config.workload.max_concurrency is not None:
        summary["max_concurrency"] = config.workload.max_concurrency
    summary["overload"] = overload_check(summary, workload.arrival_s)
    summary["kv_cache"]["num_kv_blocks"] = int(pools[0].num_kv_blocks)
    summary["kv_cache"]["num_prefix_evictions"] = sum(
        r.kv.prefix.num_evicted for r in cluster.replicas)
    summary["routing"] = _routing_report(config, router, decode_router,
                                         any(p.role == "decode" for p in pools))
    if cluster.group is not None:
        report = getattr(cluster.group.planner, "report", None)
        summary["group"] = {"num_regroups": cluster.group.num_regroups,
                            **(report() if report is not None else {})}
    if config.agent_traffic is not None:
        summary["agent_traffic"] = agent_summary(records.requests, source)
    program_rows = source.records() if config.programs is not None else None
    if program_rows is not None:
        summary["programs"] = program_summary(program_rows)
        summary["programs"]["tool_kv"] = _tool_kv_report(config, cluster)
    if any(p.role == "prefill" for p in pools):
        summary["kv_transfer_s"] = distribution(records.requests["kv_transfer_s"])
        summary["kv_transfer_bytes"] = cluster.transfers.num_bytes_by_client.get("kv_handoff", 0.0)
    first = pool_infos[0]
    summary = {
        "model": model.name, "gpu": " + ".join(p["gpu"] for p in pool_infos),
        "tp": first["tp"], "num_replicas": sum(p["num_replicas"] for p in pool_infos),
        "workload": workload.name, "perf_sources": first["perf_sources"],
        **summary,
    }
    if elastic is not None:
        end_s = float(np.nanmax(records.requests["finish_s"])) if len(
            records.requests["finish_s"]) else cluster.now_s
        summary["elastic"] = report = elastic.report(end_s)
        # What the GPUs held cost (the summary's ``cost`` prices the initial deployment).
        usd_per_gpu_s = {p["name"]: p["usd_per_hour"] / 3600 / (p["tp"] * p["num_replicas"])
                         for p in pool_infos}
        report["usd"] = sum(usd_per_gpu_s[name] * s
                            for name, s in report["gpu_seconds_by_pool"].items())
    if workload.num_unserved_skipped:
        summary["num_unserved_skipped"] = workload.num_unserved_skipped
    summary["engine_build"] = engine_build()
    unfinished = sorted(tracker.in_flight.values(), key=lambda r: r.id) if tracker else []
    plain = to_plain(config)
    if given is not None:  # the config's trace or generator was not used: say what was
        plain["workload"] = {**plain["workload"], "trace": None, "given": given.name}
    return RunResult(plain, summary, records, workload, unfinished, program_rows)


def _elastic_controller(config: SimConfig, model: ModelSpec, pools: list[PoolSetup],
                        start_s: float) -> ElasticController | None:
    """The controller of ``[elastic]`` (None without it); bad planner or trigger names and
    arguments fail here, before the run."""
    ec = config.elastic
    if ec is None:
        return None
    planner = make_planner(ec.planner) if ec.planner is not None else None
    trigger = make_trigger(ec.trigger)
    tp = {p.name: p.tp for p in config.pools}
    # The weights one replica loads: every GPU's shard (replicated layers on each).
    weights = {name: float(model.weight_bytes_per_gpu(t) * t) for name, t in tp.items()}
    settings = ControlSettings(
        schedule=tuple(GpuChange(at_s=c.at_s, pool=c.pool, num_gpus=c.num_gpus)
                       for c in ec.schedule),
        leave_rule=ec.leave_rule, load_from=ec.load_from, startup_s=ec.startup_s,
        monitor_interval_s=ec.monitor_interval_s, plan_overhead_s=ec.plan_overhead_s)
    return ElasticController(settings, elastic_pools(pools, weights, tp), planner=planner,
                             trigger=trigger, block_size=config.engine.block_size,
                             max_running=config.engine.max_running, start_s=start_s)


def _bind_replayer(config: SimConfig, elastic: ElasticController, pools: list[PoolSetup],
                   settings: EngineSettings, plugins: PlugIns) -> None:
    """A planner that replays windows (``evolve``) gets this run's engine to replay them on:
    the same pools, settings and policies, fresh routers and a fixed routing seed per replay."""
    bind = getattr(elastic.planner, "bind", None)
    if not callable(bind):
        return

    def make_plugins() -> PlugIns:
        return replace(plugins, router=make_router(config.cluster.router),
                       decode_router=make_router(config.cluster.decode_router,
                                                 "cluster.decode_router"),
                       rng=np.random.default_rng(0))

    bind(WindowReplayer(pools, {p.name: p.tp for p in config.pools}, settings, make_plugins,
                        config.slo.ttft_s, config.slo.tpot_s))


def _tool_kv_report(config: SimConfig, cluster: Any) -> dict[str, Any]:
    """What became of the KV of calls across their tool waits, over all replicas."""
    assert config.programs is not None
    report: dict[str, Any] = {"mode": config.programs.tool_kv,
                              "ttl_s": config.programs.kv_ttl_s}
    for replica in cluster.replicas:
        if replica.kept is not None:
            for key, n in replica.kept.counts.items():
                report[key] = report.get(key, 0) + n
    report["kv_offload_bytes"] = cluster.transfers.num_bytes_by_client.get("kv_offload", 0.0)
    report["kv_reload_bytes"] = cluster.transfers.num_bytes_by_client.get("kv_reload", 0.0)
    return report


def _progress(progress: Callable[..., None] | None, workload: Workload) -> ProgressFn | None:
    if progress is None:
        return None
    first, last = float(workload.arrival_s[0]), float(workload.arrival_s[-1])
    return lambda now_s: progress(now_s, first, last)


def _routing_report(config: SimConfig, router: Any, decode_router: Any,
                    has_decode: bool) -> dict[str, Any]:
    """Which routers ran, with the counters they report (e.g. prefix_affinity's balance
    fallbacks)."""
    out: dict[str, Any] = {"router": config.cluster.router.name,
                           **(router.report() if hasattr(router, "report") else {})}
    if has_decode:
        out["decode_router"] = {"name": config.cluster.decode_router.name,
                                **(decode_router.report()
                                   if hasattr(decode_router, "report") else {})}
    return out


def _plugin_names(config: SimConfig) -> dict[str, str]:
    return {"policy.ordering": config.policy.ordering,
            "policy.batching.name": config.policy.batching.name,
            "policy.eviction": config.policy.eviction,
            "cluster.router.name": config.cluster.router.name,
            "cluster.decode_router.name": config.cluster.decode_router.name}


def _per_million(usd_per_hour: float, tokens_per_s: float) -> float | None:
    return usd_per_hour / 3600.0 / tokens_per_s * 1e6 if tokens_per_s > 0 else None


def pool_summaries(records: Records, summary: dict, pool_infos: list[dict],
                   replica_pool: list[str], start_s: float,
                   timeline_cache: dict | None = None) -> list[dict]:
    """Busy and KV-use fractions per pool, overall and over time (``timeline_cache``: the
    summary's recorded-bin integrals, reused by a pool that holds every replica)."""
    makespan_s = summary["makespan_s"]
    end_s = start_s + makespan_s
    out = []
    for info in pool_infos:
        ids = [i for i, name in enumerate(replica_pool) if name == info["name"]]
        blocks = info["num_kv_blocks"] * len(ids)
        busy = sum(records.busy_s_by_replica.get(i, 0.0) for i in ids)
        kv_s = sum(records.kv_block_seconds_by_replica.get(i, 0.0) for i in ids)
        mask = np.isin(records.timeline["replica_id"], ids)
        # (the one pool of most runs: its rows are all of them, and a copy of a million
        # requests' timeline would be ~230 MB)
        timeline = records.timeline if mask.all() else {
            k: v[mask] for k, v in records.timeline.items()}
        sub = Records(records.requests, timeline,
                      records.num_steps, records.busy_s_by_replica,
                      records.kv_block_seconds_by_replica, records.timeline_origin_s,
                      records.timeline_bin_s)
        tl = timeline_bins(sub, start_s, end_s, blocks, len(ids), 60,
                           timeline_cache if timeline is records.timeline else None)
        out.append({**{k: v for k, v in info.items() if k != "perf_sources"},
                    "busy_fraction": busy / len(ids) / makespan_s,
                    "kv_used_fraction": kv_s / max(blocks, 1) / makespan_s,
                    "timeline": {k: tl[k] for k in ("bin_start_s", "busy_fraction",
                                                   "kv_used_fraction")}})
    return out
