"""LoongServe's serving loop on one node: a gang of instances that prefill together with a
degree of parallelism chosen per batch, then decode with their KV spread over instances.

The loop follows ``router/manager.py::_step`` of the public code:

1. when nothing runs, or after ``max_wait_steps`` decode iterations, new requests are taken
   FCFS while their KV reservation fits (LightLLM's rule: at every future step the running
   requests' KV plus their remaining outputs fit the gang), the batch's input stays under
   ``batch_max_tokens``, and the predicted prefill on all instances stays under
   ``max_prefill_s`` (``req_queue.generate_new_req_list``);
2. a prefill iteration (``_schedule_new_req_list_with_decoding``): migrate KV to free whole
   instances where the prefill gains more than the move costs; pause decode batches, first
   those needed for room, then each whose instances speed the prefill up more than pausing
   slows the batch down (``rules.should_pause``); plan prefill batches and their DoP with the DP
   (``dp.plan_prefill``) over the idle and lent instances; run them, while unpaused decode
   batches keep stepping and each prefill batch, once done, decodes until the longest ends;
   keep each batch's KV on as few instances as possible (``rules.place_scaled_down``) and
   release the rest; paused batches merge into the new batch that shares their instances;
3. otherwise a decode iteration: every batch steps once, in lock step; a batch whose instances
   are full scales up onto an idle instance, else merges with a batch that has room, else the
   latest request is paused (its KV dropped, recomputed later: ``pause_strategy.Fcfs``).

The analytical model (``cost.AnalyticalModel``) is what the scheduler predicts with; the time
that passes is the cost model's (``cost.EspCostModel``), as on real hardware.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from fleetsim.esp.admission import Admission
from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import AnalyticalModel, DecodeShard, EspCostModel
from fleetsim.esp.dp import plan_prefill
from fleetsim.esp.rules import (
    migration_pays,
    num_masters,
    place_scaled_down,
    should_pause,
)
from fleetsim.esp.state import DecodeBatch, EspRequest, Gang


@dataclass(slots=True)
class EspStats:
    num_prefill_iterations: int = 0
    num_prefill_batches: int = 0
    dop_sum: int = 0
    num_paused_by_rule: int = 0
    num_paused_for_room: int = 0
    num_scale_ups: int = 0
    num_preempted: int = 0
    num_migrated_tokens: int = 0
    migration_s: float = 0.0
    dop_histogram: dict[int, int] = field(default_factory=dict)


class EspEngine:
    def __init__(self, config: EspConfig, cost: EspCostModel, predictor: AnalyticalModel
                 ) -> None:
        self.cfg, self.cost, self.predict = config, cost, predictor.predict_s
        self.gang = Gang(config.num_instances, config.max_tokens_per_instance)
        self.waiting: deque[EspRequest] = deque()
        self.now = 0.0
        self.stats = EspStats()
        self._wait_steps = 0
        self.admission = Admission(config)

    # -- the loop ------------------------------------------------------------------------
    def run(self, requests: list[EspRequest]) -> list[EspRequest]:
        cap = self.cfg.num_instances * self.cfg.max_tokens_per_instance
        for r in requests:
            if r.num_prompt_tokens + r.num_output_tokens > cap:
                raise ValueError(f"request {r.id}: {r.num_prompt_tokens} + "
                                 f"{r.num_output_tokens} tokens exceed the gang's {cap}")
        pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
        while pending or self.waiting or self.gang.batches:
            while pending and pending[0].arrival_s <= self.now:
                self.waiting.append(pending.popleft())
            if not self.gang.batches and not self.waiting:
                self.now = max(self.now, pending[0].arrival_s)
                continue
            if not self.gang.batches or self._wait_steps >= self.cfg.max_wait_steps:
                new = self._take_new()
                if new:
                    self._wait_steps = 0
                    self._prefill_iteration(new)
                    self._check()
                    continue
                if not self.gang.batches:
                    raise AssertionError("an idle gang admits nothing")
            self._decode_iteration()
            self._wait_steps += 1
            self._check()
        return requests

    def _check(self) -> None:
        if self.cfg.debug:
            self.gang.check()

    # -- admission -----------------------------------------------------------------------
    def _take_new(self) -> list[EspRequest]:
        chosen = self.admission.take(list(self.waiting), self.gang, self.predict)
        if chosen:
            taken = {r.id for r in chosen}
            self.waiting = deque(r for r in self.waiting if r.id not in taken)
        return chosen

    # -- prefill -------------------------------------------------------------------------
    def _prefill_iteration(self, new: list[EspRequest]) -> None:
        gang, cfg, st = self.gang, self.cfg, self.stats
        new.sort(key=lambda r: (-r.prefill_tokens, r.id))  # longest first, as the DP wants
        lengths = [r.prefill_tokens for r in new]
        s1, s2 = float(sum(lengths)), float(sum(x * x for x in lengths))
        inv = sum(1.0 / x for x in lengths)
        for r in new:
            if r.first_scheduled_s is None:
                r.first_scheduled_s = self.now
        start = self.now + (self._consolidate(s1, s2) if cfg.elastic else 0.0)
        idle = gang.idle()
        paused: list[DecodeBatch] = []
        kept = sorted(gang.batches, key=gang.batch_room)  # most room last
        need = s1 - sum(gang.room(i) for i in idle)
        while kept and (need > 0 or not cfg.elastic):
            b = kept.pop()
            need -= gang.batch_room(b)
            paused.append(b)
            st.num_paused_for_room += 1
        lent = len(idle) + sum(len(b.instances) for b in paused)
        decoding: list[DecodeBatch] = []
        for b in kept:
            t_idle = self.predict(lent, s1, s2)
            t_lent = self.predict(lent + len(b.instances), s1, s2)
            if should_pause(t_idle, t_lent, inv, len(b.requests),
                            sum(r.num_emitted for r in b.requests)):
                paused.append(b)
                lent += len(b.instances)
                st.num_paused_by_rule += 1
            else:
                decoding.append(b)
        available = idle + [i for b in paused for i in b.instances]
        available.sort(key=lambda i: (gang.used[i], i))
        free = [gang.room(i) for i in available]
        if cfg.elastic:
            plan = plan_prefill(lengths, free, self.predict)
            assert plan is not None, "admitted requests must fit the lent instances"
            groups = [([new[x] for x in b.requests], [available[x] for x in b.instances])
                      for b in plan.batches]
        else:
            groups = [(new, available)]
        durations = [self.cost.prefill_s([r.prefill_tokens for r in reqs], len(insts))
                     for reqs, insts in groups]
        end = start + max(durations)
        st.num_prefill_iterations += 1
        new_batches = []
        for (reqs, insts), dur in zip(groups, durations, strict=True):
            st.num_prefill_batches += 1
            st.dop_sum += len(insts)
            st.dop_histogram[len(insts)] = st.dop_histogram.get(len(insts), 0) + 1
            batch = self._land_prefill(reqs, insts, start + dur)
            if batch.requests:
                new_batches.append((batch, start + dur))
        gang.batches = decoding + [b for b, _ in new_batches] + paused
        # Unpaused decode batches, and each prefill batch once done, decode until the
        # iteration's longest prefill ends (``_run_independent_batch_list``).
        finish = end
        for b in decoding:
            finish = max(finish, self._decode_until(b, start, end))
        for b, done_s in new_batches:
            finish = max(finish, self._decode_until(b, done_s, end))
        gang.batches = [b for b in gang.batches if b.requests]
        self._merge_paused(paused, [b for b, _ in new_batches])
        self.now = finish

    def _land_prefill(self, reqs: list[EspRequest], insts: list[int], done_s: float
                      ) -> DecodeBatch:
        """Keep the batch's KV on as few of its instances as possible; emit first tokens."""
        gang = self.gang
        placement = place_scaled_down([r.prefill_tokens for r in reqs],
                                      [gang.used[i] for i in insts], gang.capacity)
        batch = DecodeBatch(requests=[], instances=list(insts))
        for req, where in zip(reqs, placement, strict=True):
            for local, n in where.items():
                gang.add_kv(req, insts[local], n)
            req.home = max(req.kv, key=lambda i: (req.kv[i], -i))
            req.num_emitted += 1
            if req.first_token_s is None:
                req.first_token_s = done_s
            if req.num_emitted >= req.num_output_tokens:
                self._finish(req, done_s)
            else:
                batch.requests.append(req)
        gang.scale_down(batch)
        return batch

    def _merge_paused(self, paused: list[DecodeBatch], new_batches: list[DecodeBatch]) -> None:
        gang = self.gang
        for nb in new_batches:
            for pb in list(paused):
                if pb in gang.batches and nb in gang.batches and set(pb.instances) & set(
                        nb.instances):
                    nb.requests.extend(pb.requests)
                    nb.instances.extend(i for i in pb.instances if i not in nb.instances)
                    gang.batches.remove(pb)
                    paused.remove(pb)

    def _consolidate(self, s1: float, s2: float) -> float:
        """Migrate KV off lightly used instances while one more idle instance speeds the
        prefill up by more than the move costs (``_minimize_decoding_occupied_instances``).
        Returns the seconds spent migrating."""
        gang, cap = self.gang, self.gang.capacity
        spent = 0.0
        while True:
            busy = [i for i in range(gang.num_instances) if gang.used[i] > 0]
            num_idle = len(gang.idle())
            if len(busy) <= math.ceil(sum(gang.used) / cap) or len(busy) < 2:
                return spent
            src = min(busy, key=lambda i: (gang.used[i], i))
            room_elsewhere = sum(gang.room(i) for i in busy if i != src)
            if room_elsewhere < gang.used[src]:
                return spent
            if s1 <= num_idle * cap:
                gain = self.predict(num_idle, s1, s2) - self.predict(num_idle + 1, s1, s2)
                if not migration_pays(gain, self.cost.migration_s(gang.used[src])):
                    return spent
            spent += self._empty_instance(src, [i for i in busy if i != src])

    def _empty_instance(self, src: int, targets: list[int]) -> float:
        gang = self.gang
        moved = 0
        src_batch = next(b for b in gang.batches if src in b.instances)
        for dst in sorted(targets, key=lambda i: (-gang.used[i], i)):
            dst_batch = next(b for b in gang.batches if dst in b.instances)
            for req in [r for b in gang.batches for r in b.requests if src in r.kv]:
                take = min(req.kv[src], gang.room(dst))
                if take > 0:
                    gang.move_kv(req, src, dst, take)
                    moved += take
            if dst_batch is not src_batch and any(src in r.kv or dst in r.kv
                                                  for r in src_batch.requests):
                dst_batch.requests.extend(src_batch.requests)
                dst_batch.instances.extend(i for i in src_batch.instances
                                           if i not in dst_batch.instances)
                gang.batches.remove(src_batch)
                src_batch = dst_batch
            if gang.used[src] == 0:
                break
        for b in gang.batches:
            gang.scale_down(b)
        self.stats.num_migrated_tokens += moved
        t = self.cost.migration_s(moved)
        self.stats.migration_s += t
        return t

    # -- decode --------------------------------------------------------------------------
    def _decode_iteration(self) -> None:
        for b in list(self.gang.batches):
            self._make_room(b)
        batches = [b for b in self.gang.batches if b.requests]
        if not batches:
            return
        step = max(self._decode_step_s(b) for b in batches)
        self.now += step
        for b in batches:
            self._emit(b, self.now)
        self.gang.batches = [b for b in self.gang.batches if b.requests]

    def _decode_until(self, batch: DecodeBatch, t: float, end: float) -> float:
        """Step ``batch`` alone from ``t`` while it has not reached ``end``."""
        while batch.requests and t < end:
            if not self._make_room(batch, may_pause=False):
                break
            t += self._decode_step_s(batch)
            self._emit(batch, t)
        return t

    def _decode_step_s(self, batch: DecodeBatch) -> float:
        counts: dict[int, list[int]] = {}
        for r in batch.requests:
            for i, n in r.kv.items():
                c = counts.setdefault(i, [0, 0])
                c[0] += 1
                c[1] += n
        shards = [DecodeShard(c[0], c[1]) for c in counts.values()]
        masters = num_masters(len(batch.requests), len(batch.instances),
                              self.cfg.min_compute_bound_batch)
        return self.cost.decode_s(len(batch.requests), shards, masters)

    def _make_room(self, batch: DecodeBatch, may_pause: bool = True) -> bool:
        """Give every request of ``batch`` a home with a free slot for its next token:
        re-home over the batch's instances, scale up onto idle instances, merge with a batch
        that has room, or pause the latest request. False if it could not (``may_pause``
        False and no room)."""
        gang = self.gang
        while batch.requests:
            if gang.batch_room(batch) >= len(batch.requests):
                self._assign_homes(batch)
                return True
            idle = gang.idle()
            if idle:
                batch.instances.append(idle[0])
                self.stats.num_scale_ups += 1
                continue
            others = [b for b in gang.batches if b is not batch and gang.batch_room(b)
                      >= len(b.requests) + 1]
            if others:
                other = max(others, key=lambda b: (gang.batch_room(b) - len(b.requests)))
                batch.requests.extend(other.requests)
                batch.instances.extend(i for i in other.instances if i not in batch.instances)
                gang.batches.remove(other)
                continue
            if not may_pause:
                return False
            self._preempt_latest()
        return False

    def _assign_homes(self, batch: DecodeBatch) -> None:
        """A request keeps its home while the home has a free slot; the others move to the
        batch's instance with the most room left (the batch has a slot for each)."""
        left = {i: self.gang.room(i) for i in batch.instances}
        for r in batch.requests:
            if r.home in left and left[r.home] > 0:
                left[r.home] -= 1
                continue
            r.home = max(left, key=lambda i: (left[i], -i))
            left[r.home] -= 1

    def _emit(self, batch: DecodeBatch, t: float) -> None:
        gang = self.gang
        keep = []
        for r in batch.requests:
            home = r.home
            assert home is not None
            gang.add_kv(r, home, 1)
            r.num_emitted += 1
            if r.num_emitted >= r.num_output_tokens:
                self._finish(r, t)
            else:
                keep.append(r)
        batch.requests = keep
        gang.scale_down(batch)

    def _finish(self, req: EspRequest, t: float) -> None:
        req.finish_s = t
        self.gang.free_kv(req)
        self.admission.finished(req)

    def _preempt_latest(self) -> None:
        """Pause the latest-arrived running request: drop its KV, queue it first."""
        gang = self.gang
        victim_batch, victim = max(((b, r) for b in gang.batches for r in b.requests),
                                   key=lambda br: br[1].id)
        victim_batch.requests.remove(victim)
        gang.free_kv(victim)
        gang.scale_down(victim_batch)
        victim.num_paused += 1
        self.stats.num_preempted += 1
        self.waiting.appendleft(victim)
        gang.batches = [b for b in gang.batches if b.requests]

