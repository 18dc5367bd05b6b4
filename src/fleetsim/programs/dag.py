"""A program: a DAG of LLM calls with tool calls between them (an agent's run for one user
request), checked once when it is built.

A call's prompt extends the context of its first parent (the parent's prompt plus its output)
with the tool result and new text; its prefix-block hash ids say so (``assign_hash_ids``), so
the engine's prefix cache reuses the parent's blocks when they are still cached. A call's
``tool_s`` is the tool call that runs after it ends: its children become ready when every
parent has ended and every parent's tool call has returned.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from fleetsim.errors import FleetsimInputError


@dataclass(frozen=True, slots=True)
class Call:
    """One LLM call of a program."""

    num_prompt_tokens: int
    """The whole prompt, inherited context included, >= 1."""
    num_output_tokens: int
    """Output tokens, >= 1."""
    parents: tuple[int, ...] = ()
    """Indices (in the program) of the calls whose results it waits for; the first one's
    context is the prefix of this call's prompt."""
    tool_s: float = 0.0
    """Seconds of the tool call that runs after this call ends (0: none). Ignored on a call
    no other call waits for: the program ends when its last call ends."""
    hash_ids: tuple[int, ...] | None = None
    """Prefix-block hash ids of the prompt's full blocks (from a trace), or None: derived
    from the parent's context by ``assign_hash_ids``."""


@dataclass(frozen=True, slots=True)
class Program:
    """A DAG of calls in topological order (every parent index < its child's index)."""

    arrival_s: float
    calls: tuple[Call, ...]
    kind: str = "program"
    """Which generator or trace made it (reported per program)."""

    @property
    def num_calls(self) -> int:
        return len(self.calls)


def check_program(calls: Sequence[Call], where: str) -> None:
    """Raise a one-line ``FleetsimInputError`` on a bad DAG: a missing parent, a cycle (a
    parent at or after its child), a negative tool time or a non-positive token count."""
    if not calls:
        raise FleetsimInputError(f"{where}.calls", [], "a program needs at least one call")
    for i, call in enumerate(calls):
        here = f"{where}.calls[{i}]"
        if call.num_prompt_tokens < 1:
            raise FleetsimInputError(f"{here}.prompt_tokens", call.num_prompt_tokens,
                                     "give at least 1 prompt token")
        if call.num_output_tokens < 1:
            raise FleetsimInputError(f"{here}.output_tokens", call.num_output_tokens,
                                     "give at least 1 output token")
        if not call.tool_s >= 0 or call.tool_s == float("inf"):
            raise FleetsimInputError(f"{here}.tool_s", call.tool_s,
                                     "tool time must be a finite number of seconds >= 0")
        for p in call.parents:
            if not 0 <= p < len(calls):
                raise FleetsimInputError(f"{here}.parents", list(call.parents),
                                         f"parent {p} is not a call of this program; name "
                                         f"calls of it (0..{len(calls) - 1}) or drop it")
            if p >= i:
                raise FleetsimInputError(f"{here}.parents", list(call.parents),
                                         f"parent {p} is not before call {i}: the program "
                                         f"has a cycle or is not in topological order; list "
                                         f"parents before their children")
        if len(set(call.parents)) != len(call.parents):
            raise FleetsimInputError(f"{here}.parents", list(call.parents),
                                     "name each parent once")


def topological_order(ids: Sequence[str], parents: Sequence[Sequence[str]], where: str
                      ) -> list[int]:
    """Positions of calls named by ``ids`` in an order where parents come first (Kahn's
    algorithm, ties by position); a missing parent or a cycle is a one-line error."""
    index = {}
    for i, name in enumerate(ids):
        if name in index:
            raise FleetsimInputError(f"{where}.calls[{i}].id", name, "call ids must be unique "
                                     "within a program")
        index[name] = i
    children: list[list[int]] = [[] for _ in ids]
    missing = [0] * len(ids)
    for i, ps in enumerate(parents):
        for p in ps:
            if p not in index:
                raise FleetsimInputError(f"{where}.calls[{i}].parents", list(ps),
                                         f"no call has id {p!r}; name calls of this program")
            children[index[p]].append(i)
            missing[i] += 1
    ready = [i for i in range(len(ids)) if missing[i] == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)
        i = ready.pop()
        order.append(i)
        for c in children[i]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    if len(order) != len(ids):
        stuck = [ids[i] for i in range(len(ids)) if missing[i] > 0]
        raise FleetsimInputError(f"{where}.calls", f"cycle through {stuck[:4]}",
                                 "a program must be acyclic: remove a parent link on the cycle")
    return order


def children_of(program: Program) -> list[list[int]]:
    """Per call, the calls that wait for it."""
    out: list[list[int]] = [[] for _ in program.calls]
    for i, call in enumerate(program.calls):
        for p in call.parents:
            out[p].append(i)
    return out


def assign_hash_ids(program: Program, block_tokens: int, fresh: Iterator[int]
                    ) -> list[tuple[int, ...]]:
    """Per call, the hash ids of its prompt's full ``block_tokens`` blocks.

    A call whose prompt is at least its first parent's context (prompt + output) shares the
    ids of that context's full blocks; every other block gets a fresh id from ``fresh`` (one
    counter per simulation, so programs never share blocks). The ids of a parent's output
    blocks are assigned once, so siblings share them too. A call that brings its own
    ``hash_ids`` (a trace) keeps them (remapped by the caller).
    """
    context: list[tuple[int, ...]] = []  # per call: ids of its context's full blocks
    prompts: list[tuple[int, ...]] = []
    for call in program.calls:
        n_prompt = call.num_prompt_tokens // block_tokens
        if call.hash_ids is not None:
            ids = call.hash_ids[:n_prompt]
        else:
            inherited: tuple[int, ...] = ()
            if call.parents:
                first = program.calls[call.parents[0]]
                if call.num_prompt_tokens >= first.num_prompt_tokens + first.num_output_tokens:
                    inherited = context[call.parents[0]]
            shared = inherited[:n_prompt]
            ids = shared + tuple(itertools.islice(fresh, n_prompt - len(shared)))
        prompts.append(ids)
        n_context = (call.num_prompt_tokens + call.num_output_tokens) // block_tokens
        context.append(ids + tuple(itertools.islice(fresh, max(0, n_context - len(ids)))))
    return prompts


def shared_prefix_tokens(program: Program, block_tokens: int) -> list[int]:
    """Per call, the most prompt tokens the prefix cache can supply it (whole blocks, at
    least one prompt token left to compute, as the engine does) when the program runs alone
    and KV outlives tool waits: its first parent's context for derived ids; for a trace's
    ids, the leading blocks seen in any earlier call's prompt (hash ids are chained, so a
    leading run of known ids is a real prefix)."""
    out = []
    seen: set[int] = set()
    for call in program.calls:
        hit = 0
        if call.hash_ids is not None:
            for h in call.hash_ids:
                if h not in seen:
                    break
                hit += block_tokens
            seen.update(call.hash_ids)
        elif call.parents:
            first = program.calls[call.parents[0]]
            ctx = first.num_prompt_tokens + first.num_output_tokens
            if call.num_prompt_tokens >= ctx:
                hit = (ctx // block_tokens) * block_tokens
        hit = min(hit, (call.num_prompt_tokens // block_tokens) * block_tokens)
        if hit and hit >= call.num_prompt_tokens:
            hit -= block_tokens
        out.append(max(hit, 0))
    return out
