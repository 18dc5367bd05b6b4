"""Which waiting requests a LoongServe prefill iteration takes (``router/req_queue.py``).

With ESP (``generate_new_req_list``) the queue is walked in order. A request joins when its KV
reservation fits (LightLLM's rule, :func:`reservation_fits`) and, on the instances that could be
idle, its prefill would be slower than on all of them by no more than the running decodes'
expected wait (so a long prompt waits for instances rather than running narrow); or, failing
that, when preempting every decode for it costs the decodes less per token than waiting costs
it (the code's "undecided" requests). Up to ``max_out_of_order`` admissions in a row may skip
a request that cannot go yet. Without ESP (``generate_new_req_list_fixed_sp``): FCFS while the
reservation and the running limit allow.

The rule reads plain numbers (``Pending``, ``Resident``, KV used per instance), so any engine
can ask it; the group planner (``policies/esp.py``) does.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from operator import itemgetter

from fleetsim.esp.config import EspConfig
from fleetsim.esp.cost import AnalyticalModel


class Pending:
    """A waiting request as admission sees it (a plain record: built for every request a
    walk reads, compiled with this module, where a NamedTuple's ``__new__`` is Python)."""

    __slots__ = ("num_remaining", "prefill_tokens")

    def __init__(self, prefill_tokens: int, num_remaining: int) -> None:
        self.prefill_tokens = prefill_tokens
        """Tokens its prefill computes (the prompt, and what it generated before a pause)."""
        self.num_remaining = num_remaining
        """Output tokens still to emit."""


class Resident:
    """A running request as admission sees it (a plain record, as ``Pending``)."""

    __slots__ = ("kv_tokens", "num_emitted", "num_remaining")

    def __init__(self, kv_tokens: int, num_remaining: int, num_emitted: int) -> None:
        self.kv_tokens = kv_tokens
        self.num_remaining = num_remaining
        self.num_emitted = num_emitted


class Admission:
    """The admission rule and the little state it keeps: out-of-order admissions in a row,
    and the finished requests' mean output (the wait estimate)."""

    def __init__(self, config: EspConfig) -> None:
        self.cfg = config
        self._num_ooe = 0
        self._num_finished = 0
        self._sum_finished_output = 0

    def finished(self, num_output_tokens: int) -> None:
        self._num_finished += 1
        self._sum_finished_output += num_output_tokens

    def take(self, waiting: Iterable[Pending], running: list[Resident],
             used_by_instance: Sequence[int], capacity: int,
             predictor: AnalyticalModel) -> list[int]:
        """Indices into ``waiting`` (in queue order) the next prefill iteration takes, given
        the running requests and the KV tokens used on each of the instances (``capacity``
        each). ``waiting`` is read in order, and only as far as a request could still join
        (a long queue is not walked once the running slots or the token budget are full).
        ``predictor``: the scheduler's fitted model, called as the model it is (compiled, its
        bound ``predict_s`` passed as a callable went through the type's slot, about 1.2k
        instructions a call and 10% of a LoongServe run on Mixed lengths). ``running`` is a
        list (compiled, a ``Sequence`` is walked through the iterator protocol: three walks a
        call)."""
        if not self.cfg.elastic:
            return self._take_fixed(waiting, running, used_by_instance, capacity)
        cfg = self.cfg
        # The flags as locals: the config is an interpreted dataclass, so compiled, each read
        # of a field in the walk below was a generic attribute lookup (58 a walk on Mixed).
        max_running, max_prefill_s = cfg.max_running, cfg.max_prefill_s
        k_all, cap = len(used_by_instance), capacity
        total = k_all * cap
        reserved = Reservation([(r.kv_tokens, r.num_remaining) for r in running], total)
        used = sum(used_by_instance)
        budget = min(cfg.batch_max_tokens, total - used)
        max_idle = k_all - math.ceil(used / cap)
        wait_s = self.expected_wait_s(running)
        inv_decode = 0.0  # (a loop, not ``sum`` over ``max``: generic calls when compiled)
        for r in running:
            emitted = r.num_emitted
            inv_decode += 1.0 / (emitted if emitted > 1 else 1)
        allow_ooe = self._num_ooe < cfg.max_out_of_order
        new: list[int] = []
        undecided: list[int] = []
        take_undecided, may_undecide = 0, True
        s1 = s2 = u1 = u2 = 0
        u_inv = 0.0
        skipped_before: int | None = None
        for at, req in enumerate(waiting):
            if len(running) + len(new) + len(undecided) >= max_running or s1 >= budget:
                # Full: this request and every later one fail the first test below (a
                # prefill has at least one token), so the walk's outcome is known.
                if allow_ooe and skipped_before is None:
                    skipped_before = len(new)
                break
            length = req.prefill_tokens
            entry = (length, req.num_remaining - 1)
            if (len(running) + len(new) + len(undecided) < max_running
                    and s1 + length <= budget
                    and reserved.fits(entry)):
                if (not undecided or allow_ooe) and s1 + length <= max_idle * cap:
                    t_now = predictor.predict_s(max_idle, s1 + length, s2 + length * length)
                    t_best = predictor.predict_s(k_all, s1 + length, s2 + length * length)
                    if t_now - t_best <= wait_s and (not new or t_now <= max_prefill_s):
                        if undecided and skipped_before is None:
                            skipped_before = len(new)
                        new.append(at)
                        reserved.add(entry)
                        s1, s2 = s1 + length, s2 + length * length
                        continue
                if may_undecide and s1 + u1 + length <= budget:
                    undecided.append(at)
                    reserved.add(entry)
                    u1, u2, u_inv = u1 + length, u2 + length * length, u_inv + 1.0 / length
                    t_preempt = predictor.predict_s(k_all, s1 + u1, s2 + u2)
                    if (t_preempt * inv_decode <= wait_s * u_inv
                            and (len(new) + len(undecided) == 1
                                 or t_preempt <= max_prefill_s)):
                        take_undecided = len(undecided)
                    continue
                may_undecide = False
            if not allow_ooe:
                break
            if skipped_before is None:
                skipped_before = len(new)
        chosen = new + undecided[:take_undecided]
        if chosen:
            out_of_order = skipped_before is not None and skipped_before < len(chosen)
            self._num_ooe = self._num_ooe + 1 if out_of_order else 0
        return chosen

    def _take_fixed(self, waiting: Iterable[Pending], running: list[Resident],
                    used_by_instance: Sequence[int], capacity: int) -> list[int]:
        cfg = self.cfg
        total = len(used_by_instance) * capacity
        budget = min(cfg.batch_max_tokens, total - sum(used_by_instance))
        new: list[int] = []
        s1 = 0
        max_running = cfg.max_running  # (a local: as in ``take``)
        reserved = Reservation([(r.kv_tokens, r.num_remaining) for r in running], total)
        for at, req in enumerate(waiting):
            entry = (req.prefill_tokens, req.num_remaining - 1)
            if (len(running) + len(new) >= max_running or s1 + req.prefill_tokens > budget
                    or not reserved.fits(entry)):
                break
            new.append(at)
            reserved.add(entry)
            s1 += req.prefill_tokens
        return new

    def expected_wait_s(self, running: list[Resident]) -> float:
        """How long the running decodes are expected to keep their instances: iterations
        left (at least 10; the finished requests' mean output less what each has emitted;
        a tenth of what each has emitted) times ``avg_decoding_s``."""
        mean_out = self._sum_finished_output / self._num_finished if self._num_finished else 0.0
        iterations = 10.0
        for r in running:  # (compared one by one: ``max`` is a generic call when compiled)
            emitted = r.num_emitted
            left = mean_out - emitted
            if left > iterations:
                iterations = left
            tenth = 0.1 * emitted
            if tenth > iterations:
                iterations = tenth
        return iterations * self.cfg.avg_decoding_s


class Reservation:
    """``reservation_fits(entries + [entry], capacity)`` for many candidate ``entry``s and a
    set of entries that grows by the ones taken, in O(log n) a candidate rather than a sort.

    In the sorted order (remaining output, most first; ties in the order given, as the stable
    sort) a candidate of ``rem`` goes after every entry with at least ``rem`` left, at ``p``:
    the entries before it keep their peaks, its own is ``rem * (p + 1)`` plus the tokens
    used up to it, and each entry after it moves one place down (its peak grows by its
    ``rem``) and holds the candidate's tokens too. So the check is three maxima over
    prefix and suffix tables, rebuilt when an entry is added (the same integers as the sort:
    the answer is identical). The first check sorts once instead: a walk that stops there
    (one waiting request, a long running batch) does not pay for the tables.

    Before either, a bound that needs no order: every entry's peak is at most the sum of the
    entries' positive ``used`` and ``rem`` (the entries before it have at least its ``rem``
    left, so ``rem * (p + 1)`` is at most their remaining outputs and its own). When that sum
    fits, every peak does, and the answer is True without a sort: a batch far below the
    capacity (ShareGPT's, ~50 running requests on 4 instances) is checked in one pass
    instead of a sort by key per check (the sorts were 60% of LoongServe's admission)."""

    __slots__ = ("capacity", "_entries", "_sorted", "_checked", "_neg_rem", "_used_before",
                 "_head", "_tail", "_bound")

    def __init__(self, entries: list[tuple[int, int]], capacity: int) -> None:
        """``entries``: (used, remaining) pairs, in the order the stable sort breaks ties
        (the list is kept: ``add`` appends to it)."""
        self.capacity = capacity
        self._entries = entries  # sorted when the tables are first built
        self._sorted = False
        self._checked = False  # the first check is one sort (a walk may need only one)
        self._neg_rem: list[int] | None = None  # None: the tables below are stale
        self._used_before: list[int] = []  # [i]: tokens used by the first i entries
        self._head: list[float] = []  # [i]: the largest peak of the first i entries
        self._tail: list[float] = []  # [i]: the largest peak + rem of entries i..n-1
        self._bound = -1  # sum of the positive used and rem of the entries; -1: not yet summed

    def _index(self) -> list[int]:
        if not self._sorted:  # remaining output, most first; reverse keeps ties in order
            self._entries = sorted(self._entries, key=itemgetter(1), reverse=True)
            self._sorted = True
        entries = self._entries
        n = len(entries)
        neg_rem = [0] * n
        used_before = [0] * (n + 1)
        peaks = [0] * n
        head: list[float] = [-math.inf] * (n + 1)
        total, best = 0, -math.inf
        for i in range(n):  # one pass each way (rebuilt after every entry a walk takes)
            used, rem = entries[i]
            total += used
            used_before[i + 1] = total
            neg_rem[i] = -rem
            peaks[i] = peak = rem * (i + 1) + total
            if peak > best:
                best = float(peak)  # exact: token counts are far below 2**53
            head[i + 1] = best
        tail: list[float] = [-math.inf] * (n + 1)
        best = -math.inf
        for i in range(n - 1, -1, -1):
            if peaks[i] - neg_rem[i] > best:
                best = float(peaks[i] - neg_rem[i])
            tail[i] = best
        self._used_before, self._head, self._tail = used_before, head, tail
        self._neg_rem = neg_rem
        return neg_rem

    def fits(self, entry: tuple[int, int]) -> bool:
        """Would the entries and ``entry`` (used, remaining) fit the capacity?"""
        used, rem = entry
        bound = self._bound
        if bound < 0:
            bound = self._bound = _positive_sum(self._entries)
        if bound + (used if used > 0 else 0) + (rem if rem > 0 else 0) <= self.capacity:
            return True  # every peak is at most the bound (the class's docstring)
        neg_rem = self._neg_rem
        if neg_rem is None:
            if not self._checked:
                self._checked = True
                return reservation_fits(self._entries + [entry], self.capacity)
            neg_rem = self._index()
        # ``bisect_right(neg_rem, -rem)`` and a three-argument ``max`` written out: compiled,
        # both are generic calls (they were most of the check's 3.7k instructions).
        x = -rem
        lo, hi = 0, len(neg_rem)
        while lo < hi:
            mid = (lo + hi) >> 1
            if x < neg_rem[mid]:
                hi = mid
            else:
                lo = mid + 1
        at = lo
        capacity = self.capacity
        own = rem * (at + 1) + self._used_before[at] + used
        return (own <= capacity and self._head[at] <= capacity
                and self._tail[at] + used <= capacity)

    def add(self, entry: tuple[int, int]) -> None:
        """Take ``entry`` into the set (after any with as much left: the stable order)."""
        if self._bound >= 0:
            used, rem = entry
            self._bound += (used if used > 0 else 0) + (rem if rem > 0 else 0)
        if self._sorted:
            self._entries.insert(bisect_right(self._entries, -entry[1], key=_neg_remaining),
                                 entry)
        else:
            self._entries.append(entry)
        self._neg_rem = None  # the tables are rebuilt at the next check


def _positive_sum(entries: list[tuple[int, int]]) -> int:
    """The sum of the entries' positive ``used`` and ``rem`` (``Reservation``'s bound)."""
    total = 0
    for used, rem in entries:
        if used > 0:
            total += used
        if rem > 0:
            total += rem
    return total


def _neg_remaining(entry: tuple[int, int]) -> int:
    return -entry[1]


def reservation_fits(entries: list[tuple[int, int]], capacity: int) -> bool:
    """LightLLM's admission: sorting requests by remaining output (most first), at the moment
    the i-th finishes the batch holds ``rem_i * (i + 1) + sum(used of the first i + 1)`` tokens
    at most; the peak must fit. (In ints, one sort and one pass: the numpy of the rule's
    source cost more per call than the few dozen entries it sorts, and the sums are exact
    either way.)"""
    total = 0
    for i, (used, rem) in enumerate(sorted(entries, key=itemgetter(1), reverse=True), 1):
        total += used
        if rem * i + total > capacity:
            return False
    return True
