"""What policies, routers and controllers may read of a replica: ``ReplicaView``.

Every value is exact at the time it is read. ``load_tokens``, the prefix-cache match and the
constant limits are exact at any time, even inside a fast-forward window (decode steps leave
the load unchanged, and windows never touch the prefix cache: they use only free blocks and
finishes only make entries evictable; a chunk run's load counts its chunks done by now, and
the match settles a run in flight first, whose chunks' entries are promoted as it settles).
Everything else (the queues, the requests' token counts, KV use) first makes the replica
exact at ``now`` (``Replica.interrupt``: the window in flight is cut back to the step in
progress), so reading it costs speed, never results.

The view is read-only by its types: queues are ``Sequence``s, and the KV cache is seen
through ``KVView``, its queries only. Policies must not mutate the requests they see.

Replicas whose steps share a resource (an SoC's DDR, ``shared_steps.py``) also see the steps
the others run (``co_resident_steps``, exact after settling their windows) and how much a step
of their own would slow those (``co_resident_slowdowns``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from fleetsim.serving.request import SWAPPING_IN, SWAPPING_OUT, Request

if TYPE_CHECKING:
    from fleetsim.serving.kv_cache import KVCache
    from fleetsim.serving.replica import Replica
    from fleetsim.serving.shared_steps import SharedSteps
    from fleetsim.serving.window import Step


# ``_new_tuple(T, fields)`` equals ``T(*fields)`` for a named tuple ``T`` given every field
# (``contract.new_named_tuple``; the contract imports this module).
_new_tuple = tuple.__new__


class CoResidentStep(NamedTuple):
    """The step another replica on the same shared resource runs now."""

    replica_id: int
    decodes: tuple[Request, ...]  # requests computing one decode token in it
    chunks: tuple[tuple[Request, int], ...]  # (request, prompt tokens) of its prefill chunks


class KVView(Protocol):
    """The questions a policy may ask of a replica's KV cache (no commits)."""

    num_blocks: int
    block_size: int
    blocks_per_entry: int
    hash_block_tokens: int | None
    num_free_blocks: int

    @property
    def num_available_blocks(self) -> int: ...
    @property
    def num_used_blocks(self) -> int: ...
    def num_blocks_for(self, num_tokens: int) -> int: ...
    def num_matched_entries(self, req: Request) -> int: ...
    def num_prefix_hit_tokens(self, req: Request) -> int: ...
    def admission_blocks(self, req: Request, num_new_tokens: int) -> int: ...
    def blocks_needed(self, req: Request, num_new_tokens: int) -> int: ...
    def num_held_blocks(self, req: Request) -> int: ...
    def reclaimable_blocks(self, req: Request) -> int: ...


class ReplicaView:
    """A replica as its readers see it (see the module docstring for what is exact how)."""

    __slots__ = ("_replica",)

    def __init__(self, replica: Replica) -> None:
        self._replica = replica

    # ---- exact at any time, no settling ----------------------------------------------
    @property
    def replica_id(self) -> int:
        return self._replica.replica_id

    @property
    def pool(self) -> str:
        return self._replica.pool

    @property
    def role(self) -> str:
        return self._replica.role

    @property
    def load_tokens(self) -> int:
        """Known tokens still to compute here: prefill backlog plus one per decoding
        request, plus one per request whose KV is queued or on its way in."""
        r = self._replica
        moves = r.moves
        return r.load_tokens + len(moves.incoming) + moves.num_reserved

    @property
    def max_batched_tokens(self) -> int:
        return self._replica.max_batched_tokens

    @property
    def max_running(self) -> int:
        """Running slots a plan may fill (the limit less reservations for incoming KV)."""
        return self._replica.max_running

    @property
    def num_kv_blocks(self) -> int:
        return self._replica.kv.num_blocks

    @property
    def block_size(self) -> int:
        """Tokens per KV block."""
        return self._replica.kv.block_size

    @property
    def hash_block_tokens(self) -> int | None:
        return self._replica.kv.hash_block_tokens

    def num_matched_entries(self, req: Request) -> int:
        """Leading prefix-cache entries of ``req``'s prompt cached here now."""
        replica = self._replica
        step = replica.current_step
        if step is not None and step.run is not None:
            replica.interrupt()  # a chunk run promotes its chunks' entries as it settles
        return replica.kv.num_matched_entries(req)

    @property
    def link_bw_bytes_per_s(self) -> float:
        """The replica's KV link, one direction (bytes/s; inf outside a cluster)."""
        moves = self._replica.moves
        bw = moves.transfers.egress_bw if moves.transfers is not None else {}
        return bw.get(self._replica.replica_id, float("inf"))

    @property
    def kv_bytes_per_token(self) -> float:
        """KV bytes of one token, all layers and heads (what a handoff moves per token)."""
        return self._replica.moves.kv_bytes_per_token

    @property
    def order_key(self) -> Callable[[Request, float], tuple]:
        """The key the queues are sorted by (the policy's own ``order_key``, or the
        configured ordering)."""
        return self._replica.order_key

    @property
    def num_entered(self) -> int:
        """Requests that have entered the queues from outside so far (arrivals, and KV moved
        or swapped in): unchanged since a policy last read it, no request is new to it."""
        return self._replica.num_entered

    @property
    def num_incoming(self) -> int:
        """Requests whose KV is queued to move here or on its way in."""
        moves = self._replica.moves
        return len(moves.incoming) + moves.num_reserved

    # ---- exact after settling the window in flight -----------------------------------
    @property
    def running(self) -> Sequence[Request]:
        """The running batch, sorted by the ordering policy, best first."""
        self._replica.interrupt()
        return self._replica.running

    @property
    def waiting(self) -> Sequence[Request]:
        """Requests waiting to be admitted, sorted by the ordering policy, best first."""
        self._replica.interrupt()
        return self._replica.waiting

    def decode_load(self) -> tuple[int, int, int, int]:
        """(running requests, their tokens, waiting requests, KV blocks available): what a
        router's decode estimate reads of every decode replica at each decision
        (``policies/programs.py``), in one call.

        It settles the window in flight like ``running`` does. Reading it instead through
        ``Replica.peek_window`` (no cut: 7% fewer step events on HexAGenT's LATS at 12
        programs/s) leaves every request's record the same but moves the busy-time and KV-use
        integrals of the summary in their last bits (windows add them in another
        association), so the reads cut, and results stay bit-identical."""
        replica = self._replica
        replica.interrupt()
        running = replica.running
        num_tokens = 0
        for r in running:
            num_tokens += r.num_tokens
        return len(running), num_tokens, len(replica.waiting), replica.kv.num_available_blocks

    @property
    def swapped(self) -> Sequence[Request]:
        """Requests whose KV is in host memory, in swap-out order."""
        self._replica.interrupt()
        return self._replica.swapped

    @property
    def kv(self) -> KVCache:
        """The replica's KV cache, exact at now. A policy only asks it questions (``KVView``);
        typed as the cache itself so that the compiled planners' helpers call it directly."""
        self._replica.interrupt()
        return self._replica.kv

    @property
    def num_blocks_swapping_out(self) -> int:
        """GPU blocks that swaps in flight will free when their copies are done."""
        moves = self._replica.moves
        kv = self._replica.kv
        return sum(kv.reclaimable_blocks(r) for r in moves.swapping.values()
                   if r.state == SWAPPING_OUT)

    @property
    def num_swapping_in(self) -> int:
        """Requests whose KV is on its way back from host memory (they hold GPU blocks and
        will take running slots)."""
        return sum(1 for r in self._replica.moves.swapping.values() if r.state == SWAPPING_IN)

    @property
    def num_host_blocks(self) -> int:
        """Blocks of the host-memory KV tier (0 without one)."""
        host = self._replica.host
        return host.num_blocks if host is not None else 0

    def step_time_s(self, prefill_chunks: Sequence[tuple[int, int]], num_decode: int,
                    decode_kv_tokens: int) -> float:
        """What the replica's performance model says a step of this shape takes (a policy's
        profile: FastServe's skip-join asks it for prefill times)."""
        replica = self._replica
        shared = replica.shared
        if shared is not None and shared.model is replica.step_model:
            # The same model's method, called on its class (compiled, a call through the
            # step-model protocol is generic: Agent.xpu's piggyback asks per candidate).
            return shared.model.step_time_s(prefill_chunks, num_decode, decode_kv_tokens)
        return replica.step_model.step_time_s(prefill_chunks, num_decode, decode_kv_tokens)

    def decode_step_time_s(self, num_decode: int, decode_kv_tokens: int) -> float:
        """``step_time_s((), num_decode, decode_kv_tokens)``: a decode-only step (on an SoC
        priced without the walk over prefill chunks, the same float operations)."""
        replica = self._replica
        shared = replica.shared
        if shared is not None and shared.model is replica.step_model:
            return shared.model.decode_step_s(num_decode, decode_kv_tokens)
        return replica.step_model.step_time_s((), num_decode, decode_kv_tokens)

    @property
    def co_resident_steps(self) -> tuple[CoResidentStep, ...] | None:
        """The steps in progress on the other replicas whose steps share this one's resource
        (none outside an SoC-like cluster), or None while one of them starts or ends a step at
        this very instant (its next step is still to be planned: ``StepPlan``'s
        ``wait_for_co_resident`` hears when it is)."""
        steps = self._co_resident()
        if steps is None:
            return None
        out: list[CoResidentStep] = []
        for port, step in steps:
            other = port.replica
            assert other is not None
            # (every field given: the tuple as is, without the named tuple's Python-level
            # ``__new__``, ~2.4k instructions a step read when compiled)
            out.append(_new_tuple(CoResidentStep, (other.replica_id, tuple(step.decodes),
                                                   tuple(step.chunks))))
        return tuple(out)

    def co_resident_slowdowns(self, prefill_chunks: Sequence[tuple[int, int]],
                              num_decode: int, decode_kv_tokens: int) -> tuple[float, ...]:
        """For each of ``co_resident_steps``, how many times longer it would take if a step
        of this shape (``step_time_s``'s arguments) ran beside it on the shared resource
        (1.0: not slowed): both steps' whole demands at the resource's max-min shares."""
        steps = self._co_resident()
        shared = self._replica.shared
        if not steps or shared is None:
            return ()
        return tuple(shared.slowdowns(steps, prefill_chunks, num_decode, decode_kv_tokens))

    def _co_resident(self) -> list[tuple[SharedSteps, Step]] | None:
        shared = self._replica.shared
        if shared is None:
            return []
        now_s = self._replica.sim.now_s
        out: list[tuple[SharedSteps, Step]] = []
        for port in shared.co_residents():
            other = port.replica
            assert other is not None
            other.interrupt()  # a window in flight is cut back to the step in progress
            step = other.current_step
            if step is None:
                if other.busy:  # woken: it plans its first step at this instant
                    return None
                continue
            if step.end_s <= now_s:  # it ends now; the next one is still to come
                return None
            out.append((port, step))
        return out

    @property
    def num_free_host_blocks(self) -> int:
        """Free blocks of the host-memory KV tier (0 without one)."""
        host = self._replica.host
        return host.num_free_blocks if host is not None else 0
