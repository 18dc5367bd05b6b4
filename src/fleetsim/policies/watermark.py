"""vLLM v0's (and Sarathi-Serve's) admission: a prompt enters only when KV for all of it fits
above a watermark, and those blocks are reserved at once.

vLLM v0's block manager (``vllm/core/block_manager.py``, ``can_allocate``) admits a waiting
sequence group only if ``free_blocks - prompt_blocks >= watermark_blocks`` with
``watermark_blocks = int(0.01 * num_gpu_blocks)``, then allocates the whole prompt's blocks
(``allocate``), even when chunked prefill computes it over several steps (Sarathi-Serve is
built on that scheduler). fleetsim's ``token_budget`` follows vLLM v1 up to 2025, where
``allocate_slots`` takes only the blocks of the chunk scheduled now: more prompts start, and
under memory pressure running ones are preempted and recomputed. Current vLLM v1 added a gate
between the two (``scheduler_reserve_full_isl = True``: the whole input must fit the free
blocks, but only the chunk's blocks are taken; ``watermark`` defaults to 0); docs/engine.md
compares the three.

The reservation lives in the planner: a running request still prefilling is owed the blocks
for the rest of its sequence; decodes and new admissions see the free blocks less what is
owed. Preempting a request returns its blocks and what it was owed.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetsim.policies.batch_steps import next_chunk
from fleetsim.policies.batching import register_batch
from fleetsim.serving.capabilities import Capabilities
from fleetsim.serving.contract import StepPlan
from fleetsim.serving.views import ReplicaView


@register_batch("watermark")
@dataclass(slots=True)
class WatermarkPlanner:
    """vLLM v0 / Sarathi-Serve: running requests first (each prefill drawing on the blocks it
    reserved), then waiting ones in order, each admitted only if the blocks for its whole
    sequence leave ``watermark`` of the cache free; no overtaking.

    Fast-forward is safe as for ``token_budget``: with nothing admitted or preempted, later
    decode-only steps only see fewer free blocks, and nothing is owed once prefills end.
    """

    watermark: float = 0.01
    """Share of the KV cache kept free at admission (vLLM v0's ``watermark``, 0.01)."""
    enable_chunked_prefill: bool = True
    """Compute a prompt over several steps (Sarathi-Serve); it still reserves all of it."""

    # A lone running prompt given the whole budget draws its chunk's blocks from what it has
    # reserved (never the pool: no preemption) and leaves admission no budget, step after step
    # while its rest is at least the budget: prefill chunks repeat.
    capabilities = Capabilities(fast_forward_safe=True, decodes_all_when_idle=True,
                                prefill_chunks_repeat=True)

    def __post_init__(self) -> None:
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def splits_prompts(self) -> bool:
        return self.enable_chunked_prefill

    def plan(self, view: ReplicaView, now_s: float) -> StepPlan:
        kv = view.kv
        owed = {}  # request_id -> blocks reserved for the rest of its prefill
        for req in view.running:
            todo = req.num_tokens_to_next_output
            if todo > 1:
                owed[req.id] = kv.blocks_needed(req, todo)
        pool = kv.num_available_blocks - sum(owed.values())
        tokens: dict[int, int] = {}
        budget, pool, preempt = _serve_reserved(view, tokens, view.max_batched_tokens, pool,
                                                owed)
        if not preempt:
            self._admit(view, tokens, budget, pool)
        return StepPlan(tokens, tuple(preempt))

    def _admit(self, view: ReplicaView, tokens: dict[int, int], budget: int, pool: int) -> None:
        kv = view.kv
        # vLLM v0: int(watermark * num_gpu_blocks); an empty replica admits regardless, so a
        # prompt larger than cache - watermark still runs (v0 would reject it outright).
        keep_free = int(self.watermark * view.num_kv_blocks) if view.running else 0
        num_running = len(view.running)
        for req in view.waiting:
            if budget <= 0 or num_running >= view.max_running:
                return
            todo = req.num_tokens - kv.num_prefix_hit_tokens(req)
            whole = kv.admission_blocks(req, todo)
            if pool - whole < keep_free:
                return
            num_new = min(todo, budget)
            if num_new < todo and not self.enable_chunked_prefill:
                return
            tokens[req.id] = num_new
            budget -= num_new
            pool -= whole  # reserved at once, whatever this step computes
            num_running += 1
            keep_free = int(self.watermark * view.num_kv_blocks)


def _serve_reserved(view: ReplicaView, tokens: dict[int, int], budget: int, pool: int,
                    owed: dict[int, int]) -> tuple[int, int, list[int]]:
    """``serve_running`` where a request's new blocks come first from what it is owed; a
    victim returns its blocks and its reservation to the pool."""
    kv = view.kv
    running = view.running
    preempt: list[int] = []
    last = len(running)
    i = 0
    bs, per_entry = kv.block_size, kv.blocks_per_entry
    while i < last and budget > 0:
        req = running[i]
        num_new, needed = next_chunk(req, budget, bs, per_entry)
        from_pool = needed - min(needed, owed.get(req.id, 0))
        while from_pool > pool and last > i:
            last -= 1
            victim = running[last]
            preempt.append(victim.id)
            pool += kv.reclaimable_blocks(victim) + owed.pop(victim.id, 0)
        if last == i:
            break
        tokens[req.id] = num_new
        budget -= num_new
        pool -= from_pool
        i += 1
    return budget, pool, preempt
