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
    tolerance: float = 0.01,
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
    mpg = num_experts // num_gpus
    rows = np.arange(num_layers)
    lane = np.arange(spg)
    is_spare = (np.arange(num_slots) % spg) >= mpg
    phy2log = initial_phy2log.astype(np.int64, copy=True)
    masters = phy2log[:, ~is_spare]
    if not (np.sort(masters, axis=1) == np.arange(num_experts)).all():
        raise ValueError("master slots must hold every expert exactly once")
    quota = np.zeros((num_layers, num_slots))
    quota[:, ~is_spare] = np.take_along_axis(load, masters, axis=1)
    gpu_load = quota.reshape(num_layers, num_gpus, spg).sum(-1)
    mean = load.sum(1) / num_gpus
    moves = np.zeros((num_layers, num_gpus), dtype=np.int64)
    budget = np.iinfo(np.int64).max if max_new_per_gpu is None else max_new_per_gpu
    node = np.arange(num_gpus) // (gpus_per_node or num_gpus)
    active = gpu_load.max(1) > mean * (1 + tolerance)

    for _ in range(4 * num_slots):
        if not active.any():
            break
        src = gpu_load.argmax(1)
        src_slots = src[:, None] * spg + lane
        src_quota = quota[rows[:, None], src_slots]
        slot = src_slots[rows, src_quota.argmax(1)]
        expert = phy2log[rows, slot]
        slot_tokens = quota[rows, slot]

        holds_slot = phy2log == expert[:, None]
        holds = holds_slot.reshape(num_layers, num_gpus, spg).any(-1)
        allowed = node[None, :] == node[src][:, None]
        allowed[rows, src] = False
        free_load = np.where(holds & allowed, gpu_load, np.inf)
        open_slot = is_spare & (quota == 0)
        can_copy = open_slot.reshape(num_layers, num_gpus, spg).any(-1) & allowed & ~holds
        copy_load = np.where(can_copy & (moves < budget), gpu_load, np.inf)
        free_dst, copy_dst = free_load.argmin(1), copy_load.argmin(1)
        use_free = free_load[rows, free_dst] <= copy_load[rows, copy_dst]
        dst = np.where(use_free, free_dst, copy_dst)

        src_load, dst_load = gpu_load[rows, src], gpu_load[rows, dst]
        delta = np.where(
            dst_load < mean,
            np.minimum(src_load - mean, mean - dst_load),
            (src_load - dst_load) / 2,
        )
        delta = np.minimum(delta, slot_tokens)
        ok = active & np.isfinite(dst_load) & (delta > 1e-9 * np.maximum(mean, 1.0))
        if not ok.any():
            break
        dst_slots = dst[:, None] * spg + lane
        pick = np.where(use_free[:, None], holds_slot[rows[:, None], dst_slots], open_slot[rows[:, None], dst_slots])
        dst_slot = dst_slots[rows, pick.argmax(1)]

        r, d = rows[ok], delta[ok]
        quota[r, slot[ok]] -= d
        quota[r, dst_slot[ok]] += d
        phy2log[r, dst_slot[ok]] = expert[ok]
        gpu_load[r, src[ok]] -= d
        gpu_load[r, dst[ok]] += d
        moves[r, dst[ok]] += ~use_free[ok]
        active = ok & (gpu_load.max(1) > mean * (1 + tolerance))

    if np.array_equal(load, np.floor(load)):
        quota = _integer_quotas(quota, phy2log, load)
    return phy2log, quota


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
    tolerance: float = 0.01

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
