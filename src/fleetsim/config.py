"""``SimConfig``: everything one run depends on, loaded from TOML plus dotted overrides.

A file is optional: every field has a default, and the defaults are the embedded demo
(a slice of the Azure LLM 2023 conversation trace, Llama-3.1-8B on one H100).

    fleetsim run exp.toml --set engine.max_batched_tokens=4096 --set hardware.gpu=h200
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fleetsim.configutil import apply_overrides, from_dict
from fleetsim.elastic_config import ElasticConfig, check_elastic
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware.soc import SocConfig
from fleetsim.inputs import read_toml
from fleetsim.metrics.summary import SLOConfig
from fleetsim.models.quantization import check_kv_cache_dtype, quant_mode
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.moe.expertplex import ExpertPoolConfig
from fleetsim.moe.serving import PoolEpConfig
from fleetsim.programs.config import ProgramWorkloadConfig
from fleetsim.registry import PolicySpec
from fleetsim.workloads.agent_traffic import AgentTrafficConfig
from fleetsim.workloads.config import WorkloadConfig


def _check_dp_attention(prefix: str, dp: int, pp: int) -> None:
    if dp < 1:
        raise ValueError(f"{prefix}dp_attention must be >= 1 (1: off), got {dp}")
    if dp > 1 and pp > 1:
        # the wide-EP layout's ranks are not pipelined in vLLM or SGLang deployments
        raise ValueError(f"{prefix}dp_attention = {dp} with pp = {pp}: attention data "
                         "parallelism is not modelled with pipeline stages; set pp = 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareConfig:
    """The GPUs of the replica."""

    gpu: str = "h100-sxm"
    """GPU name from ``fleetsim gpus`` (or from ``catalog``)."""
    tp: int = 1
    """Tensor-parallel degree: GPUs per pipeline stage (inside one node's NVLink domain)."""
    pp: int = 1
    """Pipeline-parallel degree (vLLM's pipeline_parallel_size): stages of ``tp`` GPUs each,
    on consecutive GPUs, across nodes when tp x pp exceeds a node (docs/parallelism.md)."""
    dp_attention: int = 1
    """Attention data-parallel ranks per replica (vLLM's data_parallel_size with
    --enable-expert-parallel, SGLang's --dp-size with --enable-dp-attention): dp ranks of tp
    GPUs, each with its own batch and KV, experts spread over all dp x tp GPUs (wide EP,
    across nodes; MoE models; docs/parallelism.md). 1: off."""
    num_replicas: int = 1
    """Identical mixed replicas (when ``cluster.pools`` is empty)."""
    ep: PoolEpConfig | None = None
    """Expert parallelism over the replica's TP GPUs (each stage's, with pp; all dp x tp GPUs
    with dp_attention) (MoE models), e.g. {balancer = "quota"}."""
    catalog: str | None = None
    """Optional TOML file adding GPUs ([[gpu]] tables, same fields as the built-ins)."""

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"hardware.tp must be >= 1, got {self.tp}")
        if self.pp < 1:
            raise ValueError(f"hardware.pp must be >= 1 (1: no pipeline), got {self.pp}")
        _check_dp_attention("hardware.", self.dp_attention, self.pp)
        if self.num_replicas < 1:
            raise ValueError(f"hardware.num_replicas must be >= 1, got {self.num_replicas}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The serving engine's limits (vLLM's names and defaults where they exist)."""

    block_size: int = 16
    """Tokens per KV block (vLLM's default 16)."""
    max_batched_tokens: int = 8192
    """Token budget of one step (vLLM's max_num_batched_tokens)."""
    max_running: int = 256
    """Most requests in the running batch (vLLM's max_num_seqs)."""
    gpu_memory_utilization: float = 0.9
    """Share of HBM the engine may use for weights, activations and KV (vLLM's default 0.9)."""
    num_kv_blocks: int | None = None
    """Override the computed KV capacity with a measured block count (from vLLM's log)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes (needs traces with hash_ids)."""
    fast_forward: bool = True
    """Advance decode-only stretches in one event (same results, much faster)."""
    debug: bool = False
    """Check KV and queue invariants after every step (slow)."""
    track_itl: bool = False
    """Record inter-token latency: per request (mean, p99, max of the gaps between its output
    tokens) and pooled over all gaps, exact with fast-forward on and off. Off by default: it
    costs work per window and decoder (1.6x the run time on 200,000 requests on 64
    replicas); ``--vllm-json`` turns it on."""
    swap_space_gib: float = 0.0
    """Host memory per GPU for swapped-out KV, GiB (vLLM's swap_space; vLLM defaults to 4).
    0: no host tier (a policy that swaps then fails); policies that never swap ignore it."""
    host_link_bw_bytes_per_s: float | None = None
    """GPU-host link per GPU, one direction, bytes/s (default: the GPU catalog's PCIe)."""
    host_link_latency_s: float | None = None
    """Setup latency of one GPU-host copy, seconds (default: the GPU catalog's)."""
    step_overhead_s: float = 0.0015
    """CPU cost of every step that the GPU waits for (scheduling, input preparation, output
    processing), seconds: the built-in step model's fixed term (docs/perf_model.md)."""
    step_overhead_per_seq_s: float = 0.0
    """Further CPU cost per sequence in the step, seconds: 0 for vLLM V1 (default); vLLM V0
    measured about 1e-4 (docs/perf_model.md). ``fleetsim calibrate`` fits both to your runs."""
    kernel_time_scale: float = 1.0
    """Multiplies every kernel (GPU) time of the built-in step model: 1.1 for a deployment
    whose kernels run 10% slower than the measured tables (``fleetsim calibrate`` fits it)."""
    async_scheduling: bool = False
    """Overlap that CPU cost with the GPU's work, as vLLM's async scheduling does (its default
    since v0.14, January 2026; ``--async-scheduling``): a step then costs its kernels plus
    ``async_step_gap_s``, or the CPU cost where that is longer. Off by default, which models
    a synchronous engine (vLLM before 0.14, or ``--no-async-scheduling``; docs/perf_model.md)."""
    async_step_gap_s: float = 0.00016
    """GPU idle time left between steps under async scheduling, seconds (150-170 us measured
    with CUDA graphs in vLLM PR #11133; docs/perf_model.md)."""
    kv_cache_dtype: str = "auto"
    """KV-cache element type, vLLM's ``--kv-cache-dtype``: auto (the model's, BF16) | bfloat16 |
    fp8 (also fp8_e4m3, fp8_e5m2): half the bytes per cached token, so twice the KV blocks,
    and FP8 attention where the GPU has FP8 units (docs/perf_model.md)."""
    speculative: SpeculativeConfig | None = None
    """Speculative decoding, vLLM's ``--speculative-config``: {method = "eagle3" | "eagle" |
    "mtp" | "ngram", num_speculative_tokens = k, acceptance = rate or [k rates] |
    mean_accepted_tokens = tau} (acceptance defaults to a published figure per method;
    docs/engine.md). Each decode step drafts k tokens and verifies k + 1."""
    step_model: PolicySpec = field(default_factory=lambda: PolicySpec(name="table"))
    """Step-time model: {name = "table"} (measured kernel tables, roofline fallback) or a user
    class {name = "pkg.mod:Name", args = {...}}, built as Name(model=, gpu=, tp=, **args)."""

    def __post_init__(self) -> None:
        check_kv_cache_dtype(self.kv_cache_dtype)
        if not 0.0 <= self.swap_space_gib <= 65536:
            raise ValueError(f"engine.swap_space_gib must be in [0, 65536] GiB, got "
                             f"{self.swap_space_gib}")
        if self.host_link_bw_bytes_per_s is not None and not (
                1e6 <= self.host_link_bw_bytes_per_s <= 1e13):
            raise ValueError(f"engine.host_link_bw_bytes_per_s must be in [1e6, 1e13] bytes/s, "
                             f"got {self.host_link_bw_bytes_per_s}")
        if self.host_link_latency_s is not None and not 0 <= self.host_link_latency_s <= 1:
            raise ValueError(f"engine.host_link_latency_s must be in [0, 1] s, got "
                             f"{self.host_link_latency_s}")
        for name in ("block_size", "max_batched_tokens", "max_running"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"engine.gpu_memory_utilization must be in (0, 1], got "
                f"{self.gpu_memory_utilization}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"engine.num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if not 0.0 <= self.step_overhead_s < 1.0:
            raise ValueError(f"engine.step_overhead_s must be in [0, 1) seconds, got "
                             f"{self.step_overhead_s}")
        if not 0.0 <= self.step_overhead_per_seq_s < 0.01:
            raise ValueError(f"engine.step_overhead_per_seq_s must be in [0, 0.01) seconds, "
                             f"got {self.step_overhead_per_seq_s}")
        if not 0.05 <= self.kernel_time_scale <= 20:
            raise ValueError(f"engine.kernel_time_scale must be in [0.05, 20], got "
                             f"{self.kernel_time_scale}")
        if not 0.0 <= self.async_step_gap_s < 0.1:
            raise ValueError(f"engine.async_step_gap_s must be in [0, 0.1) seconds, got "
                             f"{self.async_step_gap_s}")
        if self.step_model.name != "table" and (
                self.step_overhead_s != 0.0015 or self.step_overhead_per_seq_s != 0.0
                or self.kernel_time_scale != 1.0 or self.async_scheduling
                or self.async_step_gap_s != 0.00016):
            raise ValueError(
                f"engine.step_overhead_s, step_overhead_per_seq_s, kernel_time_scale and "
                f"async_scheduling apply "
                f"to the built-in step model; {self.step_model.name!r} takes its own in "
                f"engine.step_model.args")


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """Which scheduling policies run (names from the registries, or 'pkg.mod:Obj')."""

    ordering: str = "fcfs"
    """Queue order and preemption order: fcfs | sjf | priority | pkg.mod:key_function."""
    batching: PolicySpec = field(default_factory=lambda: PolicySpec(name="token_budget"))
    """Step planner and its args, e.g.
    {name = "token_budget", args = {enable_chunked_prefill = false}}."""
    eviction: str = "lru"
    """Prefix-cache eviction: lru | lfu | deepest_first | pkg.mod:key_function."""


ROLES = ("mixed", "prefill", "decode")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolConfig:
    """A pool of identical replicas."""

    name: str
    """Pool name, used in results (e.g. "prefill-h200")."""
    gpu: str
    """GPU name from ``fleetsim gpus``."""
    num_replicas: int = 1
    """Replicas in the pool."""
    tp: int = 1
    """Tensor-parallel degree: GPUs per pipeline stage (at most the GPUs of one node)."""
    pp: int = 1
    """Pipeline-parallel degree: stages per replica, so a replica has tp x pp GPUs."""
    role: str = "mixed"
    """mixed (prefill and decode) | prefill (hands KV to a decode pool) | decode."""
    dp_attention: int = 1
    """Attention data-parallel ranks per replica with experts over all dp x tp GPUs (wide
    EP; see hardware.dp_attention). 1: off."""
    ep: PoolEpConfig | None = None
    """Expert parallelism over each replica's TP GPUs (all dp x tp with dp_attention) (MoE
    models), e.g. {balancer = "quota"}."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.pp < 1:
            raise ValueError(f"pp must be >= 1 (1: no pipeline), got {self.pp}")
        _check_dp_attention("", self.dp_attention, self.pp)


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkConfig:
    """The network that carries KV caches from prefill to decode replicas."""

    placement: str = "inter_node"
    """inter_node (RDMA NICs, the GPUs' network bandwidth) | intra_node (NVLink)."""
    bw_bytes_per_s: float | None = None
    """Per-GPU link bandwidth, one direction; None takes the GPU catalog's figure (the
    slower of the two ends). A replica's link is its TP GPUs' links together."""
    latency_s: float = 20e-6
    """Fixed cost of each transfer (connection setup, RDMA round trip), seconds."""

    def __post_init__(self) -> None:
        if self.placement not in ("inter_node", "intra_node"):
            raise ValueError(
                f"placement must be inter_node or intra_node, got {self.placement!r}")
        if self.bw_bytes_per_s is not None and not self.bw_bytes_per_s > 0:
            raise ValueError(f"bw_bytes_per_s must be > 0 (use 1e30 for an ideal link), "
                             f"got {self.bw_bytes_per_s}")
        if self.latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    """Many replicas: pools, the router in front of them and the KV link between pools.

    With no pools, the cluster is ``hardware.num_replicas`` mixed replicas of
    ``hardware.gpu`` x ``hardware.tp``.
    """

    pools: tuple[PoolConfig, ...] = ()
    """Replica pools; prefill pools need at least one decode pool and vice versa."""
    router: PolicySpec = field(default_factory=lambda: PolicySpec(name="round_robin"))
    """Picks the replica (mixed or prefill) for each arriving request."""
    decode_router: PolicySpec = field(default_factory=lambda: PolicySpec(name="least_loaded"))
    """Picks the decode replica for each finished prefill (P/D only)."""
    link: LinkConfig = field(default_factory=LinkConfig)
    expert_pool: ExpertPoolConfig | None = None
    """A shared expert pool for the prefill and decode pools (MoE models; docs/config.md,
    ExpertPlex), e.g. {num_gpus = 8}."""
    soc: SocConfig | None = None
    """The pools on one laptop SoC, sharing its DDR (Agent.xpu; examples/soc.toml): each pool's
    gpu names its accelerator (npu | igpu, one pool each; npu+igpu: one pool split over both),
    e.g. soc = {} with gpu = "igpu"."""
    frontend_overhead_s: float = 0.0
    """Time a request spends between the client and the engine (HTTP both ways, API server),
    seconds: each request reaches the engine this long after it was sent, so its TTFT and E2E
    include it (0: the engine's own latencies). Measure it (docs/live.md), don't guess it;
    ``fleetsim emulate`` ignores it (its front end is real)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.frontend_overhead_s <= 10.0:
            raise ValueError(f"cluster.frontend_overhead_s must be in [0, 10] seconds (a "
                             f"measured per-request overhead, e.g. 0.002), got "
                             f"{self.frontend_overhead_s}")


GROUP_STEP_MODELS = ("esp",)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupConfig:
    """The replicas of the one pool as an instance group (docs/groups.md): members of one or
    more instances whose membership and degree of parallelism a group planner changes at run
    time. LoongServe's elastic sequence parallelism is ``planner = {name = "esp"}``."""

    planner: PolicySpec = field(default_factory=lambda: PolicySpec(name="esp"))
    """Group planner and its args: esp | fixed | pkg.mod:Class, e.g.
    {name = "esp", args = {max_out_of_order = 8}}."""
    step_model: str = "esp"
    """How a member of k instances steps: esp (sequence-parallel prefill over the k
    instances, multi-master decode with its KV spread over them; fleetsim.esp.cost)."""
    min_compute_bound_batch: int = 128
    """Decode requests per master instance (LoongServe's
    --min_comp_bound_decoding_batch_size)."""

    def __post_init__(self) -> None:
        if self.step_model not in GROUP_STEP_MODELS:
            raise ValueError(f"group.step_model must be one of {', '.join(GROUP_STEP_MODELS)}, "
                             f"got {self.step_model!r}")
        if self.min_compute_bound_batch < 1:
            raise ValueError(f"group.min_compute_bound_batch must be >= 1, got "
                             f"{self.min_compute_bound_batch}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One simulation run."""

    seed: int = 0
    """Seed of every random stream (synthetic arrivals, lengths); same seed, same results."""
    model: str = "llama-3.1-8b"
    """Model name from ``fleetsim models`` or a path to a Hugging Face config.json."""
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    quantization: str | None = None
    """Weight/activation quantization, vLLM's ``--quantization``: None (the checkpoint's own
    dtype) | fp8 | fp8_static | fp8_block | int8_wo | int4_wo | sq | nvfp4, or for MoE experts
    w4afp8 | w4a16_mxfp4 (AIConfigurator's names; vLLM's awq, gptq, modelopt_fp4, mxfp4 map
    onto them). ``fleetsim gpus`` lists the modes each GPU runs (docs/perf_model.md)."""
    perf_backend: str = "auto"
    """Performance model: auto (measured tables, roofline where none) | roofline."""
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    programs: ProgramWorkloadConfig | None = None
    """Agent programs (DAGs of calls and tool waits) instead of ``workload``
    (docs/programs.md)."""
    agent_traffic: AgentTrafficConfig | None = None
    """Agent.xpu's reactive and proactive traffic instead of ``workload`` (docs/cluster.md)."""
    slo: SLOConfig = field(default_factory=SLOConfig)
    until_s: float | None = None
    """Stop simulating at this simulated time (None: run until every request finishes)."""
    group: GroupConfig | None = None
    """Run the pool's replicas as one instance group (docs/groups.md; None: replicas)."""
    elastic: ElasticConfig | None = None
    """An elastic cluster: GPUs joining and leaving, a deployment planner (docs/elastic.md)."""

    @property
    def pools(self) -> tuple[PoolConfig, ...]:
        """The cluster's pools, the single-pool shorthand of ``hardware`` expanded."""
        if self.cluster.pools:
            return self.cluster.pools
        hw = self.hardware
        return (PoolConfig(name="default", gpu=hw.gpu, num_replicas=hw.num_replicas, tp=hw.tp,
                           pp=hw.pp, ep=hw.ep, dp_attention=hw.dp_attention),)

    def __post_init__(self) -> None:
        roles = {p.role for p in self.cluster.pools}
        if "prefill" in roles and "decode" not in roles:
            raise ValueError("cluster.pools has a prefill pool but no decode pool; add a pool "
                             "with role = \"decode\" or make the prefill pool \"mixed\"")
        if "decode" in roles and "prefill" not in roles:
            raise ValueError("cluster.pools has a decode pool but no prefill pool; add a pool "
                             "with role = \"prefill\" or make the decode pool \"mixed\"")
        names = [p.name for p in self.cluster.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster.pools names must be unique, got {names}")
        if self.quantization is not None:
            quant_mode(self.quantization)
        if self.perf_backend not in ("auto", "roofline"):
            raise ValueError(
                f"perf_backend must be 'auto' or 'roofline', got {self.perf_backend!r}")
        if self.group is not None and (len(self.pools) != 1 or self.pools[0].role != "mixed"
                                       or self.programs is not None):
            raise ValueError("group needs one mixed pool (hardware.num_replicas instances of "
                             "hardware.tp GPUs) and a workload, not programs; remove "
                             "cluster.pools / programs or drop [group]")
        if self.agent_traffic is not None and (self.programs is not None
                                               or self.workload != WorkloadConfig()
                                               or self.until_s is not None):
            raise ValueError("agent_traffic replaces the workload and runs until its last "
                             "request ends; remove [workload], [programs] and until_s, or "
                             "drop [agent_traffic]")
        if self.until_s is not None and not self.until_s > 0:
            raise ValueError(f"until_s must be > 0 seconds or unset, got {self.until_s}")
        if self.elastic is not None:
            if self.group is not None:
                raise ValueError("group and elastic cannot be combined yet: an instance group "
                                 "plans over fixed instances; drop [group] or [elastic]")
            check_elastic(self.elastic, self.pools, self.programs is not None)
        if self.programs is not None and self.workload != WorkloadConfig():
            # An error, not a warning: programs replace the workload, so a workload key set
            # beside them (a rate, --isl) would be ignored while the user believes it applies.
            default = WorkloadConfig()
            key = next(f.name for f in fields(WorkloadConfig)
                       if getattr(self.workload, f.name) != getattr(default, f.name))
            raise ValueError(f"workload.{key} is ignored when [programs] is set (programs "
                             f"replace the workload: set their rate and lengths under "
                             f"programs); remove workload.{key} or drop [programs]")


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = ()
) -> SimConfig:
    """Read a TOML file (optional), apply ``key=value`` overrides, validate strictly."""
    data: dict[str, Any] = {}
    if path is not None:
        data = resolve_paths(read_toml(path, "config"), Path(path).parent)
        try:  # vLLM's names become fleetsim's now, so that --set of either name wins
            data = dict(_vllm_names(data, "config"))
        except FleetsimInputError as err:
            raise FleetsimInputError(f"{path}: {err.where}", err.value, err.fix) from None
    apply_overrides(data, overrides, _vllm_key)
    try:
        return config_from_dict(data)
    except FleetsimInputError as err:
        if path is None:
            raise
        raise FleetsimInputError(f"{path}: {err.where}", err.value, err.fix) from None


# vLLM's engine argument names, accepted in [engine] as aliases of fleetsim's.
VLLM_ENGINE_ALIASES = {
    "max_num_batched_tokens": "max_batched_tokens",
    "max_num_seqs": "max_running",
}
# ... and in [hardware] (vLLM's parallel config).
VLLM_HARDWARE_ALIASES = {
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
}


def _hardware_names(data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``[hardware]`` written with vLLM's parallel sizes becomes fleetsim's tp and pp."""
    hardware = data.get("hardware")
    if not isinstance(hardware, Mapping) or not set(hardware) & set(VLLM_HARDWARE_ALIASES):
        return data
    hardware = dict(hardware)
    for alias, name in VLLM_HARDWARE_ALIASES.items():
        if alias in hardware:
            if name in hardware:
                raise FleetsimInputError(f"{where}.hardware.{alias}", hardware[alias],
                                         f"hardware.{name} is set too; keep one of the two")
            hardware[name] = hardware.pop(alias)
    return {**data, "hardware": hardware}


def _vllm_names(data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``[engine]`` written with vLLM's names: max_num_batched_tokens, max_num_seqs and
    enable_chunked_prefill (a batching policy argument here) become fleetsim's; so do
    ``[hardware]``'s tensor_parallel_size and pipeline_parallel_size."""
    data = _hardware_names(data, where)
    engine = data.get("engine")
    if not isinstance(engine, Mapping) or not (
            set(engine) & {*VLLM_ENGINE_ALIASES, "enable_chunked_prefill"}):
        return data
    engine = dict(engine)
    out = dict(data)
    for alias, name in VLLM_ENGINE_ALIASES.items():
        if alias in engine:
            if name in engine:
                raise FleetsimInputError(f"{where}.engine.{alias}", engine[alias],
                                         f"engine.{name} is set too; keep one of the two")
            engine[name] = engine.pop(alias)
    if "enable_chunked_prefill" in engine:
        value = engine.pop("enable_chunked_prefill")
        policy = dict(out.get("policy") or {})
        batching = policy.get("batching", {"name": "token_budget"})
        if isinstance(batching, str):
            batching = {"name": batching}
        if not isinstance(batching, Mapping):
            raise FleetsimInputError(f"{where}.policy.batching", batching, "expected a table")
        args = dict(batching.get("args") or {})
        if "enable_chunked_prefill" in args and args["enable_chunked_prefill"] != value:
            raise FleetsimInputError(
                f"{where}.engine.enable_chunked_prefill", value,
                "policy.batching.args.enable_chunked_prefill says otherwise; keep one")
        args["enable_chunked_prefill"] = value
        policy["batching"] = {**batching, "args": args}
        out["policy"] = policy
    out["engine"] = engine
    return out


def _vllm_key(key: str) -> str:
    """A dotted --set key with vLLM's engine names mapped to fleetsim's."""
    table, _, name = key.partition(".")
    if table == "engine" and name in VLLM_ENGINE_ALIASES:
        return f"engine.{VLLM_ENGINE_ALIASES[name]}"
    if table == "hardware" and name in VLLM_HARDWARE_ALIASES:
        return f"hardware.{VLLM_HARDWARE_ALIASES[name]}"
    if key == "engine.enable_chunked_prefill":
        return "policy.batching.args.enable_chunked_prefill"
    return key


def resolve_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Relative file paths of a config file (the trace, empirical length files, a GPU
    catalog) made relative to the file's folder, not the working directory."""
    def fix(value: Any) -> Any:
        if (isinstance(value, str) and value and value != "synthetic"
                and not value.startswith("embedded:") and not Path(value).is_absolute()):
            return str(base_dir / value)
        return value

    workload = data.get("workload")
    if isinstance(workload, dict):
        if "trace" in workload:
            workload["trace"] = fix(workload["trace"])
        for key in ("prompt_tokens", "output_tokens", "lengths"):
            length = workload.get(key)
            if isinstance(length, dict) and "path" in length:
                length["path"] = fix(length["path"])
    hardware = data.get("hardware")
    if isinstance(hardware, dict) and "catalog" in hardware:
        hardware["catalog"] = fix(hardware["catalog"])
    return data


def config_from_dict(data: Mapping[str, Any], where: str = "config") -> SimConfig:
    """Build a ``SimConfig`` from plain data (unknown keys and bad types fail)."""
    data = _vllm_names(data, where)
    if isinstance(data.get("workload"), Mapping) and data["workload"].get("trace") == "synthetic":
        data = {**data, "workload": {**data["workload"], "trace": None}}
    return from_dict(SimConfig, data, where)
