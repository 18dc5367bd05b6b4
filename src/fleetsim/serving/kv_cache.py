"""Paged KV cache of one replica: a block pool plus a prefix cache keyed by block hashes.

Blocks are counted, not named: what matters to latency is how many are free, and who holds
them. A request owns *private* blocks, and holds references to *entries* of the prefix cache
(``prefix_cache.py``). An entry covers one prefix hash block (``hash_block_tokens`` tokens,
e.g. Mooncake's 512) and owns ``hash_block_tokens // block_size`` blocks. Hash ids are
prefix-chained (equal id at position j means equal prompt up to the end of block j), so a
request's hit is the longest run of leading ids present in the cache, as in vLLM's automatic
prefix caching. Entries no request references stay cached and are evicted when blocks run
short, in the order of the cache's eviction policy (least recently released first unless
another is given).

Invariant (checked by ``check``): free + evictable + private + pinned == total blocks, where
the holders of private blocks and pinned entries are the requests and the KV kept or
reloading for them (``kv_keep.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetsim.serving.prefix_cache import PrefixCache
from fleetsim.serving.request import Request

if TYPE_CHECKING:  # (a type for the compiler only: a plain ``int`` at run time)
    from mypy_extensions import i64


def blocks_for(num_tokens: i64, block_size: i64) -> i64:
    """Blocks that ``num_tokens`` tokens fill: ``ceil(num_tokens / block_size)``. At the
    default (and vLLM's) 16 tokens a block it is a shift, ``floor((t + 15) / 16)``, which
    equals the ceiling for every integer: compiled, a ``//`` on i64 is a call that divides
    and corrects the sign, and the block-growth helpers below divide for every decoder of
    every window (4% of an ExpertPlex run)."""
    if block_size == 16:
        return (num_tokens + 15) >> 4
    return -(-num_tokens // block_size)


def blocks_short(req: Request, num_tokens: i64, block_size: i64, blocks_per_entry: i64) -> i64:
    """Blocks ``req`` lacks to hold ``num_tokens`` tokens of KV (negative: it holds more).

    The block-growth formula: the engine, fast-forward windows and the planners' helpers all
    call it (a direct call in the compiled engine); its one other copy,
    ``blocks_after_next_token_and_short`` (two answers for one read of the request, on a
    window's settle), is held to it by a property test. A speculating request also holds
    its lookahead slots (``Request.num_lookahead_tokens``).
    """
    return (blocks_for(num_tokens + req.num_lookahead_tokens, block_size)
            - req.num_private_blocks - req.num_cached_entries * blocks_per_entry)


def blocks_after_next_token(req: Request, block_size: i64, blocks_per_entry: i64) -> i64:
    """Blocks ``req`` holds once those for its next token are taken: the blocks it holds, or
    as many as ``num_computed_tokens + 1`` tokens need, whichever is more (the fast-forward
    windows count block boundaries from here)."""
    held: i64 = req.num_private_blocks + req.num_cached_entries * blocks_per_entry
    short = blocks_short(req, req.num_computed_tokens + 1, block_size, blocks_per_entry)
    if short > 0:  # (statements: a conditional expression over an i64 is boxed when compiled)
        held += short
    return held


def blocks_after_next_token_and_short(req: Request, num_tokens: i64, block_size: i64,
                                      blocks_per_entry: i64) -> tuple[i64, i64]:
    """``(blocks_after_next_token(req, ...), blocks_short(req, num_tokens, ...))`` in one
    call, reading the request's holdings once: a window's settle asks both of every
    decoder (two calls there were 2% of a cluster run, compiled)."""
    held: i64 = req.num_private_blocks + req.num_cached_entries * blocks_per_entry
    ahead: i64 = req.num_lookahead_tokens
    after_next: i64 = blocks_for(req.num_computed_tokens + 1 + ahead, block_size)
    if after_next < held:
        after_next = held
    return after_next, blocks_for(num_tokens + ahead, block_size) - held


class HostPool:
    """A replica's host-memory KV tier (swap space): blocks counted, as on the GPU."""

    __slots__ = ("num_blocks", "num_free_blocks")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"host num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.num_free_blocks = num_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, num_blocks: int) -> None:
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"host KV over-commit: {num_blocks} blocks wanted, "
                               f"{self.num_free_blocks} free")
        self.num_free_blocks -= num_blocks

    def free(self, num_blocks: int) -> None:
        self.num_free_blocks += num_blocks
        assert self.num_free_blocks <= self.num_blocks


class KVCache:
    """Block accounting with prefix caching. ``can_*``/``*_blocks`` ask, the rest commit."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        hash_block_tokens: int | None = None,
        enable_prefix_caching: bool = True,
        prefix: PrefixCache | None = None,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if hash_block_tokens is not None and hash_block_tokens % block_size:
            raise ValueError(
                f"hash_block_tokens ({hash_block_tokens}) must be a multiple of "
                f"block_size ({block_size})"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        self.prefix_caching = enable_prefix_caching and hash_block_tokens is not None
        self.blocks_per_entry = (hash_block_tokens or block_size) // block_size
        self.num_free_blocks = num_blocks
        self.prefix = prefix if prefix is not None else PrefixCache()
        self._evictable = self.prefix.evictable  # read once per step: bound here

    # ---- questions -------------------------------------------------------------------
    @property
    def num_evictable_blocks(self) -> int:
        return len(self._evictable) * self.blocks_per_entry

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can get: free ones plus unreferenced cached ones."""
        return self.num_free_blocks + len(self._evictable) * self.blocks_per_entry

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests (private or through a referenced entry)."""
        return self.num_blocks - self.num_available_blocks

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _num_cacheable(self, req: Request) -> int:
        return min(len(req.hash_ids), req.num_prompt_tokens // self.hash_block_tokens)  # type: ignore[operator]

    def num_matched_entries(self, req: Request) -> int:
        """Leading prefix entries of a waiting request that are cached now (at least one
        prompt token is always left to compute, as vLLM does on a full hit)."""
        if not self.prefix_caching or not req.hash_ids:
            return 0
        m = self.prefix.num_leading(req.hash_ids, self._num_cacheable(req))
        if m and m * self.hash_block_tokens >= req.num_prompt_tokens:  # type: ignore[operator]
            m -= 1
        return m

    def admission_blocks(self, req: Request, num_new_tokens: int) -> int:
        """Blocks that admitting waiting ``req`` with ``num_new_tokens`` new tokens takes from
        the available pool: new private blocks plus matched entries that are unreferenced."""
        m = self.num_matched_entries(req)
        hit_tokens = m * (self.hash_block_tokens or 0)
        pinned = self.prefix.num_unreferenced(req.hash_ids[:m]) * self.blocks_per_entry
        new_private = (self.num_blocks_for(hit_tokens + num_new_tokens + req.num_lookahead_tokens)
                       - m * self.blocks_per_entry)
        return pinned + max(0, new_private)

    def num_prefix_hit_tokens(self, req: Request) -> int:
        return self.num_matched_entries(req) * (self.hash_block_tokens or 0)

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """New blocks a running request needs to compute ``num_new_tokens`` more tokens."""
        short = blocks_short(req, req.num_computed_tokens + num_new_tokens, self.block_size,
                             self.blocks_per_entry)
        if short < 0:  # (a statement: ``short if short > 0 else 0`` boxes the native int)
            short = 0
        return short

    def num_held_blocks(self, req: Request) -> int:
        """Blocks ``req`` holds: private ones plus those of the cache entries it references."""
        return req.num_private_blocks + req.num_cached_entries * self.blocks_per_entry

    def reclaimable_blocks(self, req: Request) -> int:
        """Blocks that become available if running ``req`` is preempted."""
        sole = self.prefix.num_sole_holder(req.hash_ids[: req.num_cached_entries])
        return req.num_private_blocks + sole * self.blocks_per_entry

    # ---- commits ---------------------------------------------------------------------
    def admit(self, req: Request) -> None:
        """Pin the cached prefix of waiting ``req`` and start its computation after it."""
        m = self.num_matched_entries(req)
        if m:
            self.prefix.pin(req.hash_ids[:m])
        req.num_cached_entries = m
        hit = m * (self.hash_block_tokens or 0)
        req.num_prefix_hit_tokens = hit
        req.num_computed_tokens = hit

    def allocate(self, req: Request, num_blocks: int) -> None:
        """Give ``req`` ``num_blocks`` more private blocks, evicting cached entries if needed."""
        if num_blocks > self.num_available_blocks:
            raise RuntimeError(
                f"KV over-commit: request {req.id} wants {num_blocks} blocks, "
                f"{self.num_available_blocks} available"
            )
        self._evict_until_free(num_blocks)
        self.num_free_blocks -= num_blocks
        req.num_private_blocks += num_blocks

    def take_blocks(self, num_blocks: int) -> None:
        """Take ``num_blocks`` from the available pool for a holder that is not a request
        (KV reloaded from host memory), evicting cached entries if needed."""
        if num_blocks > self.num_available_blocks:
            raise RuntimeError(f"KV over-commit: {num_blocks} blocks wanted, "
                               f"{self.num_available_blocks} available")
        self._evict_until_free(num_blocks)
        self.num_free_blocks -= num_blocks

    def install(self, hash_ids: tuple[int, ...]) -> int:
        """Cache KV that arrived from another replica (a trajectory's context migrated during
        its tool wait) as unreferenced entries along the prefix run ``hash_ids``: as many
        leading ones as the available blocks hold (evicting others' unreferenced entries,
        never the run's own head). Returns how many leading ids are cached now. The caller
        cuts the replica's fast-forward window first (``Replica.interrupt``)."""
        if not self.prefix_caching:
            return 0
        prefix, per = self.prefix, self.blocks_per_entry
        n = prefix.num_leading(hash_ids, len(hash_ids))
        prefix.pin(hash_ids[:n])  # the head the new entries extend must outlive evictions
        while n < len(hash_ids) and self.num_available_blocks >= per:
            self.take_blocks(per)
            if not prefix.add(hash_ids[n], n):
                self.num_free_blocks += per  # cached already (not in the leading run): share
            n += 1
        self.release_blocks(0, hash_ids, n)
        return n

    def _evict_until_free(self, num_blocks: int) -> None:
        prefix = self.prefix
        while self.num_free_blocks < num_blocks:
            prefix.evict_one()
            self.num_free_blocks += self.blocks_per_entry

    def promote(self, req: Request) -> None:
        """Turn the full prompt hash blocks ``req`` has computed into shared cache entries.

        The request's private blocks for that range move to the entry; if another request
        already cached the same hash, the duplicate blocks are freed and the entry shared.
        """
        if not self.prefix_caching or not req.hash_ids:
            return
        upto = min(self._num_cacheable(req), req.num_computed_tokens // self.hash_block_tokens)  # type: ignore[operator]
        self._cache_run(req, req.hash_ids, upto)

    def promote_context(self, req: Request, ids: tuple[int, ...]) -> int:
        """``promote`` along ``ids``, the hash ids of ``req``'s whole sequence (prompt, then
        outputs: ``Request.context_hash_ids``), so its output blocks become entries too (KV
        kept for a follow-up). Returns the entries ``req`` then holds (its leading ids)."""
        upto = min(len(ids), req.num_computed_tokens // self.hash_block_tokens)  # type: ignore[operator]
        self._cache_run(req, ids, upto)
        return req.num_cached_entries

    def _cache_run(self, req: Request, ids: tuple[int, ...], upto: int) -> None:
        prefix, per = self.prefix, self.blocks_per_entry
        for j in range(req.num_cached_entries, upto):
            if not prefix.add(ids[j], j):
                self.num_free_blocks += per  # already cached: share it, free the duplicate
            req.num_private_blocks -= per
        if upto > req.num_cached_entries:
            req.num_cached_entries = upto

    def release(self, req: Request) -> None:
        """Free ``req``'s private blocks and drop its references (finish or preemption).

        Its entries become evictable tail first, so a shared head outlives a private tail.
        """
        self.release_blocks(req.num_private_blocks, req.hash_ids, req.num_cached_entries)
        req.num_private_blocks = 0
        req.num_cached_entries = 0

    def release_blocks(self, num_private_blocks: int, hash_ids: tuple[int, ...],
                       num_cached_entries: int) -> None:
        """``release`` of blocks no longer described by a request's counters (a handed-off
        request's blocks left behind at its source)."""
        self.num_free_blocks += num_private_blocks
        if num_cached_entries:
            self.prefix.unref(hash_ids, num_cached_entries)

    def check(self, holdings: list[tuple[int, tuple[int, ...], int]]) -> None:
        """Assert conservation of blocks and reference counts (debug mode), given every
        holding as (private blocks, hash ids, cached entries)."""
        refs: dict[int, int] = {}
        private = 0
        for num_private, hash_ids, num_cached in holdings:
            private += num_private
            assert num_private >= 0, f"a holder of {hash_ids[:2]}... has negative blocks"
            for h in hash_ids[:num_cached]:
                refs[h] = refs.get(h, 0) + 1
        pinned = self.prefix.check(refs) * self.blocks_per_entry
        total = self.num_free_blocks + self.num_evictable_blocks + private + pinned
        assert total == self.num_blocks, f"blocks not conserved: {total} != {self.num_blocks}"
        assert self.num_free_blocks >= 0
