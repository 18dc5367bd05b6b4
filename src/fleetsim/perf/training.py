"""Training-side costs on the same measured tables as serving: forward passes over packed
micro-batches, backward (2x forward), activation recomputation, the 1F1B pipeline, the
data-parallel gradient all-reduce and the optimizer step.

A forward pass of a micro-batch of sequences with lengths ``s_i`` (``T = sum s_i`` tokens) on
one tensor-parallel group costs what the serving step model charges a prefill of the same
tokens: the per-token GEMMs, TP all-reduces and elementwise kernels of ``G(T)``, causal
attention ``sum_i P(s_i)`` (docs/perf_model.md), plus the LM head over *every* token
(training computes the loss at every position; serving only at the sampled ones). No fixed
per-step CPU overhead is added: training steps are large and launch-bound costs are hidden.

Backward is 2x the forward (weight and input gradients, the usual 6N FLOPs per token for a
forward-backward, Kaplan et al. 2020); full recomputation adds one forward, selective
recomputation (Korthikanti et al., arXiv:2205.05198) re-runs only the attention core. With
``pp`` pipeline stages each stage runs ``1/pp`` of the layers (the last one also the LM head,
so it is the slowest) and the 1F1B schedule takes ``sum_j t_j + (pp - 1) max_j t_j`` for
micro-batches of stage time ``t_j``: for equal micro-batches the bubble is
``(pp - 1) / (pp - 1 + m)`` of the time (Narayanan et al., SC'21).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.models.quantization import BF16
from fleetsim.perf import roofline as rl
from fleetsim.perf.breakdown import build_step_model
from fleetsim.perf.ops import OpTimes

RECOMPUTE_MODES = ("none", "selective", "full")
BF16_BYTES = 2
BACKWARD_OVER_FORWARD = 2.0
"""Backward FLOPs over forward FLOPs (input and weight gradients: 2x; 6N per token in all)."""
OPTIMIZER_BYTES_PER_PARAM = 34.0
"""Bytes the mixed-precision Adam step moves per parameter: reads fp32 master, m, v (12) and
the gradient (4), writes master, m, v (12), the bf16 weight (2) and zeroes the gradient (4)."""


@dataclass(frozen=True, slots=True)
class PassTimes:
    """Seconds of one forward over a micro-batch on one TP group, split by what recomputation
    and pipelining need."""

    layers_s: float
    """All transformer layers (GEMMs, TP all-reduce, elementwise, attention)."""
    attention_s: float
    """The attention core alone (part of ``layers_s``; what selective recomputation redoes)."""
    head_s: float
    """LM head (or value / reward head) over every token."""
    comm_s: float = 0.0
    """The TP all-reduces (part of ``layers_s``): as many in the backward pass as in the
    forward (Megatron's f and g operators), not twice as many."""
    moe_s: float = 0.0
    """The routed-expert GEMMs (part of ``layers_s``) as the tables time them for this
    tensor-parallel group; an expert-parallel model replaces them with its own."""


FORWARD_MEMO_MAX = 1 << 16
"""Micro-batches a ``ForwardModel`` remembers (a 100-step job would otherwise keep every
one it timed)."""


class ForwardModel:
    """Forward-pass times of ``model`` on ``gpu`` at tensor parallelism ``tp``, from the
    measured tables (roofline where there are none), as in the serving step model.

    Each distinct micro-batch (its lengths, in order) is timed once per model: an RL step's
    old-log-prob, reference and training passes pack the same samples into the same
    micro-batches, and so do a step's chunks when a length repeats. The model is immutable
    once built (the memo is keyed on the lengths alone)."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, *, backend: str = "auto",
                 lm_head: bool = True, attention_scale: float = 1.0) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        step = build_step_model(model, gpu, tp, backend=backend)
        self._per_token = [step.op_time_lookup(k) for k in ("gemm", "moe", "other")]
        self._comm = step.op_time_lookup("communication")
        self._attn, self._head = _attention_and_head(model, gpu, tp, backend == "auto")
        self.lm_head = lm_head
        self.attention_scale = attention_scale  # slower (e.g. bitwise-aligned) kernels: > 1
        self.sources = dict(getattr(step, "sources", {}))
        self._memo: dict[tuple[int, ...], PassTimes] = {}  # micro-batch lengths -> times

    def forward(self, seq_lens: Sequence[int]) -> PassTimes:
        """One packed micro-batch of sequences ``seq_lens`` (tokens each)."""
        return self.forward_many([seq_lens])[0]

    def forward_many(self, micro_batches: Sequence[Sequence[int]]) -> list[PassTimes]:
        """``forward`` of each micro-batch, bit for bit: the table lookups of every new
        micro-batch in one call (the lookups are elementwise, so the values are those of one
        micro-batch at a time), each micro-batch's attention summed over its own slice."""
        memo = self._memo
        keys = [tuple(mb) for mb in micro_batches]
        new = list(dict.fromkeys(k for k in keys if k not in memo))
        if new:
            if len(memo) + len(new) > FORWARD_MEMO_MAX:
                memo.clear()  # the repeats are a step's passes over the same samples
                new = list(dict.fromkeys(keys))
            for key, times in zip(new, self._times(new), strict=True):
                memo[key] = times
        return [memo[k] for k in keys]

    def _times(self, micro_batches: list[tuple[int, ...]]) -> list[PassTimes]:
        tokens = [sum(mb) for mb in micro_batches]
        lens = np.fromiter((s for mb in micro_batches for s in mb), dtype=np.float64)
        attn = self._attn(lens)
        # A value or reward model ends in a hidden -> 1 projection: negligible.
        heads = self._head(np.asarray(tokens, dtype=np.float64)) if self.lm_head else None
        gemm, moe_f, other = self._per_token
        out = []
        start = 0
        for j, (mb, num_tokens) in enumerate(zip(micro_batches, tokens, strict=True)):
            end = start + len(mb)
            if num_tokens <= 0:
                out.append(PassTimes(0.0, 0.0, 0.0))
            else:
                comm = self._comm(num_tokens)
                moe = moe_f(num_tokens)
                per_token = gemm(num_tokens) + moe + other(num_tokens) + comm
                attention = self.attention_scale * float(attn[start:end].sum())
                head = float(heads[j]) if heads is not None else 0.0
                out.append(PassTimes(per_token + attention, attention, head, comm,
                                     float(moe)))
            start = end
        return out


@lru_cache(maxsize=64)
def _attention_and_head(model: ModelSpec, gpu: GPUSpec, tp: int, use_tables: bool):  # noqa: ANN202
    ops = OpTimes(model, gpu, tp, use_tables)
    grid = np.unique(np.concatenate([np.arange(0, 1025, dtype=np.float64),
                                     np.geomspace(1024, 2**21, 400)]))
    attn = model.num_layers * ops.prefill_attention_s(grid)
    attn[0] = 0.0
    head = ops.gemm_s(grid, -(-model.vocab_size // tp), model.hidden_size, part=BF16)
    head[0] = 0.0
    attn, head = np.maximum.accumulate(attn), np.maximum.accumulate(head)
    last = float(grid[-1])

    def lookup(ys: np.ndarray, power: float):  # noqa: ANN202
        def f(x: np.ndarray) -> np.ndarray:
            # Beyond the grid: quadratic (attention) or linear (GEMM) growth.
            inside = np.interp(x, grid, ys)
            return np.where(x >= last, ys[-1] * (x / last) ** power, inside)
        return f

    return lookup(attn, 2.0), lookup(head, 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """How one model is parallelised over a pool: ``dp`` x ``pp`` x ``tp`` GPUs."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch_tokens: int = 16384
    """Most tokens packed in one micro-batch per data-parallel rank."""
    recompute: str = "none"
    """Activation recomputation: none | selective | full."""
    overlap_grad_reduce: bool = True
    """The gradient reduction overlaps the last micro-batch's backward pass."""
    grad_reduce_bytes: int = 4
    """Bytes per gradient element in the data-parallel reduction (fp32)."""
    zero3: bool = False
    """ZeRO-3: bf16 parameters all-gathered over the data-parallel ranks for every
    micro-batch's forward and again for its backward, and the bf16 gradients reduce-scattered
    during that backward (Rajbhandari et al., arXiv:1910.02054, sec. 7.2.2; DeepSpeed-Chat's
    ``ds_utils.py``: overlap_comm, prefetching), all under the compute: a forward takes the
    longer of its compute and one gather, a backward of its compute and two."""

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp


@dataclass(slots=True)
class PassResult:
    """Seconds of a forward (inference) or forward-backward (training) pass of a batch."""

    time_s: float
    compute_s: float
    """Time the slowest data-parallel rank computes (no bubble, no communication)."""
    bubble_s: float
    """Pipeline fill and drain of that rank (1F1B)."""
    comm_s: float = 0.0
    """Exposed gradient reduction and pipeline activation transfers."""
    optimizer_s: float = 0.0
    num_micro_batches: int = 0
    micro_batches_s: tuple[tuple[float, float], ...] = ()
    """That rank's micro-batches: (forward, backward with recomputation) seconds of one
    pipeline stage each (what a fused pipeline schedule interleaves)."""


def pack(seq_lens: Sequence[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing packing into micro-batches of at most ``max_tokens`` tokens (a
    longer sequence is a micro-batch of its own), as verl's dynamic batch size does."""
    order = sorted(seq_lens, reverse=True)
    smallest = order[-1] if order else 0
    bins: list[list[int]] = []
    # The first fit is searched among the bins that can still take the shortest sequence, in
    # the order they were opened: a bin with less room never takes another (the search is
    # quadratic, and a 20K-token step's rank fills most of its bins).
    open_bins: list[list[int]] = []
    room: list[int] = []
    for s in order:
        for i, r in enumerate(room):
            if s <= r:
                open_bins[i].append(s)
                if r - s < smallest:
                    del open_bins[i], room[i]
                else:
                    room[i] = r - s
                break
        else:
            bins.append([s])
            if max_tokens - s >= smallest:
                open_bins.append(bins[-1])
                room.append(max_tokens - s)
    return bins


def split_ranks(seq_lens: Sequence[int], dp: int) -> list[list[int]]:
    """Balance sequences over ``dp`` ranks by tokens (longest first onto the lightest rank)."""
    ranks: list[list[int]] = [[] for _ in range(dp)]
    heap = [(0, i) for i in range(dp)]  # (load, rank): the lightest, lowest-numbered first
    for s in sorted(seq_lens, reverse=True):
        load, i = heap[0]
        ranks[i].append(s)
        heapq.heapreplace(heap, (load + s, i))
    return ranks


@lru_cache(maxsize=16)
def _packed(seq_lens: tuple[int, ...], dp: int, max_tokens: int
            ) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[tuple[int, ...], ...], ...]]:
    """(non-empty ranks, each one's micro-batches) of ``seq_lens``: the same for every pass of
    a step's samples at this layout (an RL step's old-log-prob, reference and training
    passes), so packed once."""
    ranks = tuple(tuple(rank) for rank in split_ranks(seq_lens, dp) if rank)
    return ranks, tuple(tuple(tuple(mb) for mb in pack(rank, max_tokens)) for rank in ranks)


class PassModel:
    """Forward-only and forward-backward passes of a batch of sequences over a ``Layout``."""

    def __init__(self, forward: ForwardModel, layout: Layout, *, train: bool) -> None:
        self.fwd, self.layout, self.train = forward, layout, train
        m, gpu, lay = forward.model, forward.gpu, layout
        self.params_per_gpu = m.num_params / (lay.tp * lay.pp)
        # Pipeline neighbours and DP rings cross nodes once a model replica spans more than
        # one node (tp x pp) or the DP group does.
        per_node = gpu.num_gpus_per_node
        self._p2p_bw = gpu.nvlink_bw_bytes_per_s if lay.tp * lay.pp <= per_node else (
            gpu.network_bw_bytes_per_s)
        self._dp_bw = gpu.nvlink_bw_bytes_per_s if lay.num_gpus <= per_node else (
            gpu.network_bw_bytes_per_s)

    def _stage_s(self, t: PassTimes) -> tuple[float, float, float]:
        """(forward, backward with recomputation, backward alone) seconds of the slowest
        stage for a micro-batch of forward times ``t`` (the backward parts are 0 unless
        training)."""
        pp = self.layout.pp
        fwd = t.layers_s / pp + t.head_s
        if not self.train:
            return fwd, 0.0, 0.0
        mode = self.layout.recompute
        extra = fwd if mode == "full" else (t.attention_s / pp if mode == "selective" else 0.0)
        comm = t.comm_s / pp
        bwd = (fwd - comm) * BACKWARD_OVER_FORWARD + comm
        return fwd, bwd + extra, bwd

    def run(self, seq_lens: Sequence[int], *, optimizer_step: bool = True,
            reduce_grads: bool = True) -> PassResult:
        """One pass over ``seq_lens`` spread over the data-parallel ranks; when training, the
        gradient reduction (``reduce_grads``) and the Adam step (``optimizer_step``) end it
        (a streamed chunk of a mini-batch accumulates gradients without either)."""
        lay = self.layout
        worst = None
        last_bwd = 0.0
        num_mb = 0
        ranks, packed = _packed(tuple(seq_lens), lay.dp, lay.micro_batch_tokens)
        # Every rank's micro-batches timed in one call (the lookups are vectorised).
        times = iter(self.fwd.forward_many([mb for mbs in packed for mb in mbs]))
        for rank, mbs in zip(ranks, packed, strict=True):
            stages = [self._stage_s(next(times)) for _ in mbs]
            if lay.zero3:
                # The backward gathers the parameters again and reduce-scatters the bf16
                # gradients as it makes them (DeepSpeed's overlap_comm): twice the traffic.
                gather = self.param_gather_s()
                stages = [(max(f, gather), max(b, 2 * gather) if self.train else b, bb)
                          for f, b, bb in stages]
            num_mb = max(num_mb, len(stages))
            compute = sum(f + b for f, b, _ in stages)
            longest = max(f + b for f, b, _ in stages)
            bubble = (lay.pp - 1) * longest
            # Activations cross each stage boundary forward (and their gradients back).
            hops = 0.0
            if lay.pp > 1:
                toks = sum(rank)
                per_hop = toks * self.fwd.model.hidden_size * 2 / lay.tp / self._p2p_bw
                hops = per_hop * (2 if self.train else 1)
            candidate = PassResult(compute + bubble + hops, compute, bubble, hops,
                                   num_micro_batches=len(stages),
                                   micro_batches_s=tuple((f, b) for f, b, _ in stages))
            if worst is None or candidate.time_s > worst.time_s:
                last_bwd = stages[-1][2]
                worst = candidate
        if worst is None:
            worst = PassResult(0.0, 0.0, 0.0)
        worst.num_micro_batches = num_mb
        if self.train and reduce_grads:
            reduce_s = self.grad_reduce_s()
            exposed = max(0.0, reduce_s - last_bwd) if lay.overlap_grad_reduce else reduce_s
            worst.comm_s += exposed
            worst.time_s += exposed
        if self.train and optimizer_step:
            worst.optimizer_s = self.optimizer_s()
            worst.time_s += worst.optimizer_s
        return worst

    def grad_reduce_s(self) -> float:
        """Ring all-reduce of this GPU's gradient shard over the data-parallel group once the
        mini-batch is done; 0 under ZeRO-3, which reduce-scatters each micro-batch's gradients
        inside its backward (``run``)."""
        dp = self.layout.dp
        if dp <= 1 or self.layout.zero3:
            return 0.0
        num_bytes = self.params_per_gpu * self.layout.grad_reduce_bytes
        return 2 * (dp - 1) / dp * num_bytes / (self._dp_bw * rl.ALLREDUCE_BW_EFF)

    def param_gather_s(self) -> float:
        """ZeRO-3: ring all-gather of this tensor/pipeline shard's bf16 parameters from the
        data-parallel ranks (each GPU receives ``(dp - 1) / dp`` of them), once per forward or
        backward of a micro-batch; 0 without ZeRO-3 or data parallelism."""
        dp = self.layout.dp
        if not self.layout.zero3 or dp <= 1:
            return 0.0
        num_bytes = self.params_per_gpu * BF16_BYTES
        return (dp - 1) / dp * num_bytes / (self._dp_bw * rl.ALLREDUCE_BW_EFF)

    def optimizer_s(self) -> float:
        """Mixed-precision Adam over this GPU's parameters (memory-bound), the optimizer state
        sharded over the data-parallel ranks (ZeRO-1 / Megatron's distributed optimizer)."""
        num_params = self.params_per_gpu / self.layout.dp
        return num_params * OPTIMIZER_BYTES_PER_PARAM / (
            self.fwd.gpu.hbm_bw_bytes_per_s * rl.GEMM_MEMORY_EFF)


def training_state_bytes_per_gpu(model: ModelSpec, layout: Layout) -> float:
    """bf16 weights and gradients, fp32 master weights and Adam moments (16 bytes per
    parameter, Rajbhandari et al., ZeRO), sharded over tp x pp and over the data-parallel
    ranks (ZeRO-3 / FSDP full sharding, verl's default training backend). Activations come on
    top (``MEMORY_HEADROOM`` of the callers leaves room for them)."""
    return model.num_params / (layout.tp * layout.pp) * 16 / layout.dp


def model_flops_per_token(model: ModelSpec, seq_len: int) -> float:
    """Model FLOPs per trained token, forward and backward, no recomputation, as Megatron-LM
    counts them (Korthikanti et al., arXiv:2205.05198, appendix: ``72 B s l h^2 (1 + s/6h +
    V/12hl)`` for GPT): 6 x (non-embedding parameters + LM head) + 12 x layers x attention
    width x seq_len (full, not causal, attention, as that formula counts it)."""
    h_attn = model.num_attention_heads * model.head_dim
    dense = model.num_params - model.embedding_params_per_gpu(1) + (
        model.vocab_size * model.hidden_size)
    return 6 * dense + 12 * model.num_layers * h_attn * seq_len


def mfu(model: ModelSpec, gpu: GPUSpec, num_gpus: int, tokens: int, seq_len: int,
        time_s: float) -> float:
    """Model FLOPs utilisation of a training step of ``tokens`` tokens."""
    if not time_s > 0 or not math.isfinite(time_s):
        return float("nan")
    return model_flops_per_token(model, seq_len) * tokens / (time_s * num_gpus *
                                                             gpu.peak_bf16_flops)
