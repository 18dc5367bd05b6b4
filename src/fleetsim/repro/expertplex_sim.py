"""A request-level simulation of the three systems of ``expertplex.py``: Poisson arrivals,
groups of GPUs that run steps back to back, and TTFT / TPOT per request.

A group is an instance (colocated: both phases; PD: one phase) or one of ExpertPlex's two
attention groups. Arrivals go to the prefill-capable group with the fewest queued prompt tokens;
a prefilled request goes to the decode group with the fewest requests after its KV cache
crosses the network (PD, ExpertPlex). ExpertPlex's two groups are coupled through the shared
pool: a decode step gets the re-allocated SM share while a prefill step is running (all SMs
otherwise), and a prefill step gets the SMs decode leaves: all of them minus decode's share
times the fraction of its last step that decode spent in expert GEMMs (the persistent kernel
hands the SMs back at tile boundaries when decode has no expert work).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from fleetsim.repro.expertplex_cost import CostModel, SmPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemLayout:
    """One system on its GPU budget."""

    kind: str
    """``colocated``, ``pd`` or ``expertplex``."""
    prefill_gpus: tuple[int, ...]
    """GPUs of each prefill-capable group (colocated: each instance)."""
    decode_gpus: tuple[int, ...] = ()
    pool: int = 0
    """ExpertPlex's shared expert pool (GPUs); the others' pool is the group itself."""

    @property
    def total_gpus(self) -> int:
        return sum(self.prefill_gpus) + sum(self.decode_gpus) + self.pool

    @property
    def label(self) -> str:
        if self.kind == "colocated":
            return f"{len(self.prefill_gpus)}x{self.prefill_gpus[0]} colocated"
        if self.kind == "pd":
            return f"{len(self.prefill_gpus)}P+{len(self.decode_gpus)}D x{self.prefill_gpus[0]}"
        return (f"attn P{self.prefill_gpus[0]} D{self.decode_gpus[0]} + pool "
                f"{self.pool}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    token_budget_per_gpu: int
    max_decode_per_gpu: int


@dataclass(slots=True)
class _Group:
    gpus: int
    prefill: bool
    decode: bool
    queue: deque[int] = field(default_factory=deque)
    running: list[int] = field(default_factory=list)
    busy: bool = False
    queued_tokens: int = 0
    expert_duty: float = 0.0


@dataclass(slots=True)
class Outcome:
    ttft: np.ndarray
    tpot: np.ndarray


def simulate(layout: SystemLayout, cost: CostModel, limits: Limits, sm: SmPolicy,
             arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray) -> Outcome:
    """Run every request to completion; TTFT and TPOT (NaN for one-token outputs) per request."""
    n = len(arrivals)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    left = outputs.astype(np.int64).copy()
    kv = prompts.astype(np.int64).copy()
    colocated = layout.kind == "colocated"
    pre = [_Group(g, True, colocated) for g in layout.prefill_gpus]
    dec = [] if colocated else [_Group(g, False, True) for g in layout.decode_gpus]
    groups = pre + dec
    span = layout.total_gpus
    kv_bytes = float(cost.model.kv_bytes_per_token())  # all layers
    events: list[tuple[float, int, int, int]] = []  # (time, seq, kind, payload)
    seq = 0

    def push(t: float, kind: int, payload: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, payload))
        seq += 1

    for i, t in enumerate(arrivals):
        push(float(t), 0, i)
    # per-group in-flight step: (prefilled ids, decoded ids)
    inflight: dict[int, tuple[list[int], list[int]]] = {}

    def start(gi: int, now: float) -> None:
        g = groups[gi]
        if g.busy:
            return
        cap = limits.max_decode_per_gpu * g.gpus
        chunks: list[int] = []
        if g.prefill:
            budget = limits.token_budget_per_gpu * g.gpus
            while g.queue and (not chunks or sum(chunks) + prompts[g.queue[0]] <= budget) and (
                    not g.decode or len(g.running) + len(chunks) < cap):
                r = g.queue.popleft()
                g.queued_tokens -= int(prompts[r])
                chunks.append(r)
        decoding = list(g.running[:cap]) if g.decode else []
        if not chunks and not decoding:
            return
        lens = [int(prompts[r]) for r in chunks]
        kv_sum = int(kv[decoding].sum()) if decoding else 0
        if layout.kind != "expertplex":
            dt = cost.colocated_step_s(lens, len(decoding), kv_sum, g.gpus)
        elif g.prefill:
            share = max(dec, key=lambda d: d.expert_duty)
            q_d = cost.decode_sms(sm, len(share.running), layout.pool) if share.running else 0
            sms = cost.num_sms - q_d * min(1.0, share.expert_duty)
            dt = cost.plex_prefill_s(lens, g.gpus, layout.pool, span, sms)
        else:
            busy_prefill = any(p.busy for p in pre)
            sms = cost.decode_sms(sm, len(decoding), layout.pool) if busy_prefill \
                else cost.num_sms
            dt, expert = cost.plex_decode_s(len(decoding), kv_sum, g.gpus, layout.pool, span,
                                            sms)
            g.expert_duty = expert / dt
        g.busy = True
        inflight[gi] = (chunks, decoding)
        push(now + dt, 1, gi)

    def to_decode(r: int, now: float) -> None:
        if colocated:
            return
        # The prompt's KV cache crosses the network to the decode group (one NIC per GPU).
        push(now + float(kv[r]) * kv_bytes / cost.hw.inter_node_bytes_per_s, 2, r)

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == 0:  # arrival
            g = min(pre, key=lambda p: p.queued_tokens)
            g.queue.append(payload)
            g.queued_tokens += int(prompts[payload])
            start(pre.index(g), now)
        elif kind == 2:  # KV arrived at a decode group
            gi = min(range(len(dec)), key=lambda d: len(dec[d].running))
            dec[gi].running.append(payload)
            start(len(pre) + gi, now)
        else:
            g = groups[payload]
            chunks, decoding = inflight.pop(payload)
            g.busy = False
            done = set()
            for r in decoding:
                left[r] -= 1
                kv[r] += 1
                if left[r] <= 0:
                    finish[r] = now
                    done.add(r)
            if done:
                g.running = [r for r in g.running if r not in done]
            for r in chunks:
                first[r] = now
                left[r] -= 1
                if left[r] <= 0:
                    finish[r] = now
                elif colocated:
                    g.running.append(r)
                else:
                    to_decode(r, now)
            for gi in range(len(groups)):
                start(gi, now)
    ttft = first - arrivals
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (finish - first) / np.maximum(outputs - 1, 1), np.nan)
    return Outcome(ttft, tpot)


def attainment(out: Outcome, ttft_slo: float, tpot_slo: float) -> float:
    """Share of requests meeting both SLOs (one-token outputs: TTFT only)."""
    ok = (out.ttft <= ttft_slo) & (np.isnan(out.tpot) | (out.tpot <= tpot_slo))
    return float(ok.mean())
