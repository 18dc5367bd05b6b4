"""``ProgramSource``: programs revealed online, one call at a time, as a ``RequestSource``.

A program arrives at its ``arrival_s``: its root calls are submitted then. When a call
finishes, the source is told (``on_finish``); a child is submitted once every parent has
finished and every parent's tool call has returned (at the latest parent end + its tool
time). The cluster and its policies see a call only once it is submitted, never the
program's future shape. Request ids come from the simulation.

Each submitted request carries a ``ProgramCall`` in ``Request.program``: which program
it belongs to and what has been revealed of it (arrival, attained service, the revealed
critical path ``horizon_s`` = HexAGenT's H_w(t), the call's standalone estimate). Program
policies read it; policies that keep their own per-request state there replace it, which the
source never minds (it keeps its own table). Program arrivals are streamed: only the next
program's roots are pending in the event heap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.programs.dag import Program, assign_hash_ids, children_of
from fleetsim.programs.standalone import CallTimer, critical_path_s
from fleetsim.serving.request import Request
from fleetsim.serving.sources import SourceContext


class ProgramState:
    """One program in flight: what has been revealed and done so far."""

    __slots__ = ("arrival_s", "finish_s", "horizon_s", "id", "kind", "num_calls",
                 "num_finished", "num_revealed", "policy", "service_s", "standalone_s")

    def __init__(self, pid: int, program: Program, standalone_s: float) -> None:
        self.id = pid
        self.kind = program.kind
        self.arrival_s = program.arrival_s
        self.num_calls = program.num_calls
        self.num_revealed = 0
        self.num_finished = 0
        self.finish_s = math.nan
        self.service_s = 0.0
        """Attained service: engine seconds of its finished calls (Autellix PLAS)."""
        self.horizon_s = 0.0
        """Critical path of the revealed calls in standalone seconds (HexAGenT's H_w(t))."""
        self.standalone_s = standalone_s
        """T_w: the whole program's standalone time (metrics; an oracle for policies)."""
        self.policy: Any = None
        """A home for a program policy's per-program state."""


class ProgramCall:
    """The tag of a submitted call (``Request.program``)."""

    __slots__ = ("est_s", "index", "path_s", "path_service_s", "policy", "program")

    def __init__(self, program: ProgramState, index: int, est_s: float, path_s: float,
                 path_service_s: float) -> None:
        self.program = program
        self.index = index
        self.est_s = est_s
        """Standalone seconds of this call."""
        self.path_s = path_s
        """Standalone seconds from the program's arrival to this call's end, along its
        longest revealed path (tool times included)."""
        self.path_service_s = path_service_s
        """Attained service along the critical path to it (Autellix ATLAS): the most, over
        parents, of the parent's own path service plus its service."""
        self.policy: Any = None


def program_call(req: Request) -> ProgramCall | None:
    """The program tag of ``req``, if a program source submitted it."""
    tag = req.program
    return tag if isinstance(tag, ProgramCall) else None


class _Flight:
    """A program's per-call bookkeeping while it runs."""

    __slots__ = ("call_s", "children", "context_ids", "extends", "hash_ids", "path_end_s",
                 "path_service_s", "pending", "ready_s", "request_ids", "state")

    def __init__(self, program: Program, state: ProgramState, call_s: list[float],
                 hash_ids: list[tuple[int, ...]]) -> None:
        self.state = state
        self.call_s = call_s
        self.hash_ids = hash_ids
        self.children = children_of(program)
        self.pending = [len(c.parents) for c in program.calls]
        self.ready_s = [program.arrival_s] * program.num_calls
        self.path_end_s = [0.0] * program.num_calls
        self.path_service_s = [0.0] * program.num_calls
        self.request_ids = [0] * program.num_calls
        # KV kept across tool waits (``keep_kv``): per call, the hash ids of its whole
        # sequence when a child extends it, and whether it extends its first parent's.
        self.context_ids: list[tuple[int, ...]] = [()] * program.num_calls
        self.extends = [False] * program.num_calls


def kv_links(program: Program, hash_ids: list[tuple[int, ...]], block_tokens: int
             ) -> tuple[list[tuple[int, ...]], list[bool]]:
    """Which calls' KV a child reuses: per call, the ids of its whole sequence's full blocks
    if some child's prompt starts with all of them (else empty), and per call whether its
    prompt extends its first parent's sequence so (that parent's KV is worth keeping)."""
    context: list[tuple[int, ...]] = [()] * program.num_calls
    extends = [False] * program.num_calls
    for c, call in enumerate(program.calls):
        if not call.parents:
            continue
        p = call.parents[0]
        parent = program.calls[p]
        n = (parent.num_prompt_tokens + parent.num_output_tokens) // block_tokens
        ids = hash_ids[c][:n]
        if n and len(ids) == n and ids[:len(hash_ids[p])] == hash_ids[p]:
            context[p] = ids
            extends[c] = True
    return context, extends


class ProgramSource:
    """Submits ``programs`` (any order; sorted by arrival here) call by call as they become
    ready. ``timer`` gives standalone call times (T_w, horizons); ``block_tokens`` is the
    prefix-hash block of the generated hash ids (a multiple of the engine's block size)."""

    wants_finishes = True

    def __init__(self, programs: Sequence[Program], timer: CallTimer, block_tokens: int,
                 keep_kv: bool = False) -> None:
        order = sorted(range(len(programs)), key=lambda i: programs[i].arrival_s)
        self.programs = [programs[i] for i in order]
        self.timer = timer
        self.block_tokens = block_tokens
        self.keep_kv = keep_kv  # mark calls whose KV a child reuses (``Request.kv_from``)
        self.states: list[ProgramState | None] = [None] * len(self.programs)
        self._fresh = itertools.count(1)  # hash ids, per simulation
        self._next = 0
        self._trigger: int | None = None  # request id whose arrival submits the next program
        self._calls: dict[int, tuple[_Flight, int]] = {}  # request id -> (flight, call index)
        self._submitted_s: list[float] = []  # arrival time of every submitted call

    @property
    def num_requests(self) -> int | None:
        return sum(p.num_calls for p in self.programs)

    def start(self, ctx: SourceContext) -> None:
        self._submit_program(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        if req.id == self._trigger:
            self._submit_program(ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        flight, i = self._calls.pop(req.id)
        state = flight.state
        state.num_finished += 1
        state.service_s += req.service_s
        if state.num_finished == state.num_calls:
            state.finish_s = req.finish_s
        program = self.programs[state.id]
        tool_s = program.calls[i].tool_s
        service = flight.path_service_s[i] + req.service_s
        for c in flight.children[i]:
            flight.ready_s[c] = max(flight.ready_s[c], req.finish_s + tool_s)
            flight.path_service_s[c] = max(flight.path_service_s[c], service)
            flight.pending[c] -= 1
            if flight.pending[c] == 0:
                self._reveal(ctx, flight, c)

    # ---- submitting ------------------------------------------------------------------
    def _submit_program(self, ctx: SourceContext) -> None:
        k = self._next
        if k >= len(self.programs):
            self._trigger = None
            return
        self._next = k + 1
        program = self.programs[k]
        call_s = self.timer.calls_s(program, self.block_tokens)
        state = ProgramState(k, program, critical_path_s(program, call_s))
        self.states[k] = state
        flight = _Flight(program, state, call_s, self._hash_ids(program))
        if self.keep_kv:
            flight.context_ids, flight.extends = kv_links(program, flight.hash_ids,
                                                          self.block_tokens)
        first = True
        for i, call in enumerate(program.calls):
            if not call.parents:
                rid = self._reveal(ctx, flight, i)
                if first:
                    self._trigger, first = rid, False

    def _reveal(self, ctx: SourceContext, flight: _Flight, i: int) -> int:
        state = flight.state
        program = self.programs[state.id]
        call = program.calls[i]
        start = max((flight.path_end_s[p] + program.calls[p].tool_s for p in call.parents),
                    default=0.0)
        flight.path_end_s[i] = start + flight.call_s[i]
        state.horizon_s = max(state.horizon_s, flight.path_end_s[i])
        state.num_revealed += 1
        rid = ctx.new_request_id()
        tag = ProgramCall(state, i, flight.call_s[i], flight.path_end_s[i],
                          flight.path_service_s[i])
        req = Request(id=rid, arrival_s=flight.ready_s[i], num_prompt_tokens=call.num_prompt_tokens,
                      max_output_tokens=call.num_output_tokens, hash_ids=flight.hash_ids[i],
                      program=tag, context_hash_ids=flight.context_ids[i],
                      kv_from=(flight.request_ids[call.parents[0]] if flight.extends[i]
                               else None))
        flight.request_ids[i] = rid
        self._calls[rid] = (flight, i)
        self._submitted_s.append(flight.ready_s[i])
        ctx.submit_at(flight.ready_s[i], req)
        return rid

    def _hash_ids(self, program: Program) -> list[tuple[int, ...]]:
        fresh = self._fresh
        if all(c.hash_ids is None for c in program.calls):
            return assign_hash_ids(program, self.block_tokens, fresh)
        remap: dict[int, int] = {}  # a trace's per-conversation ids -> ids of this run
        out = []
        for call in program.calls:
            ids = call.hash_ids or ()
            n = call.num_prompt_tokens // self.block_tokens
            out.append(tuple(remap[h] if h in remap else remap.setdefault(h, next(fresh))
                             for h in ids[:n]))
        return out

    # ---- results ---------------------------------------------------------------------
    def num_arrived(self, until_s: float) -> int:
        """Calls submitted to arrive by ``until_s``."""
        return sum(1 for t in self._submitted_s if t <= until_s)

    # ---- results ---------------------------------------------------------------------
    def records(self) -> dict[str, NDArray[Any]]:
        """One row per program that arrived: id, kind, arrival, finish (nan if unfinished),
        calls (total, finished), JCT and standalone T_w, seconds, and the tokens its calls
        generate (output tokens over every call, all threads: Autellix's per-token latency)."""
        states = [s for s in self.states if s is not None]
        arrival = np.array([s.arrival_s for s in states], dtype=np.float64)
        finish = np.array([s.finish_s for s in states], dtype=np.float64)
        return {
            "program_id": np.array([s.id for s in states], dtype=np.int64),
            "kind": np.array([s.kind for s in states], dtype=object),
            "arrival_s": arrival,
            "finish_s": finish,
            "jct_s": finish - arrival,
            "standalone_s": np.array([s.standalone_s for s in states], dtype=np.float64),
            "num_calls": np.array([s.num_calls for s in states], dtype=np.int64),
            "num_finished_calls": np.array([s.num_finished for s in states], dtype=np.int64),
            "num_output_tokens": np.array([sum(c.num_output_tokens
                                               for c in self.programs[s.id].calls)
                                           for s in states], dtype=np.int64),
        }
