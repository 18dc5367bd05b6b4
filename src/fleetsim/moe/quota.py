"""Quota-driven real-time expert balancing, after UltraEP (Dots-Infra/UltraEP, MIT).

Design: every logical expert keeps one fixed *master* slot; each GPU's few *spare* slots are
refilled every microbatch and layer from the microbatch's exact load, and every replica gets
an explicit token *quota* instead of an even split. The planner is a greedy water-fill run
for all layers at once (numpy over layers, a Python loop over transfers):

  repeat: take the most loaded GPU and its heaviest slot (expert x); send part of that slot's
  tokens to the least loaded GPU that already holds x (free), or else to the least loaded GPU
  with an unused spare slot (costs one expert copy, within the move budget); the amount
  brings the source down to the mean or the destination up to the mean, whichever is less.

Spare slots start with the previous microbatch's replicas (quota 0), so reusing them costs no
copy. Stops when max/mean <= 1 + tolerance or no transfer helps. With integer loads the
quotas are integers (largest remainder) and sum exactly to each expert's load.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from numpy.typing import NDArray

from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import register_balancer
from fleetsim.moe.placement import (
    BalanceView,
    FloatArray,
    IntArray,
    Placement,
    check_layout,
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
    spare_lane = np.arange(spg) >= num_experts // num_gpus
    is_spare = np.tile(spare_lane, num_gpus)
    phy2log = initial_phy2log.astype(np.int64, copy=True)
    masters = phy2log[:, ~is_spare]
    if not (np.sort(masters, axis=1) == np.arange(num_experts)).all():
        raise ValueError("master slots must hold every expert exactly once")
    quota = np.zeros((num_layers, num_slots))
    quota[:, ~is_spare] = np.take_along_axis(load, masters, axis=1)

    # Within-node balancing is the same problem with one row per (layer, node).
    gpus_per_row = gpus_per_node or num_gpus
    num_rows = num_layers * (num_gpus // gpus_per_row)
    fill = _Fill(
        phy2log.reshape(num_rows, -1),
        quota.reshape(num_rows, -1),
        num_experts,
        spare_lane,
        max_new_per_gpu,
    )
    active = fill.gpu_load.max(1) > fill.mean * (1 + tolerance)
    for _ in range(2):  # bulk rounds: many disjoint transfers per layer at once
        if not active.any() or not fill.bulk_round(active, tolerance):
            break
        active = fill.gpu_load.max(1) > fill.mean * (1 + tolerance)
    for _ in range(4 * num_slots):  # then one transfer per layer, hottest GPU first
        if not active.any():
            break
        active = fill.greedy_step(active, tolerance)
    phy2log = fill.phy2log.reshape(num_layers, num_slots)
    quota = fill.quota.reshape(num_layers, num_slots)
    if np.array_equal(load, np.floor(load)):
        quota = _integer_quotas(quota, phy2log, load)
    return phy2log, quota


class _Fill:
    """Mutable water-fill state over rows (layers, or layer x node), each with its own GPUs."""

    def __init__(
        self,
        phy2log: IntArray,
        quota: FloatArray,
        num_experts: int,
        spare_lane: NDArray[np.bool_],
        max_new_per_gpu: int | None,
    ) -> None:
        num_rows, num_slots = phy2log.shape
        self.spg = spg = spare_lane.size
        self.num_gpus = num_gpus = num_slots // spg
        self.phy2log, self.quota, self.spare_lane = phy2log, quota, spare_lane
        self.is_spare = np.tile(spare_lane, num_gpus)
        self.rows = np.arange(num_rows)
        self.lane = np.arange(spg)
        self.gpu_load = quota.reshape(num_rows, num_gpus, spg).sum(-1)
        self.mean = self.gpu_load.sum(1) / num_gpus
        self.floor_tokens = 1e-9 * np.maximum(self.mean, 1.0)
        # has[r, e, g]: GPU g holds expert e in some slot (a free target for e's tokens).
        self.has = np.zeros((num_rows, num_experts, num_gpus), dtype=bool)
        self.has[self.rows[:, None], phy2log, np.arange(num_slots) // spg] = True
        self.num_open = np.where(self.is_spare & (quota == 0), 1, 0).reshape(
            num_rows, num_gpus, spg
        ).sum(-1)
        self.moves = np.zeros((num_rows, num_gpus), dtype=np.int64)
        self.budget = np.iinfo(np.int64).max if max_new_per_gpu is None else max_new_per_gpu
        self.not_self = ~np.eye(num_gpus, dtype=bool)
        self.bulk_min_excess = 0.25

    def heaviest_slot(self, r: IntArray, gpu: IntArray) -> tuple[IntArray, FloatArray]:
        slots = gpu[..., None] * self.spg + self.lane
        quota = self.quota[r[..., None], slots]
        pos = quota.argmax(-1)[..., None]
        return np.take_along_axis(slots, pos, -1)[..., 0], np.take_along_axis(quota, pos, -1)[..., 0]

    def bulk_round(self, active: NDArray[np.bool_], tolerance: float) -> bool:
        """Pair the k-th most loaded GPU with the k-th least loaded one that can take a copy;
        every pair moves tokens of the source's heaviest slot. Pairs in a row are disjoint."""
        k = self.num_gpus // 2
        excess = self.gpu_load - self.mean[:, None]
        srcs = np.argsort(-excess, axis=1)[:, :k]
        can_take = (self.num_open > 0) & (self.moves < self.budget) & (excess < 0)
        dsts = np.argsort(np.where(can_take, excess, np.inf), axis=1)[:, :k]
        src_excess = np.take_along_axis(excess, srcs, 1)
        dst_room = -np.take_along_axis(np.where(can_take, excess, -0.0), dsts, 1)
        r = np.broadcast_to(self.rows[:, None], srcs.shape)
        slot, tokens = self.heaviest_slot(r, srcs)
        expert = self.phy2log[r, slot]
        dst_slots = dsts[..., None] * self.spg + self.lane
        holds_here = self.phy2log[r[..., None], dst_slots] == expert[..., None]
        open_here = self.spare_lane & (self.quota[r[..., None], dst_slots] == 0)
        target = np.where(holds_here.any(-1)[..., None], holds_here, open_here)
        dst_slot = np.take_along_axis(dst_slots, target.argmax(-1)[..., None], -1)[..., 0]
        delta = np.minimum(np.minimum(src_excess, dst_room), tokens)
        valid = (
            active[:, None]
            & (src_excess > self.bulk_min_excess * self.mean[:, None])
            & (dst_room > 0)
            & (delta > self.floor_tokens[:, None])
        )
        if not valid.any():
            return False
        self._apply(r[valid], slot[valid], dst_slot[valid], expert[valid], delta[valid])
        return True

    def greedy_step(self, active: NDArray[np.bool_], tolerance: float) -> NDArray[np.bool_]:
        """Move tokens off the most loaded GPU of every active row; returns the new active."""
        rows, gpu_load, mean = self.rows, self.gpu_load, self.mean
        src = gpu_load.argmax(1)
        slot, slot_tokens = self.heaviest_slot(rows, src)
        expert = self.phy2log[rows, slot]
        # Least loaded destination, free (already holds the expert) or by copy.
        holds = self.has[rows, expert]
        allowed = self.not_self[src]
        free_load = np.where(holds & allowed, gpu_load, np.inf)
        can_copy = (self.num_open > 0) & allowed & ~holds & (self.moves < self.budget)
        copy_load = np.where(can_copy, gpu_load, np.inf)
        free_dst, copy_dst = free_load.argmin(1), copy_load.argmin(1)
        best_free, best_copy = free_load[rows, free_dst], copy_load[rows, copy_dst]
        use_free = best_free <= best_copy
        dst = np.where(use_free, free_dst, copy_dst)
        src_load, dst_load = gpu_load[rows, src], np.minimum(best_free, best_copy)
        # Bring src down to the mean or dst up to it, whichever is less.
        delta = np.where(
            dst_load < mean,
            np.minimum(src_load - mean, mean - dst_load),
            (src_load - dst_load) / 2,
        )
        delta = np.minimum(delta, slot_tokens)
        ok = active & np.isfinite(dst_load) & (delta > self.floor_tokens)
        if not ok.any():
            return ok
        r, e, d_gpu = rows[ok], expert[ok], dst[ok]
        dst_slots = d_gpu[:, None] * self.spg + self.lane
        holds_here = self.phy2log[r[:, None], dst_slots] == e[:, None]
        open_here = self.spare_lane & (self.quota[r[:, None], dst_slots] == 0)
        target = np.where(use_free[ok][:, None], holds_here, open_here)
        d_slot = dst_slots[np.arange(r.size), target.argmax(1)]
        self._apply(r, slot[ok], d_slot, e, delta[ok])
        return ok & (gpu_load.max(1) > mean * (1 + tolerance))

    def _apply(
        self, r: IntArray, s_slot: IntArray, d_slot: IntArray, expert: IntArray, delta: FloatArray
    ) -> None:
        """Move ``delta`` tokens of ``expert`` from slot to slot (no index repeats)."""
        spg, quota = self.spg, self.quota
        s_gpu, d_gpu = s_slot // spg, d_slot // spg
        was_open = self.is_spare[d_slot] & (quota[r, d_slot] == 0)
        self.num_open[r[was_open], d_gpu[was_open]] -= 1
        quota[r, s_slot] -= delta
        quota[r, d_slot] += delta
        self.gpu_load[r, s_gpu] -= delta
        self.gpu_load[r, d_gpu] += delta
        drained = self.is_spare[s_slot] & (quota[r, s_slot] == 0)
        self.num_open[r[drained], s_gpu[drained]] += 1
        copied = self.phy2log[r, d_slot] != expert
        if copied.any():
            rc, gc, sc, ec = r[copied], d_gpu[copied], d_slot[copied], expert[copied]
            old = self.phy2log[rc, sc]
            self.phy2log[rc, sc] = ec
            dst_slots = gc[:, None] * spg + self.lane
            self.has[rc, old, gc] = (self.phy2log[rc[:, None], dst_slots] == old[:, None]).any(1)
            self.has[rc, ec, gc] = True
            self.moves[rc, gc] += 1


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
    """

    max_moved_bytes_per_gpu: float | None = None
    tolerance: float = 0.02

    def __post_init__(self) -> None:
        if self.max_moved_bytes_per_gpu is not None and self.max_moved_bytes_per_gpu < 0:
            raise FleetsimInputError(
                "quota.max_moved_bytes_per_gpu", self.max_moved_bytes_per_gpu, "must be >= 0"
            )
        if not 0 <= self.tolerance < 1:
            raise FleetsimInputError("quota.tolerance", self.tolerance, "must be in [0, 1)")

    def plan(self, view: BalanceView) -> Placement:
        return plan_view(view, self.max_moved_bytes_per_gpu, self.tolerance, within_node=False)


def max_copies(view: BalanceView, max_bytes: float | None) -> int | None:
    if max_bytes is None:
        return None
    if view.expert_bytes <= 0:
        return None
    return int(max_bytes // view.expert_bytes)


def plan_view(
    view: BalanceView,
    max_moved_bytes_per_gpu: float | None,
    tolerance: float,
    *,
    within_node: bool,
    initial_phy2log: IntArray | None = None,
) -> Placement:
    check_layout(view.num_experts, view.num_gpus, view.gpus_per_node, view.slots_per_gpu)
    if initial_phy2log is None:
        if view.previous is not None:
            initial_phy2log = view.previous.phy2log
        else:
            initial_phy2log = static_phy2log(
                view.num_layers, view.num_experts, view.num_gpus, view.slots_per_gpu
            )
    phy2log, quota = plan_quotas(
        view.expert_load,
        initial_phy2log,
        view.num_gpus,
        gpus_per_node=view.gpus_per_node if within_node else None,
        max_new_per_gpu=max_copies(view, max_moved_bytes_per_gpu),
        tolerance=tolerance,
    )
    return quota_placement(phy2log, quota, view.expert_load, view.slots_per_gpu)
