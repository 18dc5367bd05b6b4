"""How two accelerators share one DDR bandwidth.

Each running op asks for its unconstrained demand (``cost.demand_bytes_per_s``); the memory
controller hands out the achievable bandwidth max-min fairly (water-filling): an op asking
less than an equal share gets all it asks, the rest is split among the others. The model is
the asymmetry Agent.xpu's profiling reports (arXiv:2506.24045 v2 abstract, "asymmetric DDR
contention"): a memory-bound decode, which asks for all it can draw, slows as soon as the
other accelerator draws anything, while a compute-bound prefill, which asks for little, keeps
its speed unless the other side leaves it less than that little.
"""

from __future__ import annotations

from collections.abc import Sequence


def share_bandwidth(demands: Sequence[float], total: float) -> list[float]:
    """Max-min fair allocation of ``total`` bytes/s among ``demands`` (bytes/s each).

    Invariants: no op gets more than it asks; the allocations sum to
    ``min(total, sum(demands))``; an op asking at most ``total / len(demands)`` gets its
    whole demand.
    """
    if total <= 0:
        raise ValueError(f"total bandwidth must be > 0, got {total}")
    if any(d < 0 for d in demands):
        raise ValueError(f"bandwidth demands must be >= 0, got {list(demands)}")
    alloc = [0.0] * len(demands)
    left = total
    order = sorted(range(len(demands)), key=lambda i: demands[i])
    for rank, i in enumerate(order):
        fair = left / (len(order) - rank)
        alloc[i] = min(demands[i], fair)
        left -= alloc[i]
    return alloc
