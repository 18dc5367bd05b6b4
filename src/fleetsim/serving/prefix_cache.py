"""The prefix cache: shared KV entries keyed by prefix-chained block hashes, and eviction.

An entry covers one hash block of a prompt and owns ``blocks_per_entry`` KV blocks of its
replica's pool (the ``KVCache`` counts them). Requests reference entries; an entry no request
references is *evictable*: it stays cached until its blocks are needed. Which evictable entry
goes first is the eviction policy: ``None`` is LRU (least recently released first; a request
releases its entries tail first, so a shared head outlives a private tail), kept in release
order at O(1); any other policy is a key function over ``CacheEntry`` (smallest evicted
first, ties by release order), at O(evictable entries) per eviction. The cache is a
component of its own so that another one (a cluster-wide pool, say) can stand in for it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class CacheEntry:
    """One cached hash block: who holds it, and what an eviction policy may weigh."""

    __slots__ = ("depth", "hash_id", "num_hits", "num_refs", "released_seq")

    def __init__(self, hash_id: int, depth: int) -> None:
        self.hash_id = hash_id
        self.depth = depth  # position in its prompt's chain (0: first block)
        self.num_refs = 1  # requests holding it now
        self.num_hits = 0  # admissions that reused it
        self.released_seq = 0  # when it last became evictable (a counter, not a clock)


EvictionKey = Callable[[CacheEntry], tuple]


class PrefixCache:
    """Entries by hash id, with reference counts and an eviction order."""

    def __init__(self, eviction_key: EvictionKey | None = None) -> None:
        self.eviction_key = eviction_key
        self.entries: dict[int, CacheEntry] = {}  # hash_id -> entry
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, by release
        self._seq = 0
        self.num_evicted = 0

    @property
    def num_evictable(self) -> int:
        return len(self.evictable)

    def num_leading(self, hash_ids: tuple[int, ...], limit: int) -> int:
        """How many of the first ``limit`` hash ids are cached, in a row from the first."""
        entries = self.entries
        m = 0
        while m < limit and hash_ids[m] in entries:
            m += 1
        return m

    def num_unreferenced(self, hash_ids: tuple[int, ...]) -> int:
        """Of these cached ids, how many no request holds (pinning them takes blocks)."""
        evictable = self.evictable
        return sum(1 for h in hash_ids if h in evictable)

    def num_sole_holder(self, hash_ids: tuple[int, ...]) -> int:
        """Of these held ids, how many are held by one request only."""
        entries = self.entries
        return sum(1 for h in hash_ids if entries[h].num_refs == 1)

    def pin(self, hash_ids: tuple[int, ...]) -> None:
        """A request admitted with these cached ids as its prefix holds them."""
        entries, evictable = self.entries, self.evictable
        for h in hash_ids:
            entry = entries[h]
            if entry.num_refs == 0:
                del evictable[h]
            entry.num_refs += 1
            entry.num_hits += 1

    def add(self, hash_id: int, depth: int) -> bool:
        """A request computed block ``hash_id``: cache it (held by the request). Returns
        False when it was cached already (the entry is then shared, and the request's
        duplicate blocks can be freed)."""
        entry = self.entries.get(hash_id)
        if entry is None:
            self.entries[hash_id] = CacheEntry(hash_id, depth)
            return True
        if entry.num_refs == 0:
            del self.evictable[hash_id]
        entry.num_refs += 1
        return False

    def unref(self, hash_ids: tuple[int, ...], num: int) -> None:
        """A request lets go of its first ``num`` ids, tail first."""
        entries, evictable = self.entries, self.evictable
        for h in reversed(hash_ids[:num]):
            entry = entries[h]
            entry.num_refs -= 1
            if entry.num_refs == 0:
                self._seq += 1
                entry.released_seq = self._seq
                evictable[h] = None

    def evict_one(self) -> None:
        """Drop the evictable entry the policy puts first (its blocks become free)."""
        key = self.eviction_key
        if key is None:
            h, _ = self.evictable.popitem(last=False)
        else:
            entries = self.entries
            h = min(self.evictable, key=lambda i: (key(entries[i]), entries[i].released_seq))
            del self.evictable[h]
        del self.entries[h]
        self.num_evicted += 1

    def check(self, refs: dict[int, int]) -> int:
        """Assert reference counts (``refs``: hash id -> holders) and the evictable set;
        returns the number of referenced entries."""
        for h, entry in self.entries.items():
            assert entry.num_refs == refs.get(h, 0), f"entry {h}: refs {entry.num_refs}"
            assert (entry.num_refs == 0) == (h in self.evictable), f"entry {h} evictable state"
        return len(self.entries) - len(self.evictable)
