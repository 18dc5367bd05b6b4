"""Moving experts in MoE *training*, in bytes and seconds: a per-batch re-placement (ReLibra's
cross-node reordering, EPLB's re-plan) and per-microbatch replicas inside a node (ReLibra's
intra-batch replication), over NVLink inside a node and the network across nodes, and the part
of each that the batch's compute cannot hide.

Training differs from serving in two ways that decide these costs:

- Every logical expert has one *owner* GPU that keeps its optimizer state (fp32 main weights
  and Adam's two moments: Megatron-LM's mixed-precision distributed optimizer) and applies the
  optimizer step. Re-placing an expert's owner moves its bf16 weights (needed before the
  layer's first forward of the batch) and its optimizer state (needed only at the batch's
  optimizer step, so it can trickle in behind the whole batch).
- Weights change at every optimizer step, so a replica held for a whole batch (EPLB's
  redundant slots) must be refreshed from the owner at every batch start, and its accumulated
  gradient reduced back to the owner before the next step. Within a batch weights do not
  change (gradient accumulation), so a per-microbatch replica that stays in its slot costs
  nothing more.

Copies queue on each GPU's link in layer order: a copy for layer ``l`` must have landed
before layer ``l`` runs, so it is hidden behind the compute of the layers before it
(``pipelined_exposed_s``). The network link is shared with the all-to-alls, so only compute
(dense and expert GEMMs), not all-to-all time, counts as hiding time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.overheads import OverheadModel, exposed_s, sync_s

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingStateBytes:
    """Bytes per expert parameter that travel with a moved expert (Megatron-LM defaults)."""

    weight_bytes_per_param: float = 2.0
    """bf16 weights (Megatron-LM ``--bf16``)."""
    optimizer_bytes_per_param: float = 12.0
    """fp32 main weights + Adam ``exp_avg`` + ``exp_avg_sq`` (mixed-precision Adam keeps
    three fp32 values per parameter: Megatron-LM's distributed optimizer)."""
    grad_bytes_per_param: float = 4.0
    """fp32 ``main_grad`` accumulation buffer (Megatron-LM's default
    ``accumulate_allreduce_grads_in_fp32``)."""

    def __post_init__(self) -> None:
        for name in ("weight_bytes_per_param", "optimizer_bytes_per_param",
                     "grad_bytes_per_param"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise FleetsimInputError(name, value, "must be a finite number of bytes >= 0")


@dataclass(frozen=True, slots=True)
class BatchTransfers:
    """Per-layer seconds of one batch-start re-placement, each (num_layers,), and its bytes."""

    weights_s: FloatArray
    """Weights to new owners and to batch replicas: needed before the layer's first forward."""
    optimizer_s: FloatArray
    """Optimizer state to new owners: needed only at the batch's optimizer step."""
    grads_s: FloatArray
    """Batch replicas' gradients back to their owners, after the last backward."""
    intra_bytes: float
    """Bytes moved over NVLink (all layers)."""
    inter_bytes: float
    """Bytes moved over the network (all layers)."""


def static_owners(num_layers: int, num_experts: int, num_gpus: int) -> IntArray:
    """Megatron-LM's owners: expert ``e`` on GPU ``e // (num_experts / num_gpus)``."""
    owner = np.arange(num_experts) // (num_experts // num_gpus)
    return np.broadcast_to(owner, (num_layers, num_experts)).astype(np.int64)


def choose_owners(phy2log: IntArray, previous_owner: IntArray, slots_per_gpu: int) -> IntArray:
    """(num_layers, num_experts) owner GPU of every expert under ``phy2log``: the previous owner
    if it still holds the expert (its optimizer state stays), else the GPU of the expert's
    first slot. Placements with masters (ReLibra) pass only the master columns."""
    num_layers, num_slots = phy2log.shape
    num_experts = previous_owner.shape[1]
    gpu = np.arange(num_slots) // slots_per_gpu
    # A descending slot walk leaves each expert's first slot written last.
    owner = np.full((num_layers, num_experts), -1, dtype=np.int64)
    rows = np.arange(num_layers)
    for col in range(num_slots - 1, -1, -1):
        owner[rows, phy2log[:, col]] = gpu[col]
    if (owner < 0).any():
        raise FleetsimInputError("phy2log", "an expert with no slot", "every expert needs one")
    holds_prev = np.zeros((num_layers, num_experts), dtype=bool)
    for col in range(num_slots):
        expert = phy2log[:, col]
        holds_prev[rows, expert] |= previous_owner[rows, expert] == gpu[col]
    return np.where(holds_prev, previous_owner, owner)


def _link_s(recv: FloatArray, sent: FloatArray, bytes_per_s: float, latency_s: float
            ) -> FloatArray:
    """(num_layers,) seconds for every GPU to receive and send its bytes over its own link
    (both directions at once; the busiest GPU gates)."""
    busiest = np.maximum(recv, sent).max(-1)
    return np.where(busiest > 0, latency_s + busiest / bytes_per_s, 0.0)


def batch_transfers(
    phy2log: IntArray, previous_owner: IntArray, *, slots_per_gpu: int, gpus_per_node: int,
    params_per_expert: float, state: TrainingStateBytes, intra_bytes_per_s: float,
    inter_bytes_per_s: float, link_latency_s: float, fixed_owners: bool = False,
    held: IntArray | None = None,
) -> tuple[IntArray, BatchTransfers]:
    """The new owners and the transfers of a batch whose placement is ``phy2log`` (num_layers,
    num_slots), when ``previous_owner`` (num_layers, num_experts) owned the experts during the
    last optimizer step. Every GPU that holds an expert and is not its previous owner receives
    its weights from the previous owner; a new owner also receives the optimizer state; a GPU
    holding an expert it does not own sends its gradient to the owner at the end. Links run in
    parallel: a layer's time is its slower link's.

    ``fixed_owners`` keeps every owner (and its optimizer state) where it is, so every other
    holder is a replica; ``held`` (num_layers, num_slots), the slots of an earlier micro-batch
    of the same batch, marks copies that are still current (no new copy, and their gradient is
    already counted): a placement re-planned inside a batch."""
    num_layers, num_slots = phy2log.shape
    num_experts = previous_owner.shape[1]
    num_gpus = num_slots // slots_per_gpu
    owner = (previous_owner if fixed_owners
             else choose_owners(phy2log, previous_owner, slots_per_gpu))
    # Unique (layer, gpu, expert) holdings: two slots of one expert on one GPU are one copy.
    gpu = np.broadcast_to(np.arange(num_slots) // slots_per_gpu, phy2log.shape)
    layer = np.broadcast_to(np.arange(num_layers)[:, None], phy2log.shape)
    key = np.unique((layer * num_gpus + gpu) * num_experts + phy2log)
    current = np.zeros(key.shape, dtype=bool)
    if held is not None:
        current = np.isin(key, (layer * num_gpus + gpu) * num_experts + held)
    lay, rest = np.divmod(key, num_gpus * num_experts)
    dst, expert = np.divmod(rest, num_experts)
    src, own = previous_owner[lay, expert], owner[lay, expert]
    by_link = {kind: {d: np.zeros((num_layers, num_gpus)) for d in ("recv", "sent")}
               for kind in ("intra", "inter")}
    totals = {"weights": np.zeros(num_layers), "optimizer": np.zeros(num_layers),
              "grads": np.zeros(num_layers)}
    moved = {"intra": 0.0, "inter": 0.0}

    def add(mask: NDArray[np.bool_], sender: IntArray, receiver: IntArray,
            bytes_per_copy: float) -> FloatArray:
        """Charge one copy per ``mask`` pair; returns this phase's per-layer seconds."""
        links = {}
        for kind, bw in (("intra", intra_bytes_per_s), ("inter", inter_bytes_per_s)):
            same = sender // gpus_per_node == receiver // gpus_per_node
            pick = mask & (same if kind == "intra" else ~same)
            recv, sent = np.zeros((num_layers, num_gpus)), np.zeros((num_layers, num_gpus))
            np.add.at(recv, (lay[pick], receiver[pick]), bytes_per_copy)
            np.add.at(sent, (lay[pick], sender[pick]), bytes_per_copy)
            by_link[kind]["recv"] += recv
            by_link[kind]["sent"] += sent
            moved[kind] += float(pick.sum()) * bytes_per_copy
            links[kind] = _link_s(recv, sent, bw, link_latency_s)
        return np.maximum(links["intra"], links["inter"])

    weights = state.weight_bytes_per_param * params_per_expert
    totals["weights"] = add((dst != src) & ~current, src, dst, weights)
    new_owner = (dst == own) & (own != src)
    totals["optimizer"] = add(new_owner, src, dst,
                              state.optimizer_bytes_per_param * params_per_expert)
    totals["grads"] = add((dst != own) & ~current, dst, own,
                          state.grad_bytes_per_param * params_per_expert)
    return owner, BatchTransfers(totals["weights"], totals["optimizer"], totals["grads"],
                                 moved["intra"], moved["inter"])


def pipelined_exposed_s(copy_s: FloatArray, ready_s: FloatArray) -> float:
    """Seconds the compute waits for copies that queue on one link in order: copy ``l`` is
    needed ``ready_s[l]`` seconds after the copies start (the compute that runs before it).
    Waiting for one copy delays every later one by the same amount, so the longest wait is
    the exposed time."""
    if copy_s.shape != ready_s.shape:
        raise ValueError(f"shapes differ: copies {copy_s.shape}, ready {ready_s.shape}")
    if copy_s.size == 0:
        return 0.0
    return max(0.0, float((np.cumsum(copy_s) - ready_s).max()))


def batch_exposed_s(transfers: BatchTransfers, *, forward_compute_s: float,
                    backward_compute_s: float, batch_compute_s: float) -> dict[str, float]:
    """Exposed seconds of a batch-start re-placement: weights layer by layer behind the first
    microbatch's forward compute; gradients layer by layer (last layer first, as backward
    produces them) behind the last microbatch's backward compute; optimizer state behind the
    batch's compute left over by the other two on the same links."""
    num_layers = transfers.weights_s.size
    fwd, bwd = forward_compute_s / num_layers, backward_compute_s / num_layers
    # Layer l's MoE runs after l earlier layers and its own attention (about a third of a
    # layer's compute; the weights are needed only by the expert GEMMs).
    ready = fwd * np.arange(num_layers, dtype=np.float64) + fwd / 3
    weights = pipelined_exposed_s(transfers.weights_s, ready)
    # Layer l's gradient is ready after the backward of layers L-1..l; the step waits for all.
    grads_in_order = transfers.grads_s[::-1]
    finish = 0.0
    for k, g in enumerate(grads_in_order):
        finish = max(finish, (k + 1) * bwd) + g
    grads = max(0.0, finish - num_layers * bwd) if num_layers else 0.0
    busy = float(transfers.weights_s.sum() + transfers.grads_s.sum())
    optimizer = exposed_s(float(transfers.optimizer_s.sum()), max(0.0, batch_compute_s - busy))
    return {"weights": weights, "optimizer": optimizer, "grads": grads}


def new_replicas(phy2log: IntArray, previous: IntArray | None, used: NDArray[np.bool_],
                 slots_per_gpu: int, num_masters: int) -> NDArray[np.bool_]:
    """(num_layers, num_slots) spare slots serving tokens whose expert the GPU did not hold in
    ``previous`` (the last microbatch's slots; None at a batch start, after the optimizer step
    changed every weight): these need a copy from the master."""
    is_spare = (np.arange(phy2log.shape[1]) % slots_per_gpu) >= num_masters
    fresh = used & is_spare[None, :]
    if previous is None:
        return fresh
    num_layers, num_slots = phy2log.shape
    num_gpus = num_slots // slots_per_gpu
    new = phy2log.reshape(num_layers, num_gpus, slots_per_gpu)
    old = previous.reshape(num_layers, num_gpus, slots_per_gpu)
    held = (new[..., :, None] == old[..., None, :]).any(-1).reshape(num_layers, num_slots)
    return fresh & ~held


def replica_sync_s(phy2log: IntArray, copies: NDArray[np.bool_], *, num_gpus: int,
                   num_masters: int, expert_bytes: float, link_bytes_per_s: float,
                   overheads: OverheadModel) -> FloatArray:
    """(num_layers,) seconds to copy the marked spare slots from their masters inside the node
    (UltraEP's multicast with relays, ``overheads.sync_s``)."""
    return np.array([sync_s(phy2log[layer], copies[layer], num_gpus, num_masters,
                            expert_bytes, link_bytes_per_s, overheads)
                     for layer in range(phy2log.shape[0])])
