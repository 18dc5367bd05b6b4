"""Pipeline parallelism: a replica's layers split over ``pp`` stages of ``tp`` GPUs each.

Layout (vLLM): stage ``s`` holds layers ``stage_layer_ranges(L, pp)[s]`` on GPUs
``s*tp .. (s+1)*tp - 1``, numbered node by node, so a stage boundary crosses the network when
it falls on a node edge and NVLink otherwise. The first stage holds the embedding, the last the
LM head and the sampler. Each stage keeps the KV of its own layers for every cached token, so
the replica's block count is the smallest over stages of (free memory / block bytes of that
stage's layers). Between stages vLLM sends the hidden state and the residual (bf16) of every
token, each TP rank a 1/tp slice (``send_tensor_dict(..., all_gather_group=tp)``).

Scheduling follows vLLM V1's engine core (``EngineCore.step_with_batch_queue``,
vllm/v1/engine/core.py, as of v0.14, January 2026; the batch queue is older): a batch queue of
``max_concurrent_batches = pp`` in-flight batches, each scheduled from the requests not already
in flight, so up to ``pp`` micro-batches share the pipeline and each request is in at most one
of them. A request's next token is scheduled only after its micro-batch has left the last
stage, so in steady state the time between two steps of a request (the engine's step time here)
is the period of a cyclic pipeline of ``m = min(num_seqs, pp)`` equal micro-batches: the larger
of one micro-batch's trip (CPU cost + every stage + every send; "latency is the sum over
stages") and the busiest resource's work per cycle (``m`` x the slowest stage, ``m`` x the CPU
cost; "throughput is one micro-batch per stage time"). With fewer requests than stages (``m <
pp``) the pipeline runs part-empty: that is vLLM's bubble. The micro-batches are the step's
work split evenly (the steady state of a loaded replica; vLLM's greedy batch queue can leave
them uneven after a burst). With async scheduling (vLLM >= 0.14 with PP, PR #32359) the CPU
cost leaves the trip and only ``async_step_gap_s`` remains in it. The engine's one token budget
covers the whole step (vLLM gives each in-flight batch its own; docs/parallelism.md says when
that matters).

Speculative decoding (``with_speculation``): every stage runs the verify pass of its layers,
``k + 1`` positions per decoding sequence (the token-indexed terms see them all; decode
attention reads each sequence's KV once, as ``perf/speculative.py`` prices it), the last stage
samples at every verified position, and the drafter runs on the last stage only: vLLM V1 puts
"the entire draft model on the last PP rank" (``GPUModelRunner.__init__``,
vllm/v1/worker/gpu_model_runner.py), so its ``k`` passes (one over the micro-batch's tokens,
``k - 1`` over one token per sequence) join that stage's time, each priced as one average layer
of the stage plus the LM head and sampler (``TableStepModel.layer_pass_s``'s rule).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.perf import roofline as rl
from fleetsim.perf.breakdown import build_step_model, check_tp
from fleetsim.perf.memory import MAX_NUM_SEQS, activation_reserve_bytes
from fleetsim.perf.step_model import ASYNC_STEP_GAP_S, TableStepModel

ACTIVATION_TENSORS = 2
"""Tensors sent per token between stages: the hidden state and the residual (vLLM's
``IntermediateTensors`` of Llama/Qwen/DeepSeek models), each ``hidden_size`` bf16 values."""


def stage_layer_ranges(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """``[start, end)`` layers of each stage, vLLM's ``get_pp_indices`` rule
    (vllm/distributed/utils.py): ``num_layers // pp`` each, and the remainder one extra
    layer each on the stages before the last, counted from the second-to-last backwards (the
    last stage also carries the final norm and the LM head)."""
    if not 1 <= pp <= num_layers:
        raise FleetsimInputError("pp", pp, f"must be in 1..{num_layers} (the model's layers)")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for n in sizes:
        out.append((start, start + n))
        start += n
    return out


def stage_spec(model: ModelSpec, start: int, end: int) -> ModelSpec:
    """``model`` cut to layers ``[start, end)`` (DeepSeek's leading dense layers kept where
    they fall), for per-stage kernel times, weights and KV bytes."""
    dense = max(0, min(end, model.num_dense_layers) - start)
    return dataclasses.replace(model, num_layers=end - start, num_dense_layers=dense)


def crosses_node(gpu: GPUSpec, tp: int, boundary: int) -> bool:
    """Whether the boundary after stage ``boundary`` (0-based) joins two nodes: the last GPU of
    that stage and the first of the next sit in different NVLink domains."""
    last = (boundary + 1) * tp - 1
    return last // gpu.num_gpus_per_node != (last + 1) // gpu.num_gpus_per_node


def check_pp(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int) -> None:
    """Raise ``FleetsimInputError`` unless ``tp`` x ``pp`` is a layout vLLM can run."""
    if not isinstance(pp, int) or pp < 1:
        raise FleetsimInputError("pp", pp, "must be an integer >= 1")
    if pp > model.num_layers:
        raise FleetsimInputError("pp", pp, f"{model.name} has {model.num_layers} layers; use "
                                 f"pp <= {model.num_layers}")
    if pp > 1 and tp * pp > gpu.num_gpus_per_node and gpu.num_gpus_per_node % tp:
        raise FleetsimInputError(
            "tp", tp, f"a replica of tp={tp} x pp={pp} spans {gpu.name} nodes of "
            f"{gpu.num_gpus_per_node} GPUs, so tp must divide {gpu.num_gpus_per_node} (a stage "
            "never straddles two nodes); pick tp from the divisors")


def p2p_s(message_bytes: float, bw_bytes_per_s: float) -> float:
    """One point-to-point send: nccl-tests small-message latency plus bytes at the link's
    achieved fraction (the roofline all-reduce's constants, ``perf/roofline.py``)."""
    if message_bytes <= 0:
        return 0.0
    return rl.ALLREDUCE_LATENCY_S + message_bytes / (bw_bytes_per_s * rl.ALLREDUCE_BW_EFF)


def cyclic_period_s(stage_s: Sequence[float], cpu_s: float, sends_s: float, m: int,
                    trip_cpu_s: float | None = None) -> float:
    """Steady-state time between two passes of one micro-batch when ``m`` identical
    micro-batches cycle through the CPU (``cpu_s`` each) and the stages (``stage_s``, one
    server each) with the sends (``sends_s`` in all) as pure delays: the larger of one
    micro-batch's trip and the busiest server's work per cycle (a closed tandem queue with
    deterministic service). ``trip_cpu_s``: the CPU time on the trip (async scheduling
    overlaps it; None: ``cpu_s``)."""
    trip = (cpu_s if trip_cpu_s is None else trip_cpu_s) + sends_s
    busiest = 0.0
    for t in stage_s:
        trip += t
        if t > busiest:
            busiest = t
    period = trip
    if m * busiest > period:
        period = m * busiest
    if m * cpu_s > period:
        period = m * cpu_s
    return period


class PipelineStepModel:
    """``StepTimeModel`` of a replica of ``pp`` stages (``tp`` GPUs each): the period of
    vLLM V1's batch-queue pipeline (module docstring). ``stages[s]`` is the stage's kernel
    model (no CPU term); ``send_bw[b]`` the per-GPU bandwidth of boundary ``b``."""

    def __init__(self, stages: Sequence[TableStepModel], send_bw_bytes_per_s: Sequence[float],
                 *, hidden_size: int, tp: int, step_overhead_s: float,
                 step_overhead_per_seq_s: float, async_scheduling: bool,
                 async_step_gap_s: float = ASYNC_STEP_GAP_S) -> None:
        self.stages = list(stages)
        self.pp = len(self.stages)
        if len(send_bw_bytes_per_s) != self.pp - 1:
            raise ValueError("one send bandwidth per stage boundary")
        self.send_bw = [float(b) for b in send_bw_bytes_per_s]
        # bytes per token each GPU of a stage sends (its 1/tp slice of hidden + residual)
        self.send_bytes_per_token = ACTIVATION_TENSORS * hidden_size * 2.0 / tp
        self.step_overhead_s = float(step_overhead_s)
        self.step_overhead_per_seq_s = float(step_overhead_per_seq_s)
        self.async_scheduling = bool(async_scheduling)
        self.async_step_gap_s = float(async_step_gap_s)
        # Expert parallelism inside each stage (``with_moe_delta``): all MoE layers' change from
        # the TP MoE at a token count, and each stage's share of those layers.
        self.moe_delta_s: Callable[[float], float] | None = None
        self.moe_share = [0.0] * self.pp
        self.ep_balance_ratio: float | None = None  # the EP balancer's slowdown, when set
        # Speculative decoding (``with_speculation``): positions verified per decoding
        # sequence (k + 1; 1: off) and draft passes on the last stage (k; 0 for n-gram).
        self.num_verify = 1
        self.num_draft_passes = 0
        first = self.stages[0]
        self.sources = dict(getattr(first, "sources", {}))
        links = ", ".join(f"{b / 1e9:g} GB/s" for b in self.send_bw)
        self.sources["pipeline"] = (
            f"{self.pp} stages of {[s.model.num_layers for s in self.stages]} layers, "
            f"activations over {links} per GPU; vLLM V1 batch queue of {self.pp} micro-batches")

    def with_moe_delta(self, moe_delta_s: Callable[[float], float], num_moe_layers: int,
                       source: str) -> PipelineStepModel:
        """A copy whose stages run their MoE layers the way ``moe_delta_s`` prices them (the
        change from the TP MoE of all ``num_moe_layers``, at a token count: an
        ``EpStepModel``'s), each stage its share of the layers."""
        out = copy.copy(self)
        out.moe_delta_s = moe_delta_s
        out.moe_share = [s.model.num_moe_layers / num_moe_layers for s in self.stages]
        out.sources = {**self.sources, "moe": source}
        return out

    def with_speculation(self, num_speculative_tokens: int, num_draft_passes: int,
                         source: str) -> PipelineStepModel:
        """A copy that verifies ``num_speculative_tokens + 1`` positions per decoding
        sequence on every stage and runs ``num_draft_passes`` draft-head passes on the last
        (module docstring); ``(0, 0)`` prices exactly as this pipeline does."""
        out = copy.copy(self)
        out.num_verify = num_speculative_tokens + 1
        out.num_draft_passes = num_draft_passes
        out.sources = {**self.sources, "speculative": source}
        return out

    def _draft_s(self, num_tokens: float, num_decode: float) -> tuple[float, float]:
        """The drafter's KV-free seconds and seconds per KV token on the last stage: one
        pass over the micro-batch's tokens, the rest over one token per sequence."""
        s = self.stages[-1]
        layers = s.model.num_layers
        per_kv = s._dec_c.at(num_decode) / layers
        first = (s._tok.at(num_tokens) + s._dec_a.at(num_decode)) / layers
        rest = (s._tok.at(num_decode) + s._dec_a.at(num_decode)) / layers
        if self.moe_delta_s is not None:  # the head's MoE, as one layer of the EP model's
            num_layers = sum(t.model.num_layers for t in self.stages)
            first += self.moe_delta_s(num_tokens) / num_layers
            rest += self.moe_delta_s(num_decode) / num_layers
        sample = s._seq.at(num_decode)
        passes = self.num_draft_passes
        return first + sample + (passes - 1) * (rest + sample), passes * per_kv

    def _parts_s(self, num_tokens: float, num_seqs: float, num_decode: float,
                 prefill_att_s: Sequence[float] | None, num_sampled: float | None = None
                 ) -> tuple[float, float, list[float], list[float]]:
        """For one micro-batch: CPU cost, total sends, and per stage the KV-free kernel
        time and the decode seconds per KV token. ``num_sampled``: positions the last stage
        samples (None: one per sequence)."""
        cpu = self.step_overhead_s + self.step_overhead_per_seq_s * num_seqs
        fixed, per_kv = [], []
        last = self.pp - 1
        for i, s in enumerate(self.stages):
            t = s._tok.at(num_tokens) + s._dec_a.at(num_decode)
            if i == last:  # the LM head and the sampler run on the last stage only
                t = t + s._seq.at(num_seqs if num_sampled is None else num_sampled)
            if self.moe_delta_s is not None:
                t = t + self.moe_share[i] * self.moe_delta_s(num_tokens)
            fixed.append(t if prefill_att_s is None else t + prefill_att_s[i])
            per_kv.append(s._dec_c.at(num_decode))
        if self.num_draft_passes and num_decode:
            draft, draft_per_kv = self._draft_s(num_tokens, num_decode)
            fixed[last] += draft
            per_kv[last] += draft_per_kv
        msg = self.send_bytes_per_token * num_tokens
        sends = 0.0
        for bw in self.send_bw:
            sends += p2p_s(msg, bw)
        return cpu, sends, fixed, per_kv

    def _period(self, cpu: float, sends: float, fixed: list[float], per_kv: list[float],
                kv: float, m: int) -> float:
        return cyclic_period_s([f + c * kv for f, c in zip(fixed, per_kv, strict=True)],
                               cpu, sends, m,
                               self.async_step_gap_s if self.async_scheduling else cpu)

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        """Seconds between two steps of a request (see the module docstring)."""
        verify = num_decode * self.num_verify  # positions of the decodes (1 each unspeculated)
        num_tokens = verify
        for new, _ in prefill_chunks:
            num_tokens += new
        num_seqs = num_decode + len(prefill_chunks)
        m = min(num_seqs, self.pp) or 1
        att = None
        if prefill_chunks:
            att = [s._prefill_attention_s(prefill_chunks) / m for s in self.stages]
        cpu, sends, fixed, per_kv = self._parts_s(num_tokens / m, num_seqs / m, num_decode / m,
                                                  att, (verify + len(prefill_chunks)) / m)
        return self._period(cpu, sends, fixed, per_kv, decode_kv_tokens / m, m)

    def decode_step_times_s(self, num_decode: int, decode_kv_tokens: NDArray[np.int64]
                            ) -> NDArray[np.float64]:
        """``step_time_s((), num_decode, kv)`` per element, bit for bit (same float ops)."""
        m = min(num_decode, self.pp) or 1
        verify = num_decode * self.num_verify
        cpu, sends, fixed, per_kv = self._parts_s(
            verify / m, num_decode / m, num_decode / m, None, verify / m)
        kv = np.asarray(decode_kv_tokens).astype(np.float64) / m
        trip = np.full(kv.shape, (self.async_step_gap_s if self.async_scheduling else cpu)
                       + sends)
        busiest = np.zeros(kv.shape)
        for f, c in zip(fixed, per_kv, strict=True):
            t = f + c * kv
            trip = trip + t
            busiest = np.maximum(busiest, t)
        period = np.maximum(trip, m * busiest)
        return np.maximum(period, m * cpu)


def pipeline_memory(model: ModelSpec, tp: int, pp: int, max_batched_tokens: int
                    ) -> list[tuple[float, float, float]]:
    """Per stage: (weight bytes, activation bytes, KV bytes per token) on one of its GPUs.

    Layers' weights and KV follow the stage's layers; the embedding sits on the first stage,
    the LM head and the sampler's logits on the last (vLLM's ``PPMissingLayer`` elsewhere);
    with tied embeddings both ends hold the matrix."""
    # embeddings are priced at the bytes ``ModelSpec.weight_bytes_per_gpu`` gives them
    emb_dtype = 2 if model.quantization is not None else model.weight_dtype_bytes
    full_emb = model.embedding_params_per_gpu(tp) * emb_dtype
    one_emb = full_emb // (1 if model.tie_word_embeddings else 2)
    out = []
    for s, (start, end) in enumerate(stage_layer_ranges(model.num_layers, pp)):
        spec = stage_spec(model, start, end)
        weights = spec.weight_bytes_per_gpu(tp) - full_emb
        weights += one_emb * ((s == 0) + (s == pp - 1))
        act = activation_reserve_bytes(spec, tp, max_batched_tokens)
        if s != pp - 1:  # the sampler's float32 logits live on the last stage only
            act -= MAX_NUM_SEQS * model.vocab_size * 4
        out.append((float(weights), float(act), float(spec.kv_bytes_per_token_per_gpu(tp))))
    return out


def pipeline_kv_capacity_blocks(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int,
                                block_size: int, gpu_memory_utilization: float = 0.9, *,
                                max_batched_tokens: int = 8192) -> int:
    """KV blocks of a ``tp`` x ``pp`` replica: every stage holds its layers' share of every
    block, so the replica's count is the smallest stage's (vLLM takes the minimum of the
    workers' profiled block counts). Raises ``FleetsimInputError`` when a stage's weights
    and activations do not fit."""
    budget = gpu.hbm_bytes * gpu_memory_utilization
    blocks = []
    for s, (weights, act, kv_per_token) in enumerate(
            pipeline_memory(model, tp, pp, max_batched_tokens)):
        free = budget - weights - act
        if free < block_size * kv_per_token:
            raise FleetsimInputError(
                "pp", pp, f"stage {s} of {model.name} at tp={tp} x pp={pp} needs "
                f"{weights / 1e9:.1f} GB of weights and {act / 1e9:.1f} GB of activations per "
                f"GPU but {gpu.name} offers {budget / 1e9:.1f} GB at gpu_memory_utilization="
                f"{gpu_memory_utilization}; raise pp or tp, lower engine.max_batched_tokens, "
                "or use a bigger GPU")
        blocks.append(int(free // (block_size * kv_per_token)))
    return min(blocks)


def build_pipeline_step_model(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int,
                              backend: str = "auto", *, step_overhead_s: float,
                              step_overhead_per_seq_s: float, kernel_time_scale: float,
                              async_scheduling: bool, async_step_gap_s: float
                              ) -> PipelineStepModel:
    """The step model of a ``tp`` x ``pp`` replica: one kernel-only table model per stage
    (its layers on ``tp`` GPUs; measured tables where they cover it), the activations sent
    over NVLink inside a node and over the NIC between nodes (``GPUSpec``'s bandwidths)."""
    check_tp(model, gpu, tp)
    check_pp(model, gpu, tp, pp)
    stages = [build_step_model(stage_spec(model, a, b), gpu, tp, backend, step_overhead_s=0.0,
                               kernel_time_scale=kernel_time_scale)
              for a, b in stage_layer_ranges(model.num_layers, pp)]
    bws = [gpu.network_bw_bytes_per_s if crosses_node(gpu, tp, b) else gpu.nvlink_bw_bytes_per_s
           for b in range(pp - 1)]
    return PipelineStepModel(stages, bws, hidden_size=model.hidden_size, tp=tp,
                             step_overhead_s=step_overhead_s,
                             step_overhead_per_seq_s=step_overhead_per_seq_s,
                             async_scheduling=async_scheduling, async_step_gap_s=async_step_gap_s)
