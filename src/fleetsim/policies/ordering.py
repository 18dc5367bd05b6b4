"""Ordering policies: a key function ``(request, now_s) -> tuple``; smaller runs first.

The engine keeps its waiting and running queues sorted by this key (computed once when a
request enters a queue), admits from the front and preempts from the back. So one key decides
both who starts next and who is evicted when KV runs out, as in vLLM's FCFS and priority modes.
"""

from __future__ import annotations

from fleetsim.registry import lookup, make_registry
from fleetsim.serving.contract import OrderKey as OrderKey  # re-exported
from fleetsim.serving.contract import SortKey as SortKey  # re-exported
from fleetsim.serving.request import Request

ORDERING_POLICIES, register_ordering = make_registry("ordering")


@register_ordering("fcfs")
def fcfs(req: Request, now_s: float) -> SortKey:
    """First come, first served (vLLM's default)."""
    return (req.arrival_s, req.id)


@register_ordering("sjf")
def sjf(req: Request, now_s: float) -> SortKey:
    """Shortest job first with oracle knowledge of the output length (remaining outputs)."""
    return (req.max_output_tokens - req.num_output_tokens, req.arrival_s, req.id)


@register_ordering("priority")
def priority(req: Request, now_s: float) -> SortKey:
    """Lower ``priority`` value first, then arrival order (vLLM's priority scheduling)."""
    return (req.priority, req.arrival_s, req.id)


def make_ordering(name: str) -> OrderKey:
    """The key function registered as ``name`` (or imported from ``pkg.mod:func``)."""
    key: OrderKey = lookup(ORDERING_POLICIES, name, "policy.ordering")
    return key
