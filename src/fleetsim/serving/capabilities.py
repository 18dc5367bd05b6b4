"""What a batching policy promises the engine, declared per class and never inherited.

The engine may skip work when a policy's plans are predictable: ``fast_forward_safe`` (after
a plan that only decodes every running request, the same plan repeats while nothing arrives
or finishes and free KV only shrinks) lets it advance many decode steps in one event;
``decodes_all_when_idle`` (whenever nothing waits, every running request decodes, they number
at most the token budget and the free blocks hold one more token each, the plan decodes each
of them once) lets it skip planning those steps; ``prefill_chunks_repeat`` (when a plan gives
the one running request the whole token budget as a prefill chunk and does nothing else, and
no request is swapped out or swapping in, the same plan repeats while nothing arrives, the
request's rest is at least the budget and the free KV blocks hold the chunk) lets it advance
a long prompt's chunks in one event (``serving/chunk_runs.py``); ``mixed_chunks_repeat`` (the
same, where the plan also gives every other running request one decode token and the prompt
the rest of the budget: it repeats while nothing arrives, no decode has finished, the prompt's
rest exceeds its chunk and the free blocks hold each step's) lets those runs carry the decodes
riding along a colocated replica's prefill. A class declares them with a
class attribute ``capabilities = Capabilities(...)`` in its own body: a subclass that does not
declare its own gets none, because changing ``plan`` may break them. ``engine.debug`` checks the
promises at every window and at a chunk run's last boundary. The first two are independent:
a policy whose priorities change as requests run (a multi-level feedback queue) is not
``fast_forward_safe`` while requests wait, yet may decode everyone when nothing waits. A
policy whose plans repeat only in some states promises it plan by plan instead
(``StepPlan.repeats``: ``agent_xpu`` with one class running), and one whose plans repeat until
a rule of its own says otherwise gives the rule with the plan (``StepPlan.repeat_rule``:
FastServe, its batch decoding while others are paused).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A batching policy's promises (all False unless declared)."""

    fast_forward_safe: bool = False
    decodes_all_when_idle: bool = False
    prefill_chunks_repeat: bool = False
    mixed_chunks_repeat: bool = False


NONE = Capabilities()


def capabilities_of(policy: object) -> Capabilities:
    """The capabilities ``policy``'s own class declares (not its bases')."""
    caps = type(policy).__dict__.get("capabilities", NONE)
    if not isinstance(caps, Capabilities):
        raise TypeError(f"{type(policy).__name__}.capabilities must be a Capabilities, "
                        f"got {caps!r}")
    return caps
