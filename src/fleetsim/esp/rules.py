"""LoongServe's elastic decisions, as pure functions: when a decode batch lends its instances
to prefill, where a prefill's KV is kept (proactive scale-down), how many masters a decode
batch uses, and whether freeing an instance by migration pays.

Sources (``loongserve/longserve_server/router/manager.py``):

- pause rule, ``_schedule_new_req_list_with_decoding``: with ``T`` the analytical model,
  ``speedup = (T(idle) - T(idle + batch instances)) * sum(1/l_in)`` of the new requests and
  ``slowdown = T(idle + batch instances) * |batch| * |batch| / sum(output tokens so far)``;
  the batch is paused (its instances join the prefill) iff speedup >= slowdown;
- scale-down placement, ``_get_batch_prefill_migration_plan``: the batch's instances sorted by
  used KV, most first, and each request's tokens poured into them in order, so the KV lands on
  as few instances as possible and the rest are released;
- migration before prefill, ``_minimize_decoding_occupied_instances``: an instance is emptied
  into the others while the prefill speedup of one more instance exceeds its migration time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def prefill_speedup_s(t_idle_s: float, t_lent_s: float, inv_input_sum: float) -> float:
    """Per-input-token latency the new prefills gain when a decode batch's instances join."""
    return (t_idle_s - t_lent_s) * inv_input_sum


def decode_slowdown_s(t_lent_s: float, batch_size: int, num_output_tokens: int) -> float:
    """Per-output-token latency the paused decode batch loses while the prefill runs."""
    return t_lent_s * batch_size * batch_size / max(1, num_output_tokens)


def should_pause(t_idle_s: float, t_lent_s: float, inv_input_sum: float, batch_size: int,
                 num_output_tokens: int) -> bool:
    """LoongServe's rule: lend the batch's instances iff the speedup is at least the
    slowdown (``T(0 instances)`` is infinite, so an empty pool always borrows)."""
    if math.isinf(t_idle_s):
        return True
    return (prefill_speedup_s(t_idle_s, t_lent_s, inv_input_sum)
            >= decode_slowdown_s(t_lent_s, batch_size, num_output_tokens))


def place_scaled_down(lengths: Sequence[int], used: Sequence[int], capacity: int
                      ) -> list[dict[int, int]]:
    """Where each request's prompt KV is kept: ``used[i]`` tokens already on instance ``i``
    (of the batch), instances filled most-used first up to ``capacity``. Returns, per
    request, instance index -> tokens. Every token is placed exactly once."""
    order = sorted(range(len(used)), key=lambda i: (-used[i], i))
    room = [capacity - used[i] for i in order]
    if sum(lengths) > sum(room):
        raise ValueError(f"{sum(lengths)} prompt tokens do not fit {sum(room)} free slots")
    placement: list[dict[int, int]] = []
    slot = 0
    for length in lengths:
        left = length
        where: dict[int, int] = {}
        while left > 0:
            while room[slot] == 0:
                slot += 1
            take = min(left, room[slot])
            where[order[slot]] = where.get(order[slot], 0) + take
            room[slot] -= take
            left -= take
        placement.append(where)
    return placement


def num_masters(batch_size: int, num_instances: int, min_compute_bound_batch: int) -> int:
    """Master instances of a decode batch: one while the batch is memory-bound, then one per
    ``min_compute_bound_batch`` requests (the artifact's ``--min_comp_bound_decoding_batch_size
    128``), at most one per instance holding its KV."""
    return max(1, min(num_instances, batch_size // min_compute_bound_batch))


def migration_pays(speedup_s: float, migration_s: float) -> bool:
    """Free one more instance for prefill only when the prefill gains at least the move."""
    return speedup_s >= migration_s
