"""The two halves of a token-budget plan, shared by the batching policies: serve the running
requests, then admit waiting ones. Plain functions over a ``ReplicaView`` (compiled with the
engine by ``make native``; the policy classes stay interpreted so users can subclass them).
"""

from __future__ import annotations

from fleetsim.serving.kv_cache import blocks_short
from fleetsim.serving.views import ReplicaView


def serve_running(
    view: ReplicaView, tokens: dict[int, int], budget: int, available: int, cap: int
) -> tuple[int, int, list[int]]:
    """Give running requests (best first) the tokens they need, at most ``cap`` each, under
    the budget; when KV blocks run out, preempt from the worst end until the current request
    fits (it may be the victim itself). Fills ``tokens``; returns the budget and blocks left
    and the preempted ids, in order.
    """
    kv = view.kv
    running = view.running
    preempt: list[int] = []
    last = len(running)  # requests at index >= last were preempted this step
    i = 0
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    while i < last and budget > 0:
        req = running[i]
        num_new = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
        limit = budget if budget < cap else cap
        if num_new > limit:
            num_new = limit
        needed = blocks_short(req, req.num_computed_tokens + num_new, bs, per_entry)
        if needed < 0:
            needed = 0
        while needed > available and last > i:
            last -= 1
            victim = running[last]
            preempt.append(victim.id)
            available += kv.reclaimable_blocks(victim)
        if last == i:  # the request itself was the victim
            break
        tokens[req.id] = num_new
        budget -= num_new
        available -= needed
        i += 1
    return budget, available, preempt


def admit_waiting(
    view: ReplicaView, tokens: dict[int, int], budget: int, available: int, cap: int,
    chunked: bool,
) -> None:
    """Admit waiting requests in order while the budget, ``max_running`` and KV allow; the
    first that does not fit stops admission (no overtaking). Without ``chunked``, a prompt
    is admitted whole or not at all. Fills ``tokens``."""
    kv = view.kv
    num_running = len(view.running)
    for req in view.waiting:
        if budget <= 0 or num_running >= view.max_running:
            return
        todo = req.num_tokens - kv.num_prefix_hit_tokens(req)
        num_new = min(todo, budget, cap)
        if num_new < todo and not chunked:
            return
        needed = kv.admission_blocks(req, num_new)
        if needed > available:
            return
        tokens[req.id] = num_new
        budget -= num_new
        available -= needed
        num_running += 1


