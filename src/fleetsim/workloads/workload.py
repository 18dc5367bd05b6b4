"""A workload: the requests of one run, held as columns (numpy arrays), sorted by arrival.

Columnar so that a day of traffic (millions of requests) costs a few arrays, not millions of
objects; the engine turns one row into a ``Request`` only when it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True, eq=False)
class Workload:
    """Requests of one run. All arrays have one entry per request, in arrival order."""

    arrival_s: NDArray[np.float64]
    """Arrival time of each request in seconds from the start of the run, non-decreasing."""
    num_prompt_tokens: NDArray[np.int64]
    """Prompt (input) tokens of each request, >= 1."""
    num_output_tokens: NDArray[np.int64]
    """Output tokens each request generates, >= 1 (the first comes from prefill)."""
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    """Per request, the prefix-block hashes of its prompt (Mooncake ``hash_ids``), or None."""
    hash_block_tokens: int = 512
    """Tokens covered by one entry of ``hash_ids`` (512 in the Mooncake traces)."""
    priority: NDArray[np.int64] | None = None
    """Per-request priority for the ``priority`` policy (lower runs first), or None."""
    name: str = "workload"
    """Where it came from, for reports (file name or generator description)."""
    num_unserved_skipped: int = 0
    """Rows of a live recording left out because no server served them (``served: false``)."""

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.num_prompt_tokens) != n or len(self.num_output_tokens) != n:
            raise ValueError("workload columns must have equal lengths")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError("hash_ids must have one entry per request")
        if self.priority is not None and len(self.priority) != n:
            raise ValueError("priority must have one entry per request")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("arrival_s must be sorted")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def num_requests(self) -> int:
        return len(self.arrival_s)
