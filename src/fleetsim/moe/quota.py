"""Quota-driven real-time expert balancing, after UltraEP (Dots-Infra/UltraEP, MIT).

Every logical expert keeps one fixed *master* slot; each GPU's few *spare* slots are refilled
every microbatch and layer from that microbatch's exact load, and every replica gets an
explicit token *quota* instead of an even split. Spare slots start with the previous
microbatch's replicas (quota 0), so reusing one costs no copy; each new copy counts against
a per-GPU move budget. With integer loads the quotas are integers (largest remainder) that
sum exactly to each expert's load. See ``_plan_layer`` for the greedy itself.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import register_balancer
from fleetsim.moe.placement import (
    BalanceView,
    FloatArray,
    IntArray,
    Placement,
    check_layout,
    packed_phy2log,
    reorder_across_nodes,
    static_phy2log,
)


def plan_quotas(
    expert_load: FloatArray,
    initial_phy2log: IntArray,
    num_gpus: int,
    *,
    gpus_per_node: int | None = None,
    max_new_per_gpu: int | None = None,
    tolerance: float = 0.02,
) -> tuple[IntArray, FloatArray]:
    """Fill spare slots and set per-slot token quotas for every layer.

    expert_load: (num_layers, num_experts) exact tokens per logical expert.
    initial_phy2log: (num_layers, num_slots) current slot contents; the first
        ``num_experts // num_gpus`` slots of each GPU are masters (each expert exactly once)
        and are never changed; spare slots may be overwritten.
    gpus_per_node: if set, tokens only move between GPUs of the same node (ReLibra's
        intra-node replication); None lets them move anywhere.
    max_new_per_gpu: expert copies each GPU may receive (the move budget); None = no limit.

    Returns ``(phy2log, quota)``: new slot contents and (num_layers, num_slots) tokens per slot;
    each expert's quotas sum to its load.
    """
    load = np.asarray(expert_load, dtype=np.float64)
    num_layers, num_experts = load.shape
    num_slots = initial_phy2log.shape[1]
    spg = num_slots // num_gpus
    num_masters = num_experts // num_gpus
    is_spare = (np.arange(num_slots) % spg) >= num_masters
    phy2log = initial_phy2log.astype(np.int64, copy=True)
    if not (np.sort(phy2log[:, ~is_spare], axis=1) == np.arange(num_experts)).all():
        raise ValueError("master slots must hold every expert exactly once")
    quota = np.zeros((num_layers, num_slots))
    budget = num_slots if max_new_per_gpu is None else max_new_per_gpu
    layout = (num_gpus, spg, num_masters, gpus_per_node or num_gpus, budget, tolerance)
    # Vectorized set-up for all layers; the sequential part runs per layer on lists.
    master_tokens = np.where(is_spare, 0.0, np.take_along_axis(load, phy2log, axis=1))
    gpu_load = master_tokens.reshape(num_layers, num_gpus, spg).sum(-1)
    master_slot = np.empty((num_layers, num_experts), dtype=np.int64)
    master_ids = np.flatnonzero(~is_spare)
    np.put_along_axis(
        master_slot,
        phy2log[:, master_ids],
        np.broadcast_to(master_ids, (num_layers, master_ids.size)),
        axis=1,
    )
    for layer in range(num_layers):
        slots, tokens = _plan_layer(
            phy2log[layer].tolist(),
            master_tokens[layer].tolist(),
            gpu_load[layer].tolist(),
            master_slot[layer].tolist(),
            *layout,
        )
        phy2log[layer] = slots
        quota[layer] = tokens
    if np.array_equal(load, np.floor(load)):
        quota = _integer_quotas(quota, phy2log, load)
    return phy2log, quota


def _plan_layer(
    slots: list[int],
    tokens: list[float],
    gpu_load: list[float],
    master_slot: list[int],
    num_gpus: int,
    spg: int,
    num_masters: int,
    gpus_per_node: int,
    budget: int,
    tolerance: float,
) -> tuple[list[int], list[float]]:
    """One layer, in plain Python: at ~64 GPUs a heap walk beats numpy's per-call overhead.

    Repeatedly the most loaded GPU sheds tokens of its heaviest slot: to a GPU of its node
    that already holds that expert (free), else by copying the expert into an open spare
    slot. The copy goes to the GPU whose room (tokens below its node's mean) is the largest that
    the slot can fill completely, else to the smallest room; filled rooms waste no slot. A
    source with an open spare slot may shed below the mean, since that slot can take a copy
    back later; this lets every GPU's spare slot absorb load, not only those below the mean.
    ``slots`` and ``tokens`` are updated in place and returned.
    """
    # Spare slots start open (quota 0); they may still hold last microbatch's replicas.
    open_slots = [list(range(g * spg + num_masters, (g + 1) * spg)) for g in range(num_gpus)]
    replicas: dict[int, list[int]] = {}
    for gpu_slots in open_slots:
        for slot in gpu_slots:
            replicas.setdefault(slots[slot], []).append(slot)
    mean = sum(gpu_load) / num_gpus
    if mean <= 0:
        return slots, tokens
    slack, floor = tolerance * mean, 1e-9 * mean
    # Load only moves inside a node, so each GPU's water level is its node's mean.
    level = []
    for first in range(0, num_gpus, gpus_per_node):
        level += [sum(gpu_load[first : first + gpus_per_node]) / gpus_per_node] * gpus_per_node
    moves = [0] * num_gpus
    # Per node, sorted (room, gpu) of GPUs below the mean that can take a copy.
    rooms: list[list[tuple[float, int]]] = [[] for _ in range(num_gpus // gpus_per_node)]
    room_key: list[tuple[float, int] | None] = [None] * num_gpus

    def refresh(gpu: int) -> None:
        key = room_key[gpu]
        node_rooms = rooms[gpu // gpus_per_node]
        if key is not None:
            del node_rooms[bisect.bisect_left(node_rooms, key)]
            room_key[gpu] = None
        room = level[gpu] - gpu_load[gpu]
        if room > floor and open_slots[gpu] and moves[gpu] < budget:
            room_key[gpu] = key = (room, gpu)
            bisect.insort(node_rooms, key)

    for gpu in range(num_gpus):
        room = level[gpu] - gpu_load[gpu]
        if room > floor and open_slots[gpu] and budget > 0:
            room_key[gpu] = (room, gpu)
            rooms[gpu // gpus_per_node].append((room, gpu))
    for node_rooms in rooms:
        node_rooms.sort()
    heap = [
        (level[g] - load_g, g) for g, load_g in enumerate(gpu_load) if load_g - level[g] > slack
    ]
    heapq.heapify(heap)
    while heap:
        neg_excess, src = heapq.heappop(heap)
        excess = gpu_load[src] - level[src]
        if excess <= slack:
            continue
        if -neg_excess != excess:  # stale entry: re-queue with the current excess
            heapq.heappush(heap, (-excess, src))
            continue
        slot = max(range(src * spg, (src + 1) * spg), key=tokens.__getitem__)
        expert, node = slots[slot], src // gpus_per_node
        can_overshoot = bool(open_slots[src]) and moves[src] < budget
        avail = tokens[slot] if can_overshoot else min(tokens[slot], excess)
        free_room, dst_slot = floor, -1
        for other in (master_slot[expert], *replicas.get(expert, ())):
            gpu = other // spg
            if (
                gpu != src
                and gpu // gpus_per_node == node
                and level[gpu] - gpu_load[gpu] > free_room
            ):
                free_room, dst_slot = level[gpu] - gpu_load[gpu], other
        if dst_slot >= 0:
            amount = min(avail, free_room)
            if tokens[dst_slot] == 0 and dst_slot in open_slots[dst_slot // spg]:
                open_slots[dst_slot // spg].remove(dst_slot)
        else:
            node_rooms = rooms[node]
            if not node_rooms:
                continue  # nothing in reach can take load: this GPU stays as it is
            at = bisect.bisect_right(node_rooms, (avail, num_gpus)) - 1
            room, dst = node_rooms[at] if at >= 0 else node_rooms[0]
            amount = min(avail, room)
            dst_slot = open_slots[dst].pop(0)
            replicas[slots[dst_slot]].remove(dst_slot)
            slots[dst_slot] = expert
            replicas.setdefault(expert, []).append(dst_slot)
            moves[dst] += 1
        tokens[slot] -= amount
        tokens[dst_slot] += amount
        gpu_load[src] -= amount
        gpu_load[dst_slot // spg] += amount
        refresh(dst_slot // spg)
        refresh(src)
        if gpu_load[src] - level[src] > slack:
            heapq.heappush(heap, (level[src] - gpu_load[src], src))
    return slots, tokens


def _integer_quotas(quota: FloatArray, phy2log: IntArray, load: FloatArray) -> FloatArray:
    """Round quotas to integers that still sum to each expert's load (largest remainder)."""
    num_layers, num_experts = load.shape
    base = np.floor(quota + 1e-9)
    key = (phy2log + (np.arange(num_layers) * num_experts)[:, None]).ravel()
    given = np.bincount(key, weights=base.ravel(), minlength=load.size)
    missing = np.rint(load.ravel() - given).astype(np.int64)
    frac = (quota - base).ravel()
    order = np.lexsort((-frac, key))
    sorted_key = key[order]
    rank = np.arange(key.size) - np.searchsorted(sorted_key, sorted_key)
    bump = np.zeros(key.size)
    bump[order] = rank < missing[sorted_key]
    return (base.ravel() + bump).reshape(quota.shape)


def quota_placement(phy2log: IntArray, quota: FloatArray, load: FloatArray, spg: int) -> Placement:
    """A ``Placement`` whose shares reproduce ``quota`` on ``load``; an expert with no load
    sends everything (of nothing) to its master."""
    expert_load = np.take_along_axis(load, phy2log, axis=1)
    num_experts = load.shape[1]
    is_master = (np.arange(phy2log.shape[1]) % spg) < num_experts // (phy2log.shape[1] // spg)
    share = np.where(
        expert_load > 0, quota / np.where(expert_load > 0, expert_load, 1.0), is_master * 1.0
    )
    return Placement(phy2log=phy2log, share_by_slot=share, slots_per_gpu=spg)


@register_balancer("quota")
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QuotaPlanner:
    """UltraEP-style: fixed masters, spare slots refilled every microbatch from the exact load,
    explicit per-replica token quotas.

    max_moved_bytes_per_gpu: expert weight bytes one GPU may receive per layer and
        microbatch; None for no limit. Divided by ``view.expert_bytes`` into a copy count.
    tolerance: stop once max/mean GPU load is within ``1 + tolerance``.
    stale_steps: plan from the load this many microbatches ago instead of the exact current
        one (0, UltraEP: counts are all-gathered after gating, before the experts run). A
        stale plan is known before the step, so its copies could be prefetched; the quotas
        are then shares of each expert's actual load. Isolates information from algorithm.
    remaster_every: every this many microbatches, re-place masters on the slow timescale:
        swap up to ``max_master_swaps`` master pairs per layer from the most to the least
        master-loaded GPU, by the mean of the last ``remaster_window`` loads. Each swap
        copies two experts (planned from history, so prefetchable). None keeps masters where
        the warm-up put them; then under drift the quota planner is bounded by the spare
        slots of the GPUs that are below the mean (one copy each per spare slot).
    """

    max_moved_bytes_per_gpu: float | None = None
    tolerance: float = 0.02
    stale_steps: int = 0
    remaster_every: int | None = None
    remaster_window: int = 16
    max_master_swaps: int = 2

    def __post_init__(self) -> None:
        if self.max_moved_bytes_per_gpu is not None and self.max_moved_bytes_per_gpu < 0:
            raise FleetsimInputError(
                "quota.max_moved_bytes_per_gpu", self.max_moved_bytes_per_gpu, "must be >= 0"
            )
        if not 0 <= self.tolerance < 1:
            raise FleetsimInputError("quota.tolerance", self.tolerance, "must be in [0, 1)")
        if self.stale_steps < 0:
            raise FleetsimInputError("quota.stale_steps", self.stale_steps, "must be >= 0")
        if self.remaster_every is not None and self.remaster_every < 1:
            raise FleetsimInputError(
                "quota.remaster_every", self.remaster_every, "must be >= 1 (or None: never)"
            )
        if self.remaster_window < 1:
            raise FleetsimInputError("quota.remaster_window", self.remaster_window, "must be >= 1")
        if self.max_master_swaps < 0:
            raise FleetsimInputError(
                "quota.max_master_swaps", self.max_master_swaps, "must be >= 0"
            )

    @property
    def sees(self) -> str:
        if self.stale_steps == 0:
            return "exact current load"
        return "previous step" if self.stale_steps == 1 else f"load {self.stale_steps} steps ago"

    @property
    def prefetchable(self) -> str:
        replicas = "no" if self.stale_steps == 0 else "yes"
        return replicas if self.remaster_every is None else f"{replicas} (master swaps: yes)"

    @property
    def history_window(self) -> int:
        """Microbatches of history it reads."""
        return max(self.stale_steps, self.remaster_window if self.remaster_every else 1)

    def plan(self, view: BalanceView) -> Placement:
        initial = None
        if (
            self.remaster_every is not None
            and view.previous is not None
            and view.history
            and view.microbatch_index % self.remaster_every == 0
        ):
            mean = np.mean(view.history[-self.remaster_window :], axis=0)
            initial = swap_masters(
                view.previous.phy2log, mean, view.num_gpus, self.max_master_swaps
            )
        planned_load = None
        if self.stale_steps:
            # At the (unscored) warm-up there is no history yet: plan on the current load.
            known = view.history[-self.stale_steps :]
            planned_load = known[0] if len(known) == self.stale_steps else view.expert_load
        return plan_view(
            view,
            self.max_moved_bytes_per_gpu,
            self.tolerance,
            within_node=False,
            initial_phy2log=initial,
            planned_load=planned_load,
        )


def swap_masters(
    phy2log: IntArray, expert_load: FloatArray, num_gpus: int, max_swaps: int
) -> IntArray:
    """``phy2log`` with up to ``max_swaps`` master pairs per layer swapped between the GPUs
    with the most and least master load under ``expert_load`` (spare slots unchanged)."""
    num_layers, num_slots = phy2log.shape
    num_experts = expert_load.shape[1]
    spg = num_slots // num_gpus
    master_cols = np.flatnonzero(np.arange(num_slots) % spg < num_experts // num_gpus)
    masters = phy2log[:, master_cols]
    gpu_of_expert = np.empty((num_layers, num_experts), dtype=np.int64)
    np.put_along_axis(gpu_of_expert, masters, np.broadcast_to(master_cols // spg, masters.shape), 1)
    new_gpu = reorder_across_nodes(expert_load, gpu_of_expert, num_gpus, max_swaps)
    phy2log = phy2log.copy()
    for layer in np.flatnonzero((new_gpu != gpu_of_expert).any(axis=1)):
        # Arrivals take the slots their GPU's leavers free; masters that stay do not move.
        freed: dict[int, list[int]] = {}
        for col, expert in zip(master_cols, masters[layer], strict=True):
            if new_gpu[layer, expert] != col // spg:
                freed.setdefault(int(col // spg), []).append(int(col))
        for expert in np.flatnonzero(new_gpu[layer] != gpu_of_expert[layer]):
            phy2log[layer, freed[int(new_gpu[layer, expert])].pop()] = expert
    return phy2log


def _max_copies(view: BalanceView, max_bytes: float | None) -> int | None:
    if max_bytes is None:
        return None
    if view.expert_bytes <= 0:
        raise FleetsimInputError(
            "expert_bytes", view.expert_bytes, "a byte budget needs the size of one expert (> 0)"
        )
    return int(max_bytes // view.expert_bytes)


def plan_view(
    view: BalanceView,
    max_moved_bytes_per_gpu: float | None,
    tolerance: float,
    *,
    within_node: bool,
    initial_phy2log: IntArray | None = None,
    planned_load: FloatArray | None = None,
) -> Placement:
    """Quota placement for ``view`` starting from ``initial_phy2log`` (default: the previous
    placement, or masters packed on the first load); shared by both real-time planners.
    ``planned_load`` (default: the exact current load) is the load the quotas are cut for;
    the placement applies them as shares of whatever load then arrives."""
    check_layout(view.num_experts, view.num_gpus, view.gpus_per_node, view.slots_per_gpu)
    load = view.expert_load if planned_load is None else planned_load
    if initial_phy2log is None:
        if view.previous is not None:
            initial_phy2log = view.previous.phy2log
        else:
            # Masters are fixed from the first load seen (the history mean if any): UltraEP
            # keeps a balanced static deployment and corrects only the fluctuation.
            first = np.mean(view.history, axis=0) if view.history else load
            initial_phy2log = packed_phy2log(first, view.num_gpus, view.slots_per_gpu)
    phy2log, quota = plan_quotas(
        load,
        initial_phy2log,
        view.num_gpus,
        gpus_per_node=view.gpus_per_node if within_node else None,
        max_new_per_gpu=_max_copies(view, max_moved_bytes_per_gpu),
        tolerance=tolerance,
    )
    return quota_placement(phy2log, quota, load, view.slots_per_gpu)


def ultraep_planner(*, within_node: bool, tolerance: float = 0.01
                    ) -> Callable[[BalanceView], Placement]:
    """UltraEP as its repository deploys it (Dots-Infra/UltraEP, README): masters fixed where
    Megatron-LM puts them (``static_phy2log``, where ``QuotaPlanner`` packs them to the first
    load), spare slots refilled from each microbatch's exact load with no move budget,
    stopping within ``tolerance`` of the mean (``ULTRA_EP_QUOTA_ORACLE_EPS`` = 0.01).
    ``within_node``: replicas stay inside a node (an NVLink domain smaller than the EP group)."""
    def plan(view: BalanceView) -> Placement:
        start = None if view.previous is not None else static_phy2log(
            view.num_layers, view.num_experts, view.num_gpus, view.slots_per_gpu)
        return plan_view(view, None, tolerance, within_node=within_node, initial_phy2log=start)
    return plan
