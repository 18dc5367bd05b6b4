"""The state of an elastic-sequence-parallel gang: requests with KV spread over instances,
decode batches that own sets of instances, and the per-instance KV ledger.

Invariant (checked by :meth:`Gang.check`): every instance's used count equals the tokens the
requests hold there, no instance exceeds its capacity, and each request's KV sums to the tokens
it has computed (prompt, plus every output token but the last emitted).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class EspRequest:
    id: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    num_emitted: int = 0
    """Output tokens emitted so far (the first comes from prefill)."""
    kv: dict[int, int] = field(default_factory=dict)
    """instance -> KV tokens this request holds there."""
    home: int | None = None
    """The master instance whose KV takes this request's new decode tokens."""
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    num_paused: int = 0

    @property
    def prefill_tokens(self) -> int:
        """Tokens a prefill computes: the prompt and, after a pause, what was generated."""
        return self.num_prompt_tokens + self.num_emitted

    @property
    def kv_tokens(self) -> int:
        return sum(self.kv.values())

    @property
    def num_remaining(self) -> int:
        return self.num_output_tokens - self.num_emitted


@dataclass(slots=True, eq=False)
class DecodeBatch:
    requests: list[EspRequest]
    instances: list[int]


class Gang:
    """``num_instances`` instances of ``capacity`` KV tokens each, and the batches on them."""

    def __init__(self, num_instances: int, capacity: int) -> None:
        self.num_instances, self.capacity = num_instances, capacity
        self.used = [0] * num_instances
        self.batches: list[DecodeBatch] = []

    # -- queries ---------------------------------------------------------------------
    def room(self, instance: int) -> int:
        return self.capacity - self.used[instance]

    def owned(self) -> set[int]:
        return {i for b in self.batches for i in b.instances}

    def idle(self) -> list[int]:
        """Instances no batch owns and that hold no KV."""
        owned = self.owned()
        return [i for i in range(self.num_instances) if i not in owned and self.used[i] == 0]

    def batch_room(self, batch: DecodeBatch) -> int:
        return sum(self.room(i) for i in batch.instances)

    def running(self) -> list[EspRequest]:
        return [r for b in self.batches for r in b.requests]

    # -- KV moves --------------------------------------------------------------------
    def add_kv(self, req: EspRequest, instance: int, num_tokens: int) -> None:
        if num_tokens > self.room(instance):
            raise AssertionError(f"instance {instance} over capacity: {num_tokens} tokens "
                                 f"for {self.room(instance)} free")
        req.kv[instance] = req.kv.get(instance, 0) + num_tokens
        self.used[instance] += num_tokens

    def free_kv(self, req: EspRequest) -> None:
        for instance, n in req.kv.items():
            self.used[instance] -= n
        req.kv.clear()
        req.home = None

    def move_kv(self, req: EspRequest, src: int, dst: int, num_tokens: int) -> None:
        have = req.kv.get(src, 0)
        if not 0 < num_tokens <= have:
            raise AssertionError(f"request {req.id} moves {num_tokens} of {have} tokens")
        self.add_kv(req, dst, num_tokens)
        if num_tokens == have:
            del req.kv[src]
        else:
            req.kv[src] = have - num_tokens
        self.used[src] -= num_tokens
        if req.home == src:
            req.home = dst

    def scale_down(self, batch: DecodeBatch) -> None:
        """Release the batch's instances where none of its requests hold KV."""
        held = {i for r in batch.requests for i in r.kv}
        batch.instances = [i for i in batch.instances if i in held]

    def check(self) -> None:
        used = [0] * self.num_instances
        for b in self.batches:
            for r in b.requests:
                for i, n in r.kv.items():
                    used[i] += n
                computed = r.prefill_tokens - (1 if r.num_emitted else 0)
                if r.kv_tokens != computed:
                    raise AssertionError(f"request {r.id} holds {r.kv_tokens} KV tokens, "
                                         f"computed {computed}")
        if used != self.used or any(u > self.capacity for u in used):
            raise AssertionError(f"KV ledger {self.used} != held {used} (cap {self.capacity})")
