"""UltraEP's per-layer balancing operations in time: plan update, token reroute, replica weight
sync (master -> replicas over NVLink) and replica gradient reduce (replicas -> master), and the
part of each that the layer's compute cannot hide.

UltraEP (arXiv:2606.04101; Dots-Infra/UltraEP, MIT) refills every rank's spare slots in every
layer of every micro-batch, and reuses the spare-slot buffers across layers (9.9 GB -> 108 MB
per slot on Qwen3-235B, UltraEP blog), so *every* replica a layer uses is copied from its
master when that layer runs: the copy volume is the number of used spare slots, not the
change from the previous micro-batch. Hot experts are multicast to many ranks; UltraEP's
"chunk streaming relay" lets a few of the receivers forward chunks (a two-stage tree, chunks
pipelined), so no rank sends more than a few copies. The relay defaults are those of the
public code's README (``ULTRA_EP_WEIGHT_SYNC_*``: adaptive, relay from 6 replicas, at most 8
relays, only when the fan-out drops at least 2x).

Ordering (UltraEP blog, forward and backward timelines): the plan needs the gated counts and
gates the dispatch, so it is exposed; reroute runs beside the weight sync and hides behind it;
the forward weight sync sits on the critical path. In the backward pass the open-source
Megatron patch re-syncs replica weights before the MoE weight-gradient GEMM, saturating the
SMs as in the forward pass (exposed, blog footnote 1), and the gradient reduce overlaps the
router and attention backward of the same layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def exposed_s(comm_s: float, overlap_s: float) -> float:
    """Seconds of ``comm_s`` left on the critical path when it runs beside ``overlap_s``
    seconds of independent work: ``max(0, comm - overlap)``."""
    if comm_s < 0 or overlap_s < 0:
        raise ValueError(f"times must be >= 0, got comm {comm_s}, overlap {overlap_s}")
    return max(0.0, comm_s - overlap_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadModel:
    """Costs of UltraEP's operations; each parameter names its source."""

    plan_update_s: float = 70e-6
    """``update_placement`` (count all-gather + on-GPU quota solver) per layer: the paper's
    measured ~0.07 ms at EP64 (UltraEP blog / arXiv:2606.04101). An input, not modelled."""
    reroute_s: float = 40e-6
    """``reroute`` per layer: the paper's measured ~0.04 ms. An input, not modelled."""
    link_latency_s: float = 10e-6
    """Start-up of one NVLink copy operation: aiconfigurator-core's ``p2p_latency`` for GB200
    (systems/gb200.yaml, NVIDIA, Apache-2.0)."""
    relay_min_replicas: int = 6
    """A hot expert is relayed only from this many replicas (README default)."""
    relay_max_relays: int = 8
    """Most relays per expert (README default)."""
    relay_min_fanout_gain: float = 2.0
    """Relay only if the source's fan-out falls by at least this factor (README default)."""

    def __post_init__(self) -> None:
        for name in ("plan_update_s", "reroute_s", "link_latency_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise FleetsimInputError(name, value, "must be a finite number of seconds >= 0")
        if self.relay_min_replicas < 2 or self.relay_max_relays < 1:
            raise FleetsimInputError(
                "relay", (self.relay_min_replicas, self.relay_max_relays),
                "need relay_min_replicas >= 2 and relay_max_relays >= 1")
        if self.relay_min_fanout_gain < 1:
            raise FleetsimInputError(
                "relay_min_fanout_gain", self.relay_min_fanout_gain, "must be >= 1")


def relay_fanout(num_replicas: int, model: OverheadModel) -> tuple[int, int]:
    """(relays, copies the busiest sender of this expert sends) for a multicast to
    ``num_replicas`` ranks: direct (0 relays, ``num_replicas`` copies from the master) unless a
    two-stage tree (master -> r relays -> the rest) cuts the fan-out by the required gain."""
    direct = (0, num_replicas)
    if num_replicas < model.relay_min_replicas:
        return direct
    best = direct
    for relays in range(1, min(model.relay_max_relays, num_replicas) + 1):
        fanout = max(relays, math.ceil((num_replicas - relays) / relays))
        if fanout < best[1]:
            best = (relays, fanout)
    if num_replicas / best[1] < model.relay_min_fanout_gain:
        return direct
    return best


def multicast_copies(
    phy2log: IntArray, used: NDArray[np.bool_], num_gpus: int, num_masters: int,
    model: OverheadModel,
) -> tuple[IntArray, IntArray]:
    """Expert copies each GPU receives and sends to fill the used spare slots of one layer.

    phy2log: (num_slots,) expert per slot, the first ``num_masters`` slots of each GPU its
        masters; used: (num_slots,) spare slots holding a replica that serves tokens.
    Returns (received, sent), each (num_gpus,) expert copies. A relay receives its copy like
    any replica and sends its share of the rest.
    """
    spg = phy2log.size // num_gpus
    slot_gpu = np.arange(phy2log.size) // spg
    is_master = (np.arange(phy2log.size) % spg) < num_masters
    master_gpu = np.empty(int(phy2log.max()) + 1, dtype=np.int64)
    master_gpu[phy2log[is_master]] = slot_gpu[is_master]
    received = np.zeros(num_gpus, dtype=np.int64)
    sent = np.zeros(num_gpus, dtype=np.int64)
    replica = used & ~is_master
    for expert in np.unique(phy2log[replica]):
        dst = slot_gpu[replica & (phy2log == expert)]
        received[dst] += 1
        relays, fanout = relay_fanout(dst.size, model)
        if relays == 0:
            sent[master_gpu[expert]] += dst.size
            continue
        # The master feeds the relays; each relay forwards to its share of the others.
        sent[master_gpu[expert]] += relays
        rest = dst.size - relays
        for i in range(relays):
            sent[dst[i]] += rest // relays + (1 if i < rest % relays else 0)
        assert max(relays, math.ceil(rest / relays)) == fanout
    return received, sent


def transfer_s(copies: IntArray, bytes_per_copy: float, link_bytes_per_s: float,
               model: OverheadModel) -> float:
    """Seconds for every GPU to move ``copies`` (num_gpus,) expert copies over its own link
    (GPUs in parallel; the busiest one gates); 0 when nothing moves."""
    busiest = int(copies.max()) if copies.size else 0
    if busiest == 0:
        return 0.0
    return model.link_latency_s + busiest * bytes_per_copy / link_bytes_per_s


def sync_s(
    phy2log: IntArray, used: NDArray[np.bool_], num_gpus: int, num_masters: int,
    bytes_per_copy: float, link_bytes_per_s: float, model: OverheadModel,
) -> float:
    """One layer's replica weight sync (or, in reverse, gradient reduce): the busiest GPU's
    received or sent bytes over its NVLink bandwidth (one direction each way, in parallel),
    chunks pipelined through the relays."""
    received, sent = multicast_copies(phy2log, used, num_gpus, num_masters, model)
    return max(transfer_s(received, bytes_per_copy, link_bytes_per_s, model),
               transfer_s(sent, bytes_per_copy, link_bytes_per_s, model))


@dataclass(frozen=True, slots=True)
class LayerOverheads:
    """UltraEP's seconds for one layer of one micro-batch; ``*_exposed_s`` are on the critical
    path, the rest is what each operation takes."""

    plan_s: float
    reroute_s: float
    weight_sync_s: float
    grad_reduce_s: float
    forward_exposed_s: float
    backward_exposed_s: float

    @property
    def exposed_s(self) -> float:
        return self.forward_exposed_s + self.backward_exposed_s


def layer_overheads(
    weight_sync: float, grad_reduce: float, router_attention_backward_s: float,
    model: OverheadModel, *, train: bool,
) -> LayerOverheads:
    """Combine the operation times by UltraEP's ordering (module docstring): forward exposes
    plan + weight sync + what reroute does not hide behind the sync; training adds the
    backward re-sync and the part of the gradient reduce the router and attention backward
    (``router_attention_backward_s``) do not hide."""
    forward = model.plan_update_s + weight_sync + exposed_s(model.reroute_s, weight_sync)
    backward = 0.0
    if train:
        backward = weight_sync + exposed_s(grad_reduce, router_attention_backward_s)
    return LayerOverheads(model.plan_update_s, model.reroute_s, weight_sync,
                          grad_reduce if train else 0.0, forward, backward)
