"""Which waiting requests a LoongServe prefill iteration takes (``router/req_queue.py``).

With ESP (``generate_new_req_list``) the queue is walked in order. A request joins when its KV
reservation fits (LightLLM's rule, :func:`reservation_fits`) and, on the instances that could be
idle, its prefill would be slower than on all of them by no more than the running decodes'
expected wait (so a long prompt waits for instances rather than running narrow); or, failing
that, when preempting every decode for it costs the decodes less per token than waiting costs
it (the code's "undecided" requests). Up to ``max_out_of_order`` admissions in a row may skip
a request that cannot go yet. Without ESP (``generate_new_req_list_fixed_sp``): FCFS while the
reservation and the running limit allow.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fleetsim.esp.config import EspConfig
from fleetsim.esp.state import EspRequest, Gang

Predictor = Callable[[int, float, float], float]


class Admission:
    """The admission rule and the little state it keeps: out-of-order admissions in a row,
    and the finished requests' mean output (the wait estimate)."""

    def __init__(self, config: EspConfig) -> None:
        self.cfg = config
        self._num_ooe = 0
        self._num_finished = 0
        self._sum_finished_output = 0

    def finished(self, req: EspRequest) -> None:
        self._num_finished += 1
        self._sum_finished_output += req.num_output_tokens

    def take(self, waiting: Sequence[EspRequest], gang: Gang, predict: Predictor
             ) -> list[EspRequest]:
        """The requests of ``waiting`` (in queue order) the next prefill iteration takes."""
        if not self.cfg.elastic:
            return self._take_fixed(waiting, gang)
        cfg = self.cfg
        k_all, cap = cfg.num_instances, gang.capacity
        running = gang.running()
        entries = [(r.kv_tokens, r.num_remaining) for r in running]
        total = k_all * cap
        used = sum(gang.used)
        budget = min(cfg.batch_max_tokens, total - used)
        max_idle = k_all - math.ceil(used / cap)
        wait_s = self.expected_wait_s(running)
        inv_decode = sum(1.0 / max(1, r.num_emitted) for r in running)
        allow_ooe = self._num_ooe < cfg.max_out_of_order
        new: list[EspRequest] = []
        undecided: list[EspRequest] = []
        take_undecided, may_undecide = 0, True
        s1 = s2 = u1 = u2 = 0
        u_inv = 0.0
        skipped_before: int | None = None
        for req in waiting:
            length = req.prefill_tokens
            entry = (length, req.num_remaining - 1)
            if (len(running) + len(new) + len(undecided) < cfg.max_running
                    and s1 + length <= budget
                    and reservation_fits(entries + [entry], total)):
                if (not undecided or allow_ooe) and s1 + length <= max_idle * cap:
                    t_now = predict(max_idle, s1 + length, s2 + length * length)
                    t_best = predict(k_all, s1 + length, s2 + length * length)
                    if t_now - t_best <= wait_s and (not new or t_now <= cfg.max_prefill_s):
                        if undecided and skipped_before is None:
                            skipped_before = len(new)
                        new.append(req)
                        entries.append(entry)
                        s1, s2 = s1 + length, s2 + length * length
                        continue
                if may_undecide and s1 + u1 + length <= budget:
                    undecided.append(req)
                    entries.append(entry)
                    u1, u2, u_inv = u1 + length, u2 + length * length, u_inv + 1.0 / length
                    t_preempt = predict(k_all, s1 + u1, s2 + u2)
                    if (t_preempt * inv_decode <= wait_s * u_inv
                            and (len(new) + len(undecided) == 1
                                 or t_preempt <= cfg.max_prefill_s)):
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

    def _take_fixed(self, waiting: Sequence[EspRequest], gang: Gang) -> list[EspRequest]:
        cfg = self.cfg
        running = gang.running()
        entries = [(r.kv_tokens, r.num_remaining) for r in running]
        total = cfg.num_instances * gang.capacity
        budget = min(cfg.batch_max_tokens, total - sum(gang.used))
        new: list[EspRequest] = []
        s1 = 0
        for req in waiting:
            entry = (req.prefill_tokens, req.num_remaining - 1)
            if (len(running) + len(new) >= cfg.max_running or s1 + req.prefill_tokens > budget
                    or not reservation_fits(entries + [entry], total)):
                break
            new.append(req)
            entries.append(entry)
            s1 += req.prefill_tokens
        return new

    def expected_wait_s(self, running: Sequence[EspRequest]) -> float:
        """How long the running decodes are expected to keep their instances: iterations
        left (at least 10; the finished requests' mean output less what each has emitted;
        a tenth of what each has emitted) times ``avg_decoding_s``."""
        mean_out = self._sum_finished_output / self._num_finished if self._num_finished else 0
        iterations = 10.0
        for r in running:
            iterations = max(iterations, mean_out - r.num_emitted, 0.1 * r.num_emitted)
        return iterations * self.cfg.avg_decoding_s


def reservation_fits(entries: list[tuple[int, int]], capacity: int) -> bool:
    """LightLLM's admission: sorting requests by remaining output (most first), at the moment
    the i-th finishes the batch holds ``rem_i * (i + 1) + sum(used of the first i + 1)`` tokens
    at most; the peak must fit."""
    if not entries:
        return True
    arr = np.asarray(entries, dtype=np.int64)
    order = np.argsort(-arr[:, 1], kind="stable")
    rem, used = arr[order, 1], arr[order, 0]
    need = rem * np.arange(1, len(arr) + 1) + np.cumsum(used)
    return bool(need.max() <= capacity)
