"""DeepSeek's wide-EP layout: attention data parallelism with expert parallelism across nodes.

How SGLang (``--enable-dp-attention --dp-size N --tp N --moe-a2a-backend deepep``) and vLLM
(``--data-parallel-size N --enable-expert-parallel``) serve DeepSeek-V3/R1 at scale: a replica
is ``dp`` attention ranks of ``tp`` GPUs each. Each rank runs attention (and the dense layers)
on its own requests with its own KV cache; the routed experts are spread over all ``dp x tp``
GPUs as one expert-parallel group, reached by an all-to-all dispatch and combine (DeepEP) on
NVLink inside a node and on the NIC between nodes.

The step follows AIConfigurator's static model (github.com/ai-dynamo/aiconfigurator,
Apache-2.0; aiconfigurator-core 0.12 ``sdk/backends/base_backend.py``: a rank's batch is the
global batch over ``attention_dp_size``, and ``sdk/models/deepseek.py`` prices the MoE
dispatch, grouped GEMM and combine over ``moe_ep_size = tp x attention_dp_size`` GPUs):

- the replica's batch is spread evenly over the ranks (decodes dealt round-robin, prefill
  chunks longest-first to the least-loaded rank); each rank's attention and dense part is the
  ``tp`` step model at its own share, and the step waits for the slowest rank (the MoE layers
  are barriers). Skew between ranks beyond this even deal (vLLM's and SGLang's DP balancing
  is not perfect) is not modelled;
- the MoE part is ``EpStepModel``'s over the whole group of ``dp x tp`` GPUs for all the
  replica's tokens (balancer-aware, all-to-all on NVLink and the NIC, ``moe/step_model.py``);
- KV capacity is the sum of the ranks': every GPU holds its rank's ``tp`` share of the
  attention and dense weights plus ``1 / (dp x tp)`` of the routed experts (and its spare
  expert slots), and the rest of its memory is KV of its rank's requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.moe.serving import EpStepModel, PoolEpConfig
from fleetsim.perf.memory import activation_reserve_bytes


def check_dp_attention(model: ModelSpec, gpu: GPUSpec, tp: int, dp: int) -> None:
    """Refuse layouts the wide-EP model does not describe, in one line each."""
    if not model.is_moe:
        raise FleetsimInputError("dp_attention", dp, f"{model.name} is dense: attention data "
                                 "parallelism with expert parallelism needs a MoE model; use "
                                 "num_replicas for independent copies")
    group = dp * tp
    per_node = gpu.num_gpus_per_node
    if group > per_node and per_node % tp:
        raise FleetsimInputError("tp", tp, f"{gpu.name} nodes have {per_node} GPUs; a rank's "
                                 f"tp must divide {per_node} when the EP group spans nodes")
    if group > per_node and group % per_node:
        raise FleetsimInputError("dp_attention", dp, f"the EP group (dp x tp = {group} GPUs) "
                                 f"spans {gpu.name} nodes of {per_node} GPUs and must fill "
                                 f"whole nodes; use a dp x tp that {per_node} divides")
    if model.num_experts % group:
        raise FleetsimInputError("dp_attention", dp, f"{model.num_experts} routed experts do "
                                 f"not split over dp x tp = {group} GPUs; use a dp x tp that "
                                 f"divides {model.num_experts}")


def _routed_expert_bytes(model: ModelSpec, tp: int) -> float:
    """Bytes of the routed experts (all MoE layers) one tensor-parallel rank of ``tp`` holds."""
    inter = -(-model.moe_intermediate_size // tp)
    q = model.quantization
    per_param = q.experts.weight_bytes if q is not None else model.weight_dtype_bytes
    return model.num_moe_layers * 3 * model.hidden_size * inter * model.num_experts * per_param


def wide_ep_weight_bytes_per_gpu(model: ModelSpec, tp: int, dp: int,
                                 num_spare_slots_per_gpu: int) -> float:
    """Weights on one GPU: its rank's ``tp`` share of everything but the routed experts, and
    ``1 / (dp x tp)`` of those plus its spare (redundant, EPLB) expert slots."""
    group = dp * tp
    routed_all = _routed_expert_bytes(model, 1)
    per_expert = routed_all / model.num_experts  # one expert, all MoE layers
    return (model.weight_bytes_per_gpu(tp) - _routed_expert_bytes(model, tp)
            + routed_all / group + num_spare_slots_per_gpu * per_expert)


def wide_ep_kv_capacity_blocks(model: ModelSpec, gpu: GPUSpec, tp: int, dp: int,
                               block_size: int, gpu_memory_utilization: float, *,
                               max_batched_tokens: int, num_spare_slots_per_gpu: int) -> int:
    """KV blocks of one wide-EP replica: ``dp`` ranks' caches together (each rank profiles
    its share of the step budget, as each vLLM DP engine does with its own)."""
    budget = gpu.hbm_bytes * gpu_memory_utilization
    weights = wide_ep_weight_bytes_per_gpu(model, tp, dp, num_spare_slots_per_gpu)
    rank_tokens = -(-max_batched_tokens // dp)
    free = budget - weights - activation_reserve_bytes(model, tp, rank_tokens)
    block_bytes = block_size * model.kv_bytes_per_token_per_gpu(tp)
    if free < block_bytes:
        raise FleetsimInputError(
            "dp_attention", dp, f"{model.name} needs {weights / 1e9:.1f} GB of weights per "
            f"GPU at dp {dp} x tp {tp}, leaving no KV memory on {gpu.name} at "
            f"gpu_memory_utilization={gpu_memory_utilization}; use a larger dp or tp")
    return dp * int(free // block_bytes)


class DpAttentionStepModel:
    """A ``StepTimeModel`` of one wide-EP replica: ``dp`` attention ranks priced by ``base``
    (the ``tp`` step model) at their share of the batch, the slowest rank gating the step, and
    the MoE layers over the ``dp x tp`` EP group. Keeps the bit-exact decode contract."""

    def __init__(self, base: object, model: ModelSpec, gpu: GPUSpec, tp: int, dp: int,
                 cfg: PoolEpConfig, *, max_tokens: int = 16384, seed: int = 0) -> None:
        check_dp_attention(model, gpu, tp, dp)
        self.base, self.dp = base, dp
        # EpStepModel over the whole group prices the MoE layers of the replica's tokens;
        # each rank's own tensor-parallel MoE is taken out of its tp step below.
        self._ep = EpStepModel(base, model, gpu, dp * tp, cfg, max_tokens=max_tokens,
                               seed=seed)
        self._base_moe = base.op_time_lookup("moe")  # type: ignore[attr-defined]
        self.balance_ratio = self._ep.balance_ratio
        group, per_node = dp * tp, gpu.num_gpus_per_node
        links = ("NVLink" if group <= per_node else
                 f"NVLink inside a node, the NIC ({gpu.network_bw_bytes_per_s / 1e9:g} GB/s "
                 f"per GPU) across {group // per_node} nodes")
        self.sources = dict(getattr(base, "sources", {}))
        self.sources["moe"] = self._ep.sources["moe"] + f"; all-to-all on {links}"
        self.sources["dp_attention"] = (
            f"{dp} attention ranks x tp {tp}, batch dealt evenly, slowest rank gates the step "
            "(AIConfigurator's static attention-DP model; rank imbalance not modelled)")

    def group_moe_s(self, num_tokens: int) -> float:
        """Seconds of all MoE layers over the EP group for the replica's ``num_tokens``."""
        return self._ep._moe_delta_s(num_tokens) + self._base_moe(num_tokens)

    def _ranks(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
               decode_kv_tokens: int) -> list[tuple[list[tuple[int, int]], int, int]]:
        """The even deal: decodes round-robin (KV in proportion, whole tokens: the tp step
        model takes token counts, and the compiled engine insists on ints), chunks
        longest-first to the rank with the fewest tokens."""
        dp = self.dp
        decodes = [num_decode // dp + (i < num_decode % dp) for i in range(dp)]
        chunks: list[list[tuple[int, int]]] = [[] for _ in range(dp)]
        load = list(decodes)
        for chunk in sorted(prefill_chunks, key=lambda c: -c[0]):
            i = load.index(min(load))
            chunks[i].append(chunk)
            load[i] += chunk[0]
        return [(chunks[i], decodes[i],
                 decode_kv_tokens * decodes[i] // num_decode if num_decode else 0)
                for i in range(dp)]

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        if not prefill_chunks:
            base, per_kv, extra = self.decode_terms_s(num_decode)
            return (base + per_kv * decode_kv_tokens) + extra
        num_tokens = num_decode + sum(new for new, _ in prefill_chunks)
        slowest = -math.inf
        for chunks, n, kv in self._ranks(prefill_chunks, num_decode, decode_kv_tokens):
            # the rank's attention and dense part: its tp step without its tp MoE
            tokens = n + sum(new for new, _ in chunks)
            t = self.base.step_time_s(chunks, n, kv) - self._base_moe(tokens)  # type: ignore[attr-defined]
            slowest = max(slowest, t)
        return slowest + self.group_moe_s(num_tokens)

    def decode_step_times_s(self, num_decode: int,
                            decode_kv_tokens: NDArray[np.int64]) -> NDArray[np.float64]:
        base, per_kv, extra = self.decode_terms_s(num_decode)
        return (base + per_kv * np.asarray(decode_kv_tokens).astype(np.float64)) + extra

    def decode_terms_s(self, num_decode: int) -> tuple[float, float, float]:
        """``step_time_s((), n, kv) == (base + per_kv * kv) + extra``, bit for bit: the
        slowest rank holds ``ceil(n / dp)`` decodes and their share of the KV."""
        rank = -(-num_decode // self.dp)
        base, per_kv, extra = self.base.decode_terms_s(rank)  # type: ignore[attr-defined]
        share = rank / num_decode if num_decode else 0.0
        return base, per_kv * share, extra + (self.group_moe_s(num_decode)
                                              - self._base_moe(rank))
