"""Prefill fast-forward: the chunks of one long prompt in one event (a *chunk run*).

A chunked prompt longer than the token budget takes one step per chunk, so without this a
run's cost grows with its prompt tokens (a 64k-token prompt in 2,048-token chunks is 32
steps, each planned, applied and committed). When a plan gives the replica's one running
request the whole budget as a prefill chunk, and nothing decodes, a policy that declares
``prefill_chunks_repeat`` (``serving/capabilities.py``: vLLM's token budget, running
requests first) plans the same again at each next step, as long as nothing comes in, the
request's rest exceeds the budget and the free KV blocks hold the chunk's. The replica then
prices those steps at once (``open_run``: the same ``step_time_s`` calls stepping makes, their
end times added in the same order, so bit-identical) and schedules one ``STEP_END``, at the
last one's end.

**Riding decodes.** On a colocated replica the other running requests decode while a long
prompt is prefilled: each step gives every one of them a token and the prompt the rest of
the budget (vLLM's chunked prefill, decodes first). A policy that declares
``mixed_chunks_repeat`` promises that this plan, too, repeats while nothing comes in, no
decode has finished and the free blocks hold each step's; such a run's steps carry the
decodes (``ChunkRun.decodes``), priced with their context as stepping prices it (one more
token each a step) and ending at the latest with the step where the first of them emits its
last token (committed as an ordinary step: the finish, and the plan after it, are stepping's).

Nothing is committed until the run is *settled* (``ChunkRun.settle``): at its end, or as
soon as anything outside reads or changes the replica (``Replica.interrupt``). The steps done
by then are committed one by one as stepping commits them (the chunk's and the decodes'
blocks taken, the chunk's tokens computed, each decode's token, the prefix cache promoted,
service seconds added a step at a time, the KV block-seconds, inter-token gaps where tracked
and one timeline row each), and the step in progress is left as an ordinary step. A run never
includes a step that completes the prompt (its first token, a hand-off): the last chunks are
planned as usual.

Only for a step model whose prices have no side effect (``prices_purely``): a run prices
steps that a cut leaves to be priced again.
"""

from __future__ import annotations

from typing import Final

from fleetsim.perf.base import ConstantStepModel, LinearStepModel, StepTimeModel
from fleetsim.perf.step_model import ChunkStepPrices, TableStepModel
from fleetsim.serving.itl import decode_gaps
from fleetsim.serving.kv_cache import KVCache, blocks_short
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.request import Request


class ChunkRun:
    """Steps of one request's prefill, each the same chunk (with the same decodes riding
    along, if any), priced ahead."""

    __slots__ = ("chunk", "computed0", "decode_kv0", "decodes", "durations", "ends", "req",
                 "start_s")

    def __init__(self, req: Request, chunk: int, start_s: float, ends: list[float],
                 durations: list[float], decodes: list[Request], decode_kv0: int) -> None:
        self.req = req
        self.chunk = chunk  # its tokens a step (the budget, less one per riding decode)
        self.computed0 = req.num_computed_tokens  # the request's tokens before its first step
        self.start_s = start_s  # its first step's start
        self.ends = ends  # each step's end
        self.durations = durations  # each step's price (the KV block-seconds' factor)
        self.decodes = decodes  # the requests decoding a token at each step (plan order)
        self.decode_kv0 = decode_kv0  # their context tokens at the first step

    def steps_before(self, now_s: float) -> int:
        """Steps that end before ``now_s``: an input at a step's end comes before the step
        does (event order), so a step ending now is still in progress."""
        ends = self.ends
        lo, hi = 0, len(ends)
        while lo < hi:  # (``bisect_left``, written out: compiled, a generic call otherwise)
            mid = (lo + hi) // 2
            if ends[mid] < now_s:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def settle(self, k: int, kv: KVCache, recorder: Recorder, replica_id: int,
               num_running: int, num_waiting: int, track_itl: bool) -> int:
        """Commit its steps before step ``k`` (once: the run then ends or is cut), as
        stepping does, in its order: each step's blocks (the first one's were taken as it was
        planned), its KV block-seconds at the blocks then in use, the decodes' gaps (where
        ``track_itl``), the chunk computed and promoted, each decode's token, its row.
        Returns the prompt tokens computed."""
        req, chunk, ends, durations = self.req, self.chunk, self.ends, self.durations
        decodes = self.decodes
        num_tokens = chunk + len(decodes)
        start_s = self.start_s
        j = 0
        while j < k:
            if j:
                _take_blocks(self, kv)
            end_s = ends[j]
            step_s = end_s - start_s
            kv_s = kv.num_used_blocks * durations[j]
            if track_itl and decodes:
                decode_gaps(decodes, start_s, end_s, recorder)
            req.num_computed_tokens += chunk
            req.num_computed_tokens_total += chunk
            req.service_s += step_s
            kv.promote(req)
            for r in decodes:  # (``Replica._commit_step``'s decode commit; none finishes)
                r.num_computed_tokens += 1
                r.num_computed_tokens_total += 1
                r.service_s += step_s
                r.num_output_tokens += 1
            recorder.on_step(replica_id, end_s, step_s, kv_s, 1, num_tokens,
                             kv.num_used_blocks, num_running, num_waiting)
            start_s = end_s
            j += 1
        return k * chunk

    def start(self, k: int, kv: KVCache) -> float:
        """Step ``k`` (in progress, after ``settle(k)``) as stepping started it: its blocks
        taken. Returns its KV block-seconds."""
        if k:
            _take_blocks(self, kv)
        return kv.num_used_blocks * self.durations[k]


MIN_RUN_STEPS: Final = 16


class RunCap:
    """How many steps a replica's runs price ahead. Steps priced past a cut are priced again
    by the next run (a table lookup and the attention terms, about 3k instructions each,
    compiled), a run that ends at its cap costs one stepped step and a new run (several
    times that): so the cap follows the cuts, twice the steps the last cut run had done, and
    doubles while runs end at it, never below ``MIN_RUN_STEPS``. Speed only: a run may stop
    anywhere, results do not change."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps = MIN_RUN_STEPS

    def cut(self, steps_done: int) -> None:
        """A run was cut with ``steps_done`` steps before the one in progress."""
        steps = 2 * (steps_done + 1)
        self.steps = steps if steps > MIN_RUN_STEPS else MIN_RUN_STEPS

    def ended(self, num_steps: int) -> None:
        """A run of ``num_steps`` steps ran to its end."""
        if num_steps >= self.steps:
            self.steps = 2 * num_steps


def _take_blocks(run: ChunkRun, kv: KVCache) -> None:
    """The blocks of a step after a run's first, as ``Replica._apply`` takes them: each
    decode's for its next token, the chunk's. Free ones: the run's steps fit them, so
    ``allocate`` evicts nothing (and the order of the takes does not matter)."""
    bs, per = kv.block_size, kv.blocks_per_entry
    for r in run.decodes:
        needed = blocks_short(r, r.num_computed_tokens + 1, bs, per)
        if needed > 0:
            kv.allocate(r, needed)
    req = run.req
    needed = blocks_short(req, req.num_computed_tokens + run.chunk, bs, per)
    if needed > 0:
        kv.allocate(req, needed)


def prices_purely(model: StepTimeModel) -> bool:
    """Whether ``model.step_time_s`` has no side effect (a run prices steps a cut may leave to
    be priced again): the measured tables and the closed forms. A model that samples (an
    expert-parallel MoE's per-step loads) or reads a shared resource does not qualify."""
    return isinstance(model, (TableStepModel, ConstantStepModel, LinearStepModel))


def open_run(model: StepTimeModel, req: Request, chunk: int, start_s: float, first_s: float,
             until_s: float, kv: KVCache, max_steps: int, spare: ChunkRun | None,
             decodes: list[Request], decode_kv0: int) -> ChunkRun | None:
    """The run that starts with the step just planned (``req``'s chunk of ``chunk`` tokens
    and a token for each of ``decodes``, whose context tokens sum to ``decode_kv0``, its
    blocks taken, priced ``first_s``), or None when no second step would join it. Steps join
    while each leaves the prompt a rest to prefill (two tokens after a preemption, the last of
    which decodes), no decode has emitted its last token in a step before, the blocks of the
    steps so far fit the free ones (never an eviction: settling then repeats stepping's
    allocations exactly), the one before ended before ``until_s``, and they number at most
    ``max_steps`` (``RunCap``). ``spare``: the last run cut back; its prices of the steps it
    did not reach are this one's, where they are the same steps (a cut run's request mostly
    goes on where it stopped: the cut was an arrival, or KV freed by a hand-off)."""
    todo = req.num_prompt_tokens + req.num_output_tokens - req.num_computed_tokens
    left = 2 if req.num_output_tokens else 1
    steps = (todo - left) // chunk
    if steps > max_steps:
        steps = max_steps
    n = len(decodes)
    for r in decodes:  # a decode's last token ends the run (its step at the latest)
        last = r.max_output_tokens - r.num_output_tokens
        if last < steps:
            steps = last
    if steps < 2:
        return None
    c0 = req.num_computed_tokens
    free = kv.num_free_blocks
    bs, per = kv.block_size, kv.blocks_per_entry
    # The decodes' blocks through step j: each holds its next token's already, and takes at
    # most one block per ``bs`` steps after that. Where even that many fit with the chunks',
    # no step needs its decodes' blocks counted one by one.
    last_short = blocks_short(req, c0 + steps * chunk, bs, per)
    bounded = n * ((steps - 1) // bs + 1) + (last_short if last_short > 0 else 0) <= free
    t = start_s + first_s
    ends = [t]
    durations = [first_s]
    # The spare's prices, by this run's step: its step ``j + shift`` had this one's j's
    # chunk and decodes (-1 when none apply).
    priced: list[float] = []
    shift = -1
    if spare is not None and spare.req is req and spare.chunk == chunk:
        ahead = c0 - spare.computed0
        if (ahead >= 0 and ahead % chunk == 0 and _same(spare.decodes, decodes)
                and decode_kv0 == spare.decode_kv0 + ahead // chunk * n):
            priced = spare.durations
            shift = ahead // chunk
    # (the measured tables' prices with the terms the run's steps share added once, made
    # when a step is first priced here: a spare may price them all)
    prices: ChunkStepPrices | None = None
    j = 1
    while j < steps and t < until_s:
        # (the blocks the steps after the first take, all told: the first's are taken)
        if not bounded and _blocks_through(req, c0 + (j + 1) * chunk, decodes, j, bs,
                                           per) > free:
            break
        if shift >= 0 and j + shift < len(priced):
            d = priced[j + shift]
        elif prices is not None:
            d = prices.step_s(c0 + j * chunk, decode_kv0 + j * n)
        elif isinstance(model, TableStepModel):
            prices = model.chunk_prices(chunk, n)
            d = prices.step_s(c0 + j * chunk, decode_kv0 + j * n)
        else:
            d = model.step_time_s([(chunk, c0 + j * chunk)], n, decode_kv0 + j * n)
        t = t + d
        ends.append(t)
        durations.append(d)
        j += 1
    if j < 2:
        return None
    # (its own list of the decodes: the step's may lose one in place, an abort after the cut,
    # while the run, kept as the spare, still prices the steps it had)
    return ChunkRun(req, chunk, start_s, ends, durations, list(decodes), decode_kv0)


def _blocks_through(req: Request, prompt_tokens: int, decodes: list[Request], j: int,
                    bs: int, per: int) -> int:
    """Blocks the steps 1..``j`` of a run take, all told: the chunks' to ``prompt_tokens``,
    and each decode's to its ``j`` more tokens (shortfalls against what each holds now)."""
    total = blocks_short(req, prompt_tokens, bs, per)
    if total < 0:
        total = 0
    for r in decodes:
        short = blocks_short(r, r.num_computed_tokens + j + 1, bs, per)
        if short > 0:
            total += short
    return total


def _same(a: list[Request], b: list[Request]) -> bool:
    """The same requests in the same order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
