"""Stateful test of KVCache against a plain model: blocks conserved, refs consistent."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.request import Request

BLOCK = 4
HASH = 8  # two blocks per cached entry


class KVCacheMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 40))
    def setup(self, num_blocks):
        self.kv = KVCache(num_blocks, BLOCK, HASH, enable_prefix_caching=True)
        self.running: list[Request] = []
        self.next_id = 0

    @rule(family=st.integers(0, 2), prompt=st.integers(1, 40))
    def admit(self, family, prompt):
        hash_ids = tuple(family * 100 + j for j in range(-(-prompt // HASH)))
        req = Request(self.next_id, 0.0, prompt, 5, hash_ids)
        self.next_id += 1
        todo = prompt - self.kv.num_prefix_hit_tokens(req)
        need = self.kv.admission_blocks(req, todo)
        if need > self.kv.num_available_blocks:
            return
        available_before = self.kv.num_available_blocks
        self.kv.admit(req)
        self.kv.allocate(req, self.kv.blocks_needed(req, todo))
        assert self.kv.num_available_blocks >= available_before - need
        req.num_computed_tokens += todo
        self.kv.promote(req)
        self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def grow(self, data):
        req = data.draw(st.sampled_from(self.running))
        n = data.draw(st.integers(1, 6))
        need = self.kv.blocks_needed(req, n)
        if need > self.kv.num_available_blocks:
            return
        self.kv.allocate(req, need)
        req.num_computed_tokens += n

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def release(self, data):
        req = data.draw(st.sampled_from(self.running))
        freed = self.kv.reclaimable_blocks(req)
        before = self.kv.num_available_blocks
        self.kv.release(req)
        self.running.remove(req)
        assert self.kv.num_available_blocks == before + freed

    @invariant()
    def conserved(self):
        if hasattr(self, "kv"):
            self.kv.check([(r.num_private_blocks, r.hash_ids, r.num_cached_entries)
                           for r in self.running])
            held = sum(self.kv.num_blocks_for(r.num_computed_tokens) for r in self.running)
            # Shared entries are counted once in the pool but once per holder here.
            assert self.kv.num_used_blocks <= held


KVCacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30,
                                            deadline=None)
TestKVCache = KVCacheMachine.TestCase
