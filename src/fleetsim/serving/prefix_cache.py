"""The prefix cache: shared KV entries keyed by prefix-chained block hashes, and eviction.

An entry covers one hash block of a prompt and owns ``blocks_per_entry`` KV blocks of its
replica's pool (the ``KVCache`` counts them). Requests reference entries; an entry no request
references is *evictable*: it stays cached until its blocks are needed. Which evictable entry
goes first is the eviction policy: ``None`` is LRU (least recently released first; a request
releases its entries tail first, so a shared head outlives a private tail), kept in release
order at O(1); any other policy is a key function over ``CacheEntry`` (smallest evicted
first, ties by release order), at O(evictable entries) per eviction.

**Pools.** Caches that ``join_pool`` (a cluster-wide prefix pool, TokenLake's) see each
other's entries: a hash block cached on any member counts as cached, and a holder here of an
entry another member caches *borrows* it (that member's entry is referenced, pinned in *its*
blocks; nothing is taken here). A member never caches a block the pool has already: ``add``
borrows it instead (the duplicate's blocks are freed), so every block lives once unless
copied on purpose (``add_copy``). An entry lent out is released by its borrower
(``on_lent_release`` tells the owner's replica: blocks may have become available); an entry
cached or evicted anywhere tells every other member (``on_peer_change``: what its waiting
requests match has changed). A cache never holds the same block both as its own and
borrowed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence


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
        # Pool membership (None: alone). hash id -> the member lent from, references held on
        # it, and references other members hold on entries here.
        self.peers: Sequence[PrefixCache] | None = None
        self.borrowed: dict[int, PrefixCache] = {}
        self.num_borrowed: dict[int, int] = {}
        self.lent: dict[int, int] = {}
        self.on_lent_release: Callable[[], None] | None = None
        self.on_peer_change: Callable[[], None] | None = None
        self.num_deduplicated = 0  # blocks computed here that the pool had: shared, freed

    def join_pool(self, peers: Sequence[PrefixCache],
                  on_lent_release: Callable[[], None] | None = None,
                  on_peer_change: Callable[[], None] | None = None) -> None:
        """Pool this cache with ``peers`` (every member, this one included), before use."""
        assert not self.entries, "join a pool before caching anything"
        self.peers = peers
        self.on_lent_release = on_lent_release
        self.on_peer_change = on_peer_change

    def _tell_peers(self) -> None:
        assert self.peers is not None
        for peer in self.peers:
            if peer is not self and peer.on_peer_change is not None:
                peer.on_peer_change()

    def holder(self, hash_id: int) -> PrefixCache | None:
        """The cache whose entry a holder here references for ``hash_id``: this one, the
        member already lent from, or the first member caching it (None: nowhere)."""
        if hash_id in self.entries:
            return self
        lender = self.borrowed.get(hash_id)
        if lender is not None:
            return lender
        if self.peers is not None:
            for peer in self.peers:
                if hash_id in peer.entries:
                    return peer
        return None

    @property
    def num_evictable(self) -> int:
        return len(self.evictable)

    def num_leading(self, hash_ids: tuple[int, ...], limit: int) -> int:
        """How many of the first ``limit`` hash ids are cached, in a row from the first."""
        entries = self.entries
        m = 0
        if self.peers is None:
            while m < limit and hash_ids[m] in entries:
                m += 1
            return m
        while m < limit and self.holder(hash_ids[m]) is not None:
            m += 1
        return m

    def num_unreferenced(self, hash_ids: tuple[int, ...]) -> int:
        """Of these cached ids, how many no request holds (pinning them takes blocks here;
        borrowing a pool member's takes none here)."""
        evictable = self.evictable
        return sum(1 for h in hash_ids if h in evictable)

    def num_sole_holder(self, hash_ids: tuple[int, ...]) -> int:
        """Of these held ids, how many are held here by one request only (borrowed ones free
        nothing here)."""
        entries = self.entries
        return sum(1 for h in hash_ids if h in entries and entries[h].num_refs == 1)

    def pin(self, hash_ids: tuple[int, ...]) -> None:
        """A request admitted with these cached ids as its prefix holds them."""
        entries, evictable = self.entries, self.evictable
        for h in hash_ids:
            entry = entries.get(h)
            if entry is None:
                self._borrow(h)
                continue
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
            if self.peers is not None and self.holder(hash_id) is not None:
                self._borrow(hash_id)  # the pool has it: share that copy
                self.num_deduplicated += 1
                return False
            self.entries[hash_id] = CacheEntry(hash_id, depth)
            if self.peers is not None:
                self._tell_peers()
            return True
        if entry.num_refs == 0:
            del self.evictable[hash_id]
        entry.num_refs += 1
        return False

    def unref(self, hash_ids: tuple[int, ...], num: int) -> None:
        """A request lets go of its first ``num`` ids, tail first."""
        entries, evictable = self.entries, self.evictable
        for h in reversed(hash_ids[:num]):
            entry = entries.get(h)
            if entry is None:
                self._give_back(h)
                continue
            entry.num_refs -= 1
            if entry.num_refs == 0:
                self._seq += 1
                entry.released_seq = self._seq
                evictable[h] = None

    def add_copy(self, hash_id: int, depth: int) -> None:
        """Cache a copy of a block another pool member caches (a replica of a hot block),
        unreferenced: it is evictable at once, most recently released."""
        assert hash_id not in self.entries and hash_id not in self.borrowed
        entry = CacheEntry(hash_id, depth)
        entry.num_refs = 0
        self._seq += 1
        entry.released_seq = self._seq
        self.entries[hash_id] = entry
        self.evictable[hash_id] = None
        self._tell_peers()

    # ---- pool references -------------------------------------------------------------
    def _borrow(self, hash_id: int) -> None:
        lender = self.holder(hash_id)
        assert lender is not None and lender is not self, f"block {hash_id} is cached nowhere"
        lender._lend(hash_id)
        self.borrowed[hash_id] = lender
        self.num_borrowed[hash_id] = self.num_borrowed.get(hash_id, 0) + 1

    def _give_back(self, hash_id: int) -> None:
        lender = self.borrowed[hash_id]
        n = self.num_borrowed[hash_id] - 1
        if n:
            self.num_borrowed[hash_id] = n
        else:
            del self.num_borrowed[hash_id]
            del self.borrowed[hash_id]
        lender._take_back(hash_id)

    def _lend(self, hash_id: int) -> None:
        entry = self.entries[hash_id]
        if entry.num_refs == 0:
            del self.evictable[hash_id]
        entry.num_refs += 1
        entry.num_hits += 1
        self.lent[hash_id] = self.lent.get(hash_id, 0) + 1

    def _take_back(self, hash_id: int) -> None:
        entry = self.entries[hash_id]
        entry.num_refs -= 1
        n = self.lent[hash_id] - 1
        if n:
            self.lent[hash_id] = n
        else:
            del self.lent[hash_id]
        if entry.num_refs == 0:
            self._seq += 1
            entry.released_seq = self._seq
            self.evictable[hash_id] = None
            if self.on_lent_release is not None:
                self.on_lent_release()

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
        if self.peers is not None:
            self._tell_peers()

    def check(self, refs: dict[int, int]) -> int:
        """Assert reference counts (``refs``: hash id -> holders here) and the evictable set;
        returns the number of referenced entries. An entry's count includes the references
        pool members borrowed; a borrowed id's holders here equal the references taken."""
        lent = self.lent
        for h, entry in self.entries.items():
            assert entry.num_refs == refs.get(h, 0) + lent.get(h, 0), (
                f"entry {h}: refs {entry.num_refs}")
            assert (entry.num_refs == 0) == (h in self.evictable), f"entry {h} evictable state"
            assert h not in self.borrowed, f"block {h} both cached and borrowed"
        for h, n in self.num_borrowed.items():
            assert refs.get(h, 0) == n, f"borrowed block {h}: {refs.get(h, 0)} holders, {n} refs"
        return len(self.entries) - len(self.evictable)
