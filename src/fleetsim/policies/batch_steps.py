"""The two halves of a token-budget plan, shared by the batching policies: serve the running
requests, then admit waiting ones. Plain functions over a ``ReplicaView`` (compiled with the
engine by ``make native``; the policy classes stay interpreted so users can subclass them).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetsim.serving.contract import PLAN_DEFAULTS, StepPlan, new_named_tuple
from fleetsim.serving.kv_cache import blocks_short
from fleetsim.serving.request import Request
from fleetsim.serving.views import ReplicaView


def plan_token_budget(view: ReplicaView, chunked: bool, threshold: int | None,
                      full_input: bool) -> StepPlan:
    """``TokenBudgetPlanner.plan`` with recompute preemption: serve the running requests,
    then, if none was preempted, admit waiting ones (one compiled call per planned step:
    the policy class stays interpreted, so that users can subclass it)."""
    budget = view.max_batched_tokens
    cap = threshold or budget
    tokens: dict[int, int] = {}
    budget, available, preempt = serve_running(
        view, tokens, budget, view.kv.num_available_blocks, cap)
    if not preempt:
        admit_waiting(view, tokens, budget, available, cap, chunked, full_input)
    return new_named_tuple(StepPlan, (tokens, tuple(preempt), *PLAN_DEFAULTS))


def as_list(queue: Sequence[Request]) -> list[Request]:
    """A replica's queue as the list it is (compiled, a list is indexed and iterated
    natively; a ``Sequence`` generically), or a list of a view's other sequence."""
    return queue if isinstance(queue, list) else list(queue)


def next_chunk(req: Request, limit: int, bs: int, per_entry: int) -> tuple[int, int]:
    """A running request's tokens this step (what it needs, at most ``limit``) and the new
    blocks they take."""
    num_new = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
    if num_new > limit:
        num_new = limit
    needed = blocks_short(req, req.num_computed_tokens + num_new, bs, per_entry)
    if needed < 0:  # (a statement: ``needed if needed > 0 else 0`` boxes the native int)
        needed = 0
    return num_new, needed


def serve_running(
    view: ReplicaView, tokens: dict[int, int], budget: int, available: int, cap: int
) -> tuple[int, int, list[int]]:
    """Give running requests (best first) the tokens they need, at most ``cap`` each, under
    the budget; when KV blocks run out, preempt from the worst end until the current request
    fits (it may be the victim itself). Fills ``tokens``; returns the budget and blocks left
    and the preempted ids, in order.
    """
    kv = view.kv
    running = as_list(view.running)
    preempt: list[int] = []
    last = len(running)  # requests at index >= last were preempted this step
    i = 0
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    while i < last and budget > 0:
        req = running[i]
        num_new, needed = next_chunk(req, budget if budget < cap else cap, bs, per_entry)
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


def serve_running_swapping(
    view: ReplicaView, tokens: dict[int, int], budget: int, available: int, cap: int
) -> tuple[int, int, list[int], list[int]]:
    """``serve_running`` with vLLM's swap preemption: a victim's KV is copied to host memory,
    and its blocks come free only when the copy is done (the copy overlaps compute), so they
    are not credited now: the request that ran short waits, with the rest of the batch behind
    it, until they are. Blocks already on their way out count, so no further victim is taken
    while they cover the shortfall, and while a request waits for them no block is left for
    the plan's other phases (0 returned): swap-ins and admissions wait with it. A victim that
    does not fit the host tier (or has no KV yet) is recomputed instead. Fills ``tokens``;
    returns the budget and blocks left, the recomputed ids and the swapped-out ids, in order.
    """
    kv = view.kv
    running = as_list(view.running)
    preempt: list[int] = []
    swap_out: list[int] = []
    last = len(running)
    coming = view.num_blocks_swapping_out
    host_free = view.num_free_host_blocks
    i = 0
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    while i < last and budget > 0:
        req = running[i]
        num_new, needed = next_chunk(req, budget if budget < cap else cap, bs, per_entry)
        while needed > available + coming and last > i:
            last -= 1
            victim = running[last]
            host_blocks = kv.num_blocks_for(victim.num_computed_tokens)
            if 0 < host_blocks <= host_free:
                swap_out.append(victim.id)
                host_free -= host_blocks
                coming += kv.reclaimable_blocks(victim)
            else:
                preempt.append(victim.id)
                available += kv.reclaimable_blocks(victim)
        if last == i:
            break  # it was the victim
        if needed > available:
            # It waits for blocks on their way out, and the blocks free now are its too:
            # handed to a swap-in or an admission, they would leave it short again when the
            # copies land, and it would swap out the newcomers, take them back in, and so on
            # without ever computing (measured: Heddle's Fix-1 at 32B, docs/reproductions.md).
            # vLLM v0 cannot meet this (its swap-out frees the blocks at once), and swaps
            # nothing in after a step that preempted (``Scheduler._schedule_default``).
            available = 0
            break
        tokens[req.id] = num_new
        budget -= num_new
        available -= needed
        i += 1
    return budget, available, preempt, swap_out


def swap_in_in_order(view: ReplicaView, available: int) -> tuple[tuple[int, ...], int]:
    """Swapped requests to bring back, oldest swap first, while their blocks (and one more
    token each) and the running slots allow; returns them and the blocks left."""
    kv = view.kv
    slots = view.max_running - len(view.running) - view.num_swapping_in
    chosen: list[int] = []
    for req in view.swapped:
        need = kv.num_blocks_for(req.num_computed_tokens + 1)
        if slots <= 0 or need > available:
            break
        chosen.append(req.id)
        available -= need
        slots -= 1
    return tuple(chosen), available


def admit_waiting(
    view: ReplicaView, tokens: dict[int, int], budget: int, available: int, cap: int,
    chunked: bool, full_input: bool = False,
) -> None:
    """Admit waiting requests in order while the budget, ``max_running`` and KV allow; the
    first that does not fit stops admission (no overtaking). Without ``chunked``, a prompt
    is admitted whole or not at all. With ``full_input``, the blocks of the whole input must
    fit the available ones, though only the chunk's are taken (current vLLM v1's
    ``scheduler_reserve_full_isl``). Fills ``tokens``."""
    kv = view.kv
    num_running = len(view.running) + view.num_swapping_in  # swaps in take slots when done
    for req in as_list(view.waiting):
        if budget <= 0 or num_running >= view.max_running:
            return
        todo = req.num_tokens - kv.num_prefix_hit_tokens(req)
        num_new = todo  # (statements: compiled, the builtin ``min`` is a generic call)
        if budget < num_new:
            num_new = budget
        if cap < num_new:
            num_new = cap
        if num_new < todo and not chunked:
            return
        needed = kv.admission_blocks(req, num_new)
        if needed > available or (full_input and num_new < todo
                                  and kv.admission_blocks(req, todo) > available):
            return
        tokens[req.id] = num_new
        budget -= num_new
        available -= needed
        num_running += 1


