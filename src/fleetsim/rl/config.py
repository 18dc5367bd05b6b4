"""The ``[rl]`` config: one RL post-training job (frozen, strict, validated; docs/rl.md).

Stages: ``generation`` (rollouts on serving replicas), ``inference`` (old-policy log-probs,
reference, reward and critic forward passes) and ``training`` (actor, and critic for PPO).
Each stage runs in exactly one pool; one pool holding all three is verl's colocated layout,
separate pools are a disaggregated one (StreamRL), possibly of different GPU types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetsim.config import EngineConfig
from fleetsim.configutil import apply_overrides, from_dict
from fleetsim.errors import FleetsimInputError
from fleetsim.inputs import MAX_REQUESTS, read_toml
from fleetsim.rl.agentic_config import AgenticConfig
from fleetsim.rl.resource_manager import TP_CHOICES, check_split

STAGES = ("generation", "inference", "training")
ALGORITHMS = ("grpo", "ppo")
LENGTH_KINDS = ("polytrace", "lognormal", "fixed", "sharegpt")
POLYTRACE_RUNS = ("dapo-qwen2.5-32b", "deepcoder-14b")
DISPATCH = ("round_robin", "skewness_aware")
GENERATION_SOURCES = ("single_turn", "agentic")
"""How a step's rollouts are generated (``rl.sources``): one response per sample, or a
multi-turn trajectory per sample with tool waits between turns."""
MAX_SAMPLES_PER_STEP = 2**20
"""Most rollouts in one step (our bound, docs/reliability.md: 64x the largest published
batches, e.g. DAPO's 512 prompts x 16 samples; each sample is a simulated request)."""
MAX_STEPS = 100_000
"""Most training steps in one simulated job."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthsConfig:
    """Response (and prompt) lengths of each step's rollouts, long-tailed and correlated
    inside a GRPO group."""

    kind: str = "polytrace"
    """polytrace (real GRPO groups, resampled) | lognormal (hierarchical fit) | fixed |
    sharegpt (chat answers: ShareGPT's output lengths, resampled per sample)."""
    run: str = "dapo-qwen2.5-32b"
    """polytrace: which run's groups: dapo-qwen2.5-32b | deepcoder-14b."""
    scale: float = 1.0
    """Multiply every sampled response length (then cap at max_response_tokens)."""
    mean_log: float = 6.05
    """lognormal: mean of log(length) (fit to the DAPO groups: 6.05)."""
    between_sd: float = 0.39
    """lognormal: s.d. of a group's mean log-length across prompts (DAPO fit: 0.39)."""
    within_sd: float = 0.89
    """lognormal: s.d. of log-length inside a group (DAPO fit: 0.89)."""
    value: int = 1024
    """fixed: every response's length, tokens."""
    prompt_tokens: int | None = None
    """Every prompt's length; None takes the trace's prompts (lognormal, fixed: 152, the
    DAPO run's median)."""

    def __post_init__(self) -> None:
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"kind must be one of {', '.join(LENGTH_KINDS)}, got {self.kind!r}")
        if self.run not in POLYTRACE_RUNS:
            raise ValueError(f"run must be one of {', '.join(POLYTRACE_RUNS)}, got {self.run!r}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")
        if self.between_sd < 0 or self.within_sd < 0:
            raise ValueError("between_sd and within_sd must be >= 0")
        if self.value < 1:
            raise ValueError(f"value must be >= 1 token, got {self.value}")
        if self.prompt_tokens is not None and self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    """GPUs of one type that run one or more stages."""

    name: str
    gpu: str = "h100-sxm"
    """GPU name from ``fleetsim gpus``."""
    num_gpus: int = 8
    stages: tuple[str, ...] = STAGES
    """The stages this pool runs (each stage in exactly one pool)."""

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {self.num_gpus}; give the pool GPUs "
                             f"or drop it")
        bad = [s for s in self.stages if s not in STAGES]
        if bad or not self.stages:
            raise ValueError(f"stages must be a non-empty list of {', '.join(STAGES)}, got "
                             f"{list(self.stages)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationConfig:
    """Rollout replicas: the serving engine (continuous batching, KV limits)."""

    tp: int = 1
    """GPUs per generation replica (tensor parallel)."""
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(
        max_running=1024, gpu_memory_utilization=0.5, enable_prefix_caching=False))
    """vLLM limits; defaults are verl's rollout config (ppo_trainer.yaml: max_num_seqs 1024,
    max_num_batched_tokens 8192, gpu_memory_utilization 0.5)."""
    source: str = "single_turn"
    """single_turn (each sample one response) | agentic (each sample a multi-turn tool-using
    trajectory, options in generation.agentic)."""
    agentic: AgenticConfig = field(default_factory=AgenticConfig)
    """source agentic: the turns, tools and system (Heddle's mechanisms)."""

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.source not in GENERATION_SOURCES:
            raise ValueError(f"source must be one of {', '.join(GENERATION_SOURCES)}, got "
                             f"{self.source!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """How the training (or inference) pool parallelises a model: tp x pp x dp GPUs, dp
    taking the rest of the pool."""

    tp: int = 1
    pp: int = 1
    micro_batch_tokens: int = 16384
    """Tokens packed per micro-batch per data-parallel rank (verl's
    ppo_max_token_len_per_gpu with use_dynamic_bsz)."""
    recompute: str = "full"
    """Activation recomputation: none | selective | full (verl's examples enable gradient
    checkpointing)."""
    overlap_grad_reduce: bool = True
    zero3: bool = False
    """ZeRO-3 (DeepSpeed's stage 3): parameters sharded over the data-parallel ranks and
    all-gathered for every micro-batch's forward (and again for its backward), the gradients
    reduce-scattered (Rajbhandari et al., arXiv:1910.02054, sec. 7.2.2); DeepSpeed prefetches
    the next layers' shards, so a micro-batch takes the longer of its compute and its gathers."""

    def __post_init__(self) -> None:
        if self.tp < 1 or self.pp < 1:
            raise ValueError(f"tp and pp must be >= 1, got tp={self.tp}, pp={self.pp}")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, got {self.micro_batch_tokens}")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, got "
                             f"{self.recompute!r}")
        if self.zero3 and self.pp > 1:
            raise ValueError(f"zero3 shards parameters over data-parallel ranks without "
                             f"pipeline stages (DeepSpeed: ZeRO-3 is not combined with its "
                             f"pipeline engine), got pp={self.pp}; set pp = 1 or zero3 = false")


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemConfig:
    """The RL system's mechanisms (all off: verl's synchronous pipeline)."""

    name: str = "verl"
    """A label for results."""
    streaming: bool = False
    """Finished GRPO groups stream to the trainer as they finish (StreamRL); else training
    waits for the whole batch."""
    staleness: int = 0
    """0: synchronous; 1: one-step asynchronous (generation of step k+1 overlaps training
    of step k, with weights at most one step old)."""
    dispatch: str = "round_robin"
    """round_robin | skewness_aware (StreamRL: ranked long tail on dedicated instances,
    longest first)."""
    long_tail_fraction: float = 0.2
    """skewness_aware: share of prompts the ranker flags as long-tail (StreamRL: 20%)."""
    ranker_recall: float = 0.87
    """skewness_aware: share of the true longest long_tail_fraction that the ranker flags
    (StreamRL's ranker: top-20% recall ~0.87)."""
    recompute_logprobs: bool = True
    """Recompute the old policy's log-probs with a training forward pass (verl, AReaL);
    false reuses the rollout's (AReaL-TIK)."""
    rollout_decode_attention_slowdown: float = 1.0
    """Rollout decode attention takes this many times longer (AReaL-TIK's unified kernels:
    1 / 0.710 on H20, the README's attention_performance.csv)."""
    rollout_prefill_attention_slowdown: float = 1.0
    """Rollout prefill attention, and the attention of every training-side forward pass,
    take this many times longer (AReaL-TIK: 1 / 0.964 on H20)."""

    colocated_switch_s: float | None = None
    """Colocated jobs: measured seconds per step to hand the GPUs from training to rollout
    (verl's ``timing_s/update_weights``: resharding to the rollout layout, the engine's wake-up
    and KV cache re-allocation); replaces the modelled bf16 all-gather. None: the all-gather
    alone (a lower bound)."""
    generation_rounds: int = 1
    """Generate the batch in this many static rounds, each starting when the previous one has
    wholly finished (DeepSpeed-Chat's hybrid engine generates a batch at a time); 1: the
    whole batch at once with continuous batching."""
    pad_to_longest: bool = False
    """Every sample of a generation round computes until the round's longest one ends, and the
    inference and training passes run over the padded sequences (HuggingFace ``generate`` on a
    static batch with ``synced_gpus`` under ZeRO-3, as DeepSpeed-Chat's
    ``dschat/rlhf/ppo_trainer.py`` generates); false: each sample stops at its own end."""
    tail_migration_fraction: float | None = None
    """RLHFuse's inter-stage fusion: when this share of the samples is still generating,
    move them (with their KV) onto as few generation instances as hold them and run the
    inference passes of the finished samples on the freed GPUs meanwhile (paper: 0.2);
    None: off. Colocated jobs only."""
    fuse_training: bool = False
    """RLHFuse's intra-stage fusion (PPO): actor and critic training in one fused pipeline
    schedule on the same stages, found by simulated annealing (rl/fused_pipeline.py)."""
    fusion_iterations: int = 2000
    """Simulated-annealing moves per fused schedule searched (one search per distinct pair
    of micro-batch counts; seeded by the job's seed)."""

    def __post_init__(self) -> None:
        if self.colocated_switch_s is not None and not 0 <= self.colocated_switch_s <= 3600:
            raise ValueError(f"colocated_switch_s must be in 0..3600 seconds (a measured "
                             f"timing_s/update_weights) or absent, got {self.colocated_switch_s}")
        if self.generation_rounds < 1:
            raise ValueError(f"generation_rounds must be >= 1, got {self.generation_rounds}")
        if self.tail_migration_fraction is not None and not (
                0 < self.tail_migration_fraction < 1):
            raise ValueError(f"tail_migration_fraction must be in (0, 1) (RLHFuse: 0.2) or "
                             f"absent, got {self.tail_migration_fraction}")
        if self.fusion_iterations < 0 or self.fusion_iterations > 10**6:
            raise ValueError(f"fusion_iterations must be in 0..1000000, got "
                             f"{self.fusion_iterations}")
        if self.staleness < 0 or self.staleness > 1:
            raise ValueError(f"staleness must be 0 (synchronous) or 1 (one-step asynchronous), "
                             f"got {self.staleness}")
        if self.dispatch not in DISPATCH:
            raise ValueError(f"dispatch must be one of {', '.join(DISPATCH)}, got "
                             f"{self.dispatch!r}")
        if not 0 < self.long_tail_fraction < 1:
            raise ValueError(f"long_tail_fraction must be in (0, 1), got "
                             f"{self.long_tail_fraction}")
        if not 0 <= self.ranker_recall <= 1:
            raise ValueError(f"ranker_recall must be in [0, 1], got {self.ranker_recall}")
        for name in ("rollout_decode_attention_slowdown", "rollout_prefill_attention_slowdown"):
            if not 1 <= getattr(self, name) <= 10:
                raise ValueError(f"{name} must be in [1, 10], got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RLConfig:
    """One RL post-training job."""

    seed: int = 0
    num_steps: int = 3
    """Training steps to simulate."""
    algorithm: str = "grpo"
    """grpo (actor, reference) | ppo (actor, critic, reference, reward model)."""
    actor: str = "qwen2.5-7b"
    """Model name (``fleetsim models``, the RL papers' models, or a config.json path)."""
    critic: str | None = None
    """PPO: the critic (default: the actor's shape)."""
    reference: str | None = None
    """The reference policy for the KL term (default: the actor's shape)."""
    reward: str | None = None
    """PPO: the reward model (default: the critic's shape); GRPO uses rule rewards."""
    use_reference: bool = True
    """Run the reference forward pass (verl's use_kl_loss / KL penalty; DAPO drops it)."""
    num_prompts_per_step: int = 64
    samples_per_prompt: int = 8
    """The GRPO group size (PPO: samples per prompt, usually 1)."""
    max_response_tokens: int = 8192
    ppo_mini_batches: int = 1
    """Optimizer steps per RL step (train batch / ppo_mini_batch_size)."""
    lengths: LengthsConfig = field(default_factory=LengthsConfig)
    pools: tuple[PoolSpec, ...] = (PoolSpec(name="colocated"),)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    training: ParallelConfig = field(default_factory=ParallelConfig)
    inference: ParallelConfig | None = None
    """Layout of the inference passes (default: the training layout)."""
    system: SystemConfig = field(default_factory=SystemConfig)
    perf_backend: str = "auto"

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be grpo or ppo, got {self.algorithm!r}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.num_prompts_per_step < 1:
            raise ValueError(f"num_prompts_per_step must be >= 1, got "
                             f"{self.num_prompts_per_step}")
        if self.samples_per_prompt < 1:
            raise ValueError(f"samples_per_prompt must be >= 1 (the GRPO group size), got "
                             f"{self.samples_per_prompt}")
        if self.max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got "
                             f"{self.max_response_tokens}")
        if self.num_steps > MAX_STEPS:
            raise ValueError(f"num_steps must be at most {MAX_STEPS:,}, got {self.num_steps}")
        if self.num_samples_per_step > MAX_SAMPLES_PER_STEP:
            raise ValueError(f"num_prompts_per_step x samples_per_prompt = "
                             f"{self.num_prompts_per_step:,} x {self.samples_per_prompt:,} "
                             f"samples per step, more than {MAX_SAMPLES_PER_STEP:,}; lower "
                             f"samples_per_prompt or num_prompts_per_step")
        if self.num_steps * self.num_samples_per_step > MAX_REQUESTS:
            raise ValueError(f"num_steps x samples per step = {self.num_steps:,} x "
                             f"{self.num_samples_per_step:,} rollouts, more than "
                             f"{MAX_REQUESTS:,}; simulate fewer steps")
        if not 1 <= self.ppo_mini_batches <= self.num_prompts_per_step:
            raise ValueError(f"ppo_mini_batches must be in 1..num_prompts_per_step "
                             f"({self.num_prompts_per_step}), got {self.ppo_mini_batches}")
        sysc = self.system
        if sysc.fuse_training and self.algorithm != "ppo":
            raise ValueError("system.fuse_training fuses the actor's and the critic's training "
                             "pipelines: it needs algorithm = \"ppo\"")
        if sysc.tail_migration_fraction is not None and len(self.pools) != 1:
            raise ValueError("system.tail_migration_fraction frees generation GPUs for the "
                             "inference passes: it needs a colocated job (one pool)")
        if sysc.colocated_switch_s is not None and len(self.pools) != 1:
            raise ValueError("system.colocated_switch_s is the colocated engine's switch from "
                             "training to rollout: it needs a colocated job (one pool); drop it")
        if sysc.generation_rounds > self.num_prompts_per_step:
            raise ValueError(f"system.generation_rounds must be <= num_prompts_per_step "
                             f"({self.num_prompts_per_step}), got {sysc.generation_rounds}")
        if self.perf_backend not in ("auto", "roofline"):
            raise ValueError(f"perf_backend must be auto or roofline, got {self.perf_backend!r}")
        self._check_pools()
        if self.generation.source == "agentic":
            self._check_agentic()

    def _check_agentic(self) -> None:
        """What the agentic source cannot honour: a single-turn mechanism, or workers that
        do not tile the generation pool."""
        sysc, gen = self.system, self.generation
        # name -> (value, its off value)
        single_turn = {"system.dispatch": (sysc.dispatch, "round_robin"),
                       "system.generation_rounds": (sysc.generation_rounds, 1),
                       "system.pad_to_longest": (sysc.pad_to_longest, False),
                       "system.tail_migration_fraction": (sysc.tail_migration_fraction, None),
                       "system.rollout_decode_attention_slowdown":
                           (sysc.rollout_decode_attention_slowdown, 1.0),
                       "system.rollout_prefill_attention_slowdown":
                           (sysc.rollout_prefill_attention_slowdown, 1.0),
                       "lengths.prompt_tokens": (self.lengths.prompt_tokens, None)}
        for name, (value, off) in single_turn.items():
            if value != off:
                raise ValueError(f"{name} = {value!r} is a single-turn rollout setting; drop "
                                 f"it or set generation.source = \"single_turn\"")
        if self.lengths.kind != "polytrace":
            raise ValueError(f"lengths.kind = {self.lengths.kind!r}: the agentic source draws "
                             f"its turns from PolyTrace's GRPO groups; set lengths.kind = "
                             f"\"polytrace\"")
        if self.perf_backend != "auto":
            raise ValueError(f"perf_backend = {self.perf_backend!r}: the agentic rollout's "
                             f"workers use the measured tables (auto); drop perf_backend or "
                             f"set generation.source = \"single_turn\"")
        opts, num_gpus = gen.agentic, self.pool_of("generation").num_gpus
        if num_gpus % gen.tp:
            raise ValueError(f"the generation pool's {num_gpus} GPUs are not a multiple of "
                             f"generation.tp {gen.tp}; the agentic workers tile the pool")
        if opts.resource_manager and gen.tp not in TP_CHOICES:
            raise ValueError(f"generation.tp must be one of {list(TP_CHOICES)} with "
                             f"generation.agentic.resource_manager, got {gen.tp}")
        if opts.split:
            check_split(opts.split, num_gpus, TP_CHOICES)
        if opts.preemption_mode == "swap" and not gen.engine.swap_space_gib > 0:
            raise ValueError("generation.agentic.preemption_mode = \"swap\" needs host "
                             "memory: set generation.engine.swap_space_gib > 0")
        if opts.migration and not gen.engine.enable_prefix_caching:
            raise ValueError("generation.agentic.migration moves cached KV: set "
                             "generation.engine.enable_prefix_caching = true")

    def _check_pools(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools names must be unique, got {names}")
        for stage in STAGES:
            holders = [p.name for p in self.pools if stage in p.stages]
            if len(holders) != 1:
                raise ValueError(f"stage {stage!r} must run in exactly one pool, got "
                                 f"{holders or 'none'}; list it in one pool's stages")

    def pool_of(self, stage: str) -> PoolSpec:
        return next(p for p in self.pools if stage in p.stages)

    @property
    def colocated(self) -> bool:
        """All stages time-share one pool (verl's hybrid engine)."""
        return len(self.pools) == 1

    @property
    def inference_layout(self) -> ParallelConfig:
        return self.inference or self.training

    @property
    def num_samples_per_step(self) -> int:
        return self.num_prompts_per_step * self.samples_per_prompt


def check_fits_model(cfg: RLConfig, max_context_tokens: int, model: str) -> None:
    """The longest rollout (the longest prompt plus ``max_response_tokens``) must fit the
    actor's context: a longer one could never be generated."""
    from fleetsim.rl.lengths import DEFAULT_PROMPT_TOKENS, polytrace_groups

    lc = cfg.lengths
    if cfg.generation.source == "agentic":
        # A trajectory's turns are capped by its context, not by prompt + one response.
        cap = cfg.generation.agentic.max_context_tokens
        if cap > max_context_tokens:
            raise FleetsimInputError(
                "rl.generation.agentic.max_context_tokens", cap,
                f"{model} takes at most {max_context_tokens:,} tokens; lower it or pick a "
                f"longer-context actor")
        return
    if lc.prompt_tokens is not None:
        prompt, field_name = lc.prompt_tokens, "rl.lengths.prompt_tokens"
    elif lc.kind == "polytrace":
        prompt, field_name = max(p for p, _ in polytrace_groups(lc.run)), "rl.max_response_tokens"
    else:
        prompt, field_name = DEFAULT_PROMPT_TOKENS, "rl.max_response_tokens"
    if prompt + cfg.max_response_tokens > max_context_tokens:
        raise FleetsimInputError(
            field_name, f"{prompt:,} prompt + {cfg.max_response_tokens:,} response tokens",
            f"{model} takes at most {max_context_tokens:,} tokens; shorten the prompt or "
            f"max_response_tokens, or pick a longer-context actor")


def rl_config_from_dict(data: Mapping[str, Any], where: str = "rl") -> RLConfig:
    """Strict: unknown keys, bad types and bad values name the field."""
    return from_dict(RLConfig, data, where)


def load_rl_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RLConfig:
    """Read the ``[rl]`` table of a TOML file (or an empty one), apply ``--set rl.x=v`` or
    ``--set x=v`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        doc = read_toml(path, "rl config")
        extra = set(doc) - {"rl"}
        if extra:
            key = sorted(extra)[0]
            raise FleetsimInputError(f"{path}: {key}", doc[key],
                                     "an RL config holds one [rl] table; put every key under it")
        data = dict(doc.get("rl", {}))
    apply_overrides(data, overrides, lambda key: key.removeprefix("rl."))
    try:
        return rl_config_from_dict(data)
    except FleetsimInputError as err:
        if path is None:
            raise
        raise FleetsimInputError(f"{path}: {err.where}", err.value, err.fix) from None
