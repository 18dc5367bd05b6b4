"""Step times of the three MoE serving systems ExpertPlex compares (``expertplex.py``).

Every GPU runs attention data-parallel (its own requests) and the routed experts run
expert-parallel on a pool; each step is the dense part of the step (fleetsim's measured tables
for one GPU, ``perf/step_model.py``, minus their MoE term) plus, per MoE layer, the dispatch and
combine all-to-alls (``moe/step_model.all_to_all_s``) and the pool's expert GEMMs priced in
tiles (``moe/tile_model.py``). The three systems differ only in which GPUs hold what:

- colocated: an instance's GPUs hold attention and an EP shard of the experts and run both
  phases in one step (prefill tokens lengthen the decode step);
- instance-level PD: the same instance, prefill-only or decode-only;
- ExpertPlex: attention GPUs per phase, one shared expert pool whose SMs the two phases share
  at tile granularity, with the published APK overheads on expert GEMMs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fleetsim.hardware import GPUSpec
from fleetsim.models import ModelSpec
from fleetsim.moe.compute import EpHardware, MoeLayerSpec, default_compute
from fleetsim.moe.step_model import ExpertParallelConfig, all_to_all_s
from fleetsim.moe.tile_model import TileLatency, expected_tiles_per_expert, reallocate_sms
from fleetsim.perf import build_step_model

H200_SMS = 132
"""SMs of an H100/H200 SXM (NVIDIA H100 datasheet; H200 is the same GH100 die)."""
APK_DECODE_SLOWDOWN = 1.08
APK_PREFILL_SLOWDOWN = 1.12
"""ExpertPlex's measured cost of its persistent kernels vs exclusive runs [paper, arXiv
2607.18002, via a third-party summary]."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SmPolicy:
    """ExpertPlex's decode SM share: q' = min(Q_max, ceil_c(q_ref * x / x_ref))."""

    q_ref: int
    x_ref: float
    q_max: int
    cluster: int


@dataclass
class CostModel:
    """Per-step seconds of every group kind for one model on one GPU type."""

    model: ModelSpec
    gpu: GPUSpec
    tile_m: int
    num_sms: int = H200_SMS
    nvlink_domain: int = 8
    """GPUs that reach each other over NVLink (HGX H200: 8); the rest over the network."""
    _tiles: dict[int, TileLatency] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spec = MoeLayerSpec.from_model(self.model)
        self.hw = EpHardware.from_gpu(self.gpu)
        self.dense = build_step_model(self.model, self.gpu, 1)
        self._moe = self.dense.op_time_lookup("moe")
        self.layers = self.spec.num_moe_layers

    def tile_latency(self, pool: int) -> TileLatency:
        if pool not in self._tiles:
            compute = default_compute(self.spec, self.hw, pool, 4096 * self.spec.top_k)
            self._tiles[pool] = TileLatency.fit(compute, self.spec.num_experts // pool,
                                                self.tile_m, self.num_sms)
        return self._tiles[pool]

    def tiles_per_gpu(self, tokens: float, pool: int) -> float:
        """Expected x_moe of one pool GPU for one layer of ``tokens`` tokens."""
        mean = tokens * self.spec.top_k / self.spec.num_experts
        return self.spec.num_experts / pool * expected_tiles_per_expert(mean, self.tile_m)

    def expert_s(self, tokens: float, pool: int, sms: int | None = None) -> float:
        return self.tile_latency(pool).seconds(self.tiles_per_gpu(tokens, pool), sms)

    def a2a_s(self, tokens: float, pool: int, span: int) -> float:
        """Dispatch + combine of one layer: ``span`` GPUs take part (attention and pool)."""
        node = min(span, self.nvlink_domain)
        span = -(-span // node) * node
        ep = ExpertParallelConfig(num_gpus=span, gpus_per_node=node, balancer="none")
        per_gpu = np.full(span, tokens * self.spec.top_k / pool)
        dispatch, combine = all_to_all_s(per_gpu, ep, self.spec, self.hw)
        return float(dispatch + combine)

    def dense_s(self, chunks: Sequence[int], decode: int, kv: int, gpus: int) -> float:
        """The slowest of ``gpus`` data-parallel attention GPUs (prompts dealt round-robin,
        decodes split evenly), the MoE term of the one-GPU tables removed."""
        worst = 0.0
        # Without prompts the first GPU holds the most decodes: it is the slowest.
        for g in range(gpus if chunks else min(gpus, 1)):
            mine = [(n, 0) for n in chunks[g::gpus]]
            n_dec = decode // gpus + (1 if g < decode % gpus else 0)
            if not mine and not n_dec:
                continue
            kv_g = kv * n_dec // max(decode, 1)
            tokens = sum(n for n, _ in mine) + n_dec
            t = self.dense.step_time_s(mine, n_dec, kv_g) - self._moe(tokens)
            worst = max(worst, t)
        return worst

    def colocated_step_s(self, chunks: Sequence[int], decode: int, kv: int, gpus: int
                         ) -> float:
        """One step of an instance (both phases) or of a PD instance (one of them)."""
        tokens = sum(chunks) + decode
        moe = self.a2a_s(tokens, gpus, gpus) + self.expert_s(tokens, gpus)
        return self.dense_s(chunks, decode, kv, gpus) + self.layers * moe

    def plex_decode_s(self, decode: int, kv: int, gpus: int, pool: int, span: int,
                      sms: int) -> tuple[float, float]:
        """(step s, expert s) of ExpertPlex's decode group given ``sms`` pool SMs."""
        expert = self.layers * self.expert_s(decode, pool, sms) * APK_DECODE_SLOWDOWN
        total = self.dense_s((), decode, kv, gpus) + self.layers * self.a2a_s(
            decode, pool, span) + expert
        return total, expert

    def plex_prefill_s(self, chunks: Sequence[int], gpus: int, pool: int, span: int,
                       sms: float) -> float:
        """ExpertPlex's prefill step; ``sms`` its mean SM share of the pool over the step."""
        tokens = sum(chunks)
        lat = self.tile_latency(pool)
        x = self.tiles_per_gpu(tokens, pool)
        expert = (lat.fixed_s + lat.per_tile_s * x * lat.num_sms / sms) * APK_PREFILL_SLOWDOWN
        return self.dense_s(chunks, 0, 0, gpus) + self.layers * (
            self.a2a_s(tokens, pool, span) + expert)

    def decode_sms(self, policy: SmPolicy, decode: int, pool: int) -> int:
        return reallocate_sms(policy.q_ref, self.tiles_per_gpu(decode, pool), policy.x_ref,
                              policy.q_max, policy.cluster)
