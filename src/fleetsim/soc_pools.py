"""The cluster's pools on one laptop SoC (``cluster.soc``; Agent.xpu, arXiv:2506.24045): each
pool is one replica on the NPU or the iGPU (its ``gpu``: ``npu`` or ``igpu``), and every step
is a job on the one DDR bus the two share (``serving/shared_steps.py``, ``perf/soc.py``).

A step's arithmetic runs on its accelerator at the efficiency ``perf/soc_calibration.py``
derives from public measurements; its bytes (the weights once per forward pass, the KV it
reads and writes) cross the DDR at the max-min share the other accelerator's step leaves it,
capped by what its accelerator can draw and by what its arithmetic consumes. A replica alone
on the bus prices its steps (and decode windows) as a plain step model; the moment the other
accelerator starts a step, what is left of both becomes jobs at the shared rates (exact under
fast-forward).

KV handed from a prefill pool to a decode pool stays where it is (one DDR): the link moves no
bytes, only ``cluster.link.latency_s`` is paid (set it to 0 for a zero-copy handoff).
"""

from __future__ import annotations

import math

from fleetsim.config import SimConfig
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware.soc import ACCELERATORS, SoCSpec
from fleetsim.models import ModelSpec
from fleetsim.models.quantization import quantize
from fleetsim.perf.base import StepTimeModel
from fleetsim.perf.soc import ModelCost, OpCost, SocSplit, TensorSplitSteps, op_s
from fleetsim.perf.soc_calibration import lunar_lake
from fleetsim.serving.cluster import PoolSetup
from fleetsim.serving.shared_steps import SharedStepModel

DDR = "ddr"
"""The shared resource's key: the SoC's DDR bandwidth (bytes/s)."""

SOCS = {"core-ultra-7-258v": lunar_lake}
TENSOR_SPLIT = "npu+igpu"
"""A pool's ``gpu`` for one replica over both accelerators, every step split between them at
the NPU share that finishes it soonest (Agent.xpu's static-partition baseline)."""


def fastest(soc: SoCSpec, cost: OpCost) -> str:
    """The accelerator on which ``cost`` runs sooner, alone (ties: by name): Agent.xpu's
    offline profile that maps each stage to its accelerator (arXiv:2506.24045)."""
    best = min(soc.accelerators, key=lambda a: (
        op_s(a, cost, a.max_draw_bytes_per_s(soc.ddr_bw_bytes_per_s)), a.name))
    return best.name


def affinity(soc: SoCSpec, cost: ModelCost, chunk_tokens: int,
             context_tokens: int = 1024) -> tuple[str, str]:
    """(prefill accelerator, decode accelerator): where a ``chunk_tokens`` prefill chunk and a
    decode step, at ``context_tokens`` of context, run sooner alone."""
    return (fastest(soc, cost.prefill(chunk_tokens, context_tokens)),
            fastest(soc, cost.decode([context_tokens])))


def soc_step_model(soc: SoCSpec, cost: ModelCost, accelerator: str) -> SharedStepModel:
    """Steps on ``accelerator`` as jobs on the SoC's DDR (achievable bandwidth), at most what
    the accelerator can draw alone."""
    split = SocSplit(cost, soc, accelerator)
    return SharedStepModel(split, DDR, soc.achievable_bw_bytes_per_s,
                           max_rate=split.max_draw_bytes_per_s, overlap=True)


class AloneOnDdr:
    """A step model priced at the whole DDR, as ``SharedStepModel`` prices a step run alone
    (the same floats): the one pool of an SoC cluster, which never shares the bus. Decode
    windows read ``shared``'s decode prices directly (``DecodeWindows``)."""

    def __init__(self, model: SharedStepModel) -> None:
        self.shared = model
        self.step_time_s = model.step_time_s
        self.decode_step_times_s = model.decode_step_times_s
        self.scalar_windows = model.scalar_windows  # (the same two calls)


def soc_kv_blocks(soc: SoCSpec, cost: ModelCost, num_pools: int, block_size: int,
                  memory_utilization: float) -> int:
    """KV blocks of one pool: the SoC's memory at ``memory_utilization`` less the weights (one
    copy, both accelerators read it), split evenly over the pools."""
    weights = cost.model.num_params * cost.bits_per_weight / 8
    free = soc.memory_bytes * memory_utilization - weights
    block_bytes = block_size * cost.kv_bytes_per_token
    blocks = int(free / num_pools // block_bytes)
    if blocks < 1:
        raise FleetsimInputError("cluster.soc.bits_per_weight", cost.bits_per_weight,
                                 f"{weights / 1e9:.1f} GB of weights leave no KV room in "
                                 f"{soc.name}'s {soc.memory_bytes / 1e9:.0f} GB; use fewer "
                                 f"bits or a smaller model")
    return blocks


def soc_pools(config: SimConfig, model: ModelSpec) -> tuple[list[PoolSetup], list[dict]]:
    """``config.cluster.soc``: each pool becomes one replica on the accelerator its ``gpu``
    names, stepping on the shared DDR; the pools' setups and descriptions."""
    sc = config.cluster.soc
    assert sc is not None
    _check_soc_alone(config)
    eng = config.engine
    soc = SOCS[sc.device]()
    kv_model = quantize(model, None, eng.kv_cache_dtype)
    cost = ModelCost(kv_model, sc.bits_per_weight, kv_dtype_bytes=kv_model.kv_dtype_bytes)
    blocks = eng.num_kv_blocks or soc_kv_blocks(soc, cost, len(config.pools), eng.block_size,
                                                eng.gpu_memory_utilization)
    setups, infos = [], []
    for pool in config.pools:
        step_model: StepTimeModel
        if pool.gpu == TENSOR_SPLIT:
            step_model = TensorSplitSteps(cost, soc)
        elif len(config.pools) == 1:
            # Nobody else draws on the DDR: the same prices, without the sharing machinery.
            step_model = AloneOnDdr(soc_step_model(soc, cost, pool.gpu))
        else:
            step_model = soc_step_model(soc, cost, pool.gpu)
        # The KV stays in the one DDR: a handoff moves no bytes (infinite link).
        setups.append(PoolSetup(name=pool.name, role=pool.role, num_replicas=1,
                                step_model=step_model, num_kv_blocks=blocks,
                                link_bw_bytes_per_s=math.inf))
        infos.append({"name": pool.name, "gpu": f"{soc.name} {pool.gpu}", "role": pool.role,
                      "num_replicas": 1, "tp": 1, "num_kv_blocks": blocks,
                      "usd_per_hour": 0.0, "soc": sc.device,
                      "perf_sources": {"soc": "perf/soc_calibration.py"}})
    return setups, infos


def _check_soc_alone(config: SimConfig) -> None:
    """Pools the SoC cannot run, and settings that would change how a step is priced or
    which replicas exist, which the SoC's own cost model would silently drop: refused in one
    line each."""
    where = "cluster.soc"
    seen: set[str] = set()
    for p in config.pools:
        pool = "hardware" if not config.cluster.pools else f"cluster.pools ({p.name})"
        if p.gpu == TENSOR_SPLIT and len(config.pools) > 1:
            raise FleetsimInputError(f"{pool}.gpu", p.gpu,
                                     f"a tensor split takes both accelerators: it is the "
                                     f"only pool of {where}")
        if p.gpu not in (*ACCELERATORS, TENSOR_SPLIT) or p.gpu in seen:
            raise FleetsimInputError(f"{pool}.gpu", p.gpu,
                                     f"{where} runs each pool on its own accelerator: "
                                     f"{' or '.join(ACCELERATORS)}, one pool each, or one "
                                     f"pool on {TENSOR_SPLIT} (every step split over both)")
        seen.add(p.gpu)
        for field, value in (("num_replicas", p.num_replicas), ("tp", p.tp), ("pp", p.pp),
                             ("dp_attention", p.dp_attention)):
            if value != 1:
                raise FleetsimInputError(f"{pool}.{field}", value,
                                         f"{where} runs one replica per accelerator; set 1")
        if p.ep is not None:
            raise FleetsimInputError(f"{pool}.ep", "set",
                                     f"{where} has no expert parallelism; remove it")
    clashes = (
        ("quantization", config.quantization,
         "cluster.soc.bits_per_weight sets the weights' precision"),
        ("engine.speculative", config.engine.speculative is not None
         and config.engine.speculative.method, "not priced on an SoC"),
        ("elastic", config.elastic is not None and "[elastic]", "an SoC's pools are fixed"),
        ("group", config.group is not None and "[group]", "an SoC's pools are fixed"),
        ("cluster.expert_pool", config.cluster.expert_pool is not None and "set",
         "an SoC has no expert pool"),
    )
    for field, value, why in clashes:
        if value:
            raise FleetsimInputError(field, value, f"{why}; remove {field} or {where}")
