"""A process-wide memo of pure results, bounded: results a process's simulations would
otherwise compute again and again (a sampled batch, standalone call times, a fit), kept by
exactly the inputs that fix them, the oldest dropped first once ``most`` are kept (a sweep
over many settings must not grow it without end). Keeping or dropping one never changes a
result, only whether it is computed again."""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMemo(Generic[K, V]):
    """``get`` and ``put`` of a dict that holds at most ``most`` entries."""

    def __init__(self, most: int) -> None:
        if most < 1:
            raise ValueError(f"most must be >= 1, got {most}")
        self.most = most
        self._items: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` (dropping the oldest entry when full); returns it."""
        if key not in self._items and len(self._items) >= self.most:
            del self._items[next(iter(self._items))]
        self._items[key] = value
        return value

    def values(self) -> list[V]:
        return list(self._items.values())

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
