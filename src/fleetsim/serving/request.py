"""One request's state inside a replica.

Token accounting follows vLLM: a request's sequence is its prompt plus the tokens it has
generated so far. ``num_computed_tokens`` of them are in the KV cache. Whenever every known
token has been computed, the step that finished computing them emits one new output token.
So a prefill of P tokens emits the first output token, and each decode step computes the last
emitted token and emits the next. A request with O outputs finishes after computing
P + O - 1 tokens (plus any tokens recomputed after preemption, minus prefix-cache hits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

# A request's lifecycle (``Request.state``). Plain ints, not an enum: the engine tests them
# once per request per step. ``STATE_NAMES[state]`` names them.
#   WAITING -> RUNNING -> FINISHED                     (one replica)
#   RUNNING -> WAITING                                 (preempted by recompute)
#   RUNNING -> SWAPPING_OUT -> SWAPPED -> SWAPPING_IN -> RUNNING   (preempted by swap)
#   RUNNING -> HANDED_OFF (source keeps its KV until the transfer is done)
#           -> INCOMING (queued at the destination) -> IN_TRANSFER -> RUNNING there
#                                                      (P/D handoff, migration)
#   (arrival) -> RELOADING -> WAITING   (its parent's KV comes back from host memory first)
#   WAITING or RUNNING -> ABORTED                      (``Replica.abort``: a client left; a
#                        request whose KV is moving is aborted when its KV lands)
WAITING: Final = 0
RUNNING: Final = 1
SWAPPING_OUT: Final = 2
SWAPPED: Final = 3
SWAPPING_IN: Final = 4
HANDED_OFF: Final = 5
INCOMING: Final = 6
IN_TRANSFER: Final = 7
FINISHED: Final = 8
RELOADING: Final = 9
ABORTED: Final = 10
STATE_NAMES: Final = ("waiting", "running", "swapping_out", "swapped", "swapping_in",
                      "handed_off", "incoming", "in_transfer", "finished", "reloading",
                      "aborted")


@dataclass(slots=True, eq=False)
class Request:
    """A request and its progress. Mutated only by the replica engine; policies read it."""

    id: int
    arrival_s: float
    num_prompt_tokens: int
    max_output_tokens: int
    hash_ids: tuple[int, ...] = ()
    priority: int = 0

    num_computed_tokens: int = 0
    """Tokens of the sequence currently held in the KV cache (computed or prefix hits)."""
    num_output_tokens: int = 0
    """Output tokens emitted so far."""
    num_private_blocks: int = 0
    """KV blocks this request owns alone (not shared through the prefix cache)."""
    num_lookahead_tokens: int = 0
    """KV slots held past the computed tokens for speculative decoding (the draft positions a
    step verifies, and the drafter's own; ``serving/speculative.py``); set by the replica that
    queues the request, 0 where it does not speculate."""
    num_cached_entries: int = 0
    """Leading prefix-cache entries this request holds a reference to."""
    num_prefix_hit_tokens: int = 0
    """Prompt tokens served from the prefix cache at the last admission."""
    num_computed_tokens_total: int = 0
    """Tokens this request actually computed, over all admissions."""
    num_recomputed_tokens: int = 0
    """Tokens computed again after preemptions (already counted in the total)."""
    num_preemptions: int = 0
    service_s: float = 0.0
    """Attained service: seconds of the steps that computed tokens for this request (equal to
    ~1e-15 with decode fast-forward on and off: a window adds its span at once)."""
    num_swaps: int = 0
    """Times this request's KV was swapped out to host memory."""
    state: int = WAITING
    """Lifecycle state (the constants above); RUNNING while in a replica's running batch."""
    replica_id: int | None = None
    """Replica whose queues hold the request now (the destination once a transfer starts)."""
    policy_state: Any = None
    """A home for per-request state of the policies (e.g. FastServe's queue level); the
    engine never reads it."""
    program: Any = None
    """The program (agent DAG) call this request is, set by its source (``programs/``), so
    that program-level policies can read it whatever else keeps state in ``policy_state``;
    the engine never reads it."""
    context_hash_ids: tuple[int, ...] = ()
    """Hash ids of the full blocks of the whole sequence (prompt, then outputs), set by a
    source that expects a follow-up to extend it (an agent's next call after a tool wait): a
    replica with KV retention (``serving/kv_keep.py``) then keeps this KV when it finishes.
    Empty: released at the finish as usual."""
    kv_from: int | None = None
    """The request whose kept KV this one extends (its prompt starts with that request's
    whole sequence), so the replica can reload it or let it go once used; None if none."""
    handoff_s: float = math.nan
    """P/D: when the prefill replica finished and handed the request off."""
    kv_transfer_s: float = 0.0
    """P/D: seconds from handoff until the KV arrived at the decode replica (waiting for
    decode capacity included); 0 on mixed replicas."""
    prefill_replica_id: int | None = None
    """Replica that ran the prefill (P/D), None when the same replica did everything."""
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    last_token_s: float = math.nan
    """When the latest output token was emitted (``serving/itl.py``)."""
    itl_top: list[float] | None = None
    """The largest gaps between output tokens so far, a min-heap (``serving/itl.py``)."""
    abort_reason: str | None = None
    """Why the request was aborted (``Replica.abort``); None while it is not."""

    def __init__(
        self, id: int, arrival_s: float, num_prompt_tokens: int, max_output_tokens: int,
        hash_ids: tuple[int, ...] = (), priority: int = 0, num_computed_tokens: int = 0,
        num_output_tokens: int = 0, num_private_blocks: int = 0, num_lookahead_tokens: int = 0,
        num_cached_entries: int = 0, num_prefix_hit_tokens: int = 0,
        num_computed_tokens_total: int = 0, num_recomputed_tokens: int = 0,
        num_preemptions: int = 0, service_s: float = 0.0, num_swaps: int = 0,
        state: int = WAITING, replica_id: int | None = None, policy_state: Any = None,
        program: Any = None, context_hash_ids: tuple[int, ...] = (), kv_from: int | None = None,
        handoff_s: float = math.nan, kv_transfer_s: float = 0.0,
        prefill_replica_id: int | None = None, first_scheduled_s: float = math.nan,
        first_token_s: float = math.nan, finish_s: float = math.nan,
        last_token_s: float = math.nan, itl_top: list[float] | None = None,
        abort_reason: str | None = None,
    ) -> None:
        # Written out (the dataclass would make the same one): the generated ``__init__`` is
        # interpreted even in the compiled engine, ~11k instructions a request, this ~0.3k.
        # ``test_request.py`` checks it takes the fields' names and defaults in order.
        self.id = id
        self.arrival_s = arrival_s
        self.num_prompt_tokens = num_prompt_tokens
        self.max_output_tokens = max_output_tokens
        self.hash_ids = hash_ids
        self.priority = priority
        self.num_computed_tokens = num_computed_tokens
        self.num_output_tokens = num_output_tokens
        self.num_private_blocks = num_private_blocks
        self.num_lookahead_tokens = num_lookahead_tokens
        self.num_cached_entries = num_cached_entries
        self.num_prefix_hit_tokens = num_prefix_hit_tokens
        self.num_computed_tokens_total = num_computed_tokens_total
        self.num_recomputed_tokens = num_recomputed_tokens
        self.num_preemptions = num_preemptions
        self.service_s = service_s
        self.num_swaps = num_swaps
        self.state = state
        self.replica_id = replica_id
        self.policy_state = policy_state
        self.program = program
        self.context_hash_ids = context_hash_ids
        self.kv_from = kv_from
        self.handoff_s = handoff_s
        self.kv_transfer_s = kv_transfer_s
        self.prefill_replica_id = prefill_replica_id
        self.first_scheduled_s = first_scheduled_s
        self.first_token_s = first_token_s
        self.finish_s = finish_s
        self.last_token_s = last_token_s
        self.itl_top = itl_top
        self.abort_reason = abort_reason

    @property
    def is_running(self) -> bool:
        """True while in a replica's running batch."""
        return self.state == RUNNING

    @property
    def num_tokens(self) -> int:
        """Tokens in the sequence so far: prompt plus emitted outputs."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_tokens_to_next_output(self) -> int:
        """Tokens to compute before the next output token is emitted (1 while decoding)."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens


def itl_stats(r: Request) -> tuple[float, float]:
    """(p99, max) of ``r``'s gaps between output tokens so far (NaN without a gap); the p99
    as numpy's default (linear) percentile over all its gaps computes it."""
    n = r.num_output_tokens - 1
    top = r.itl_top
    if n < 1 or top is None:
        return (math.nan, math.nan)
    vals = sorted(top, reverse=True)  # the largest gaps, descending (zeros pad short ones)
    pos = (n - 1) * 0.99
    lo = int(pos)
    t = pos - lo
    a = vals[n - 1 - lo]  # ascending index i is descending rank n - 1 - i
    b = vals[n - 2 - lo] if lo + 1 <= n - 1 else a
    diff = b - a
    # numpy's _lerp, for bit-equal results
    return ((b - diff * (1 - t)) if t >= 0.5 else (a + diff * t), vals[0])
