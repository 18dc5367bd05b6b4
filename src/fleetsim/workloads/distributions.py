"""Token-length distributions for synthetic workloads, with exact or closed-form moments.

Each exposes ``sample(rng, n)`` (int64 tokens, clipped to >= 1), ``mean`` and ``second_moment``,
so queueing-theory golden tests (M/G/1 needs E[S] and E[S^2]) take the expected value from the
same object that generated the samples (Ciw's idea).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from fleetsim.workloads.loaders import read_column


class LengthDistribution(Protocol):
    """A distribution of token counts (prompt or output lengths)."""

    @property
    def mean(self) -> float: ...

    @property
    def second_moment(self) -> float: ...

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixed:
    """Every request has exactly ``value`` tokens."""

    value: int
    """Tokens, >= 1."""

    def __post_init__(self) -> None:
        if self.value < 1:
            raise ValueError(f"fixed length value must be >= 1 token, got {self.value}")

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def second_moment(self) -> float:
        return float(self.value) ** 2

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class Uniform:
    """Integers drawn uniformly from ``low..high``, both ends included."""

    low: int
    """Smallest length in tokens, >= 1."""
    high: int
    """Largest length in tokens, >= low."""

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise ValueError(
                f"uniform lengths need 1 <= low <= high, got low={self.low}, high={self.high}"
            )

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    @property
    def second_moment(self) -> float:
        # E[X^2] = Var + mean^2 for the discrete uniform on n = high - low + 1 points.
        n = self.high - self.low + 1
        return (n * n - 1) / 12 + self.mean**2

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormal:
    """Lognormal lengths given by their mean and coefficient of variation (std / mean).

    The underlying normal has ``sigma**2 = ln(1 + cv**2)`` and ``mu = ln(mean) - sigma**2 / 2``.
    Samples are rounded to the nearest integer and clipped to >= 1 token; ``mean`` and
    ``second_moment`` are those of the continuous law, which the rounding and clipping shift
    by well under one token when the mean is tens of tokens or more.
    """

    mean_tokens: float
    """Mean length in tokens, >= 1."""
    cv: float
    """Coefficient of variation (std / mean), > 0. Real chat traces show about 0.7 to 1.5."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.mean_tokens) and self.mean_tokens >= 1):
            raise ValueError(f"lognormal mean must be >= 1 token, got {self.mean_tokens}")
        if not (math.isfinite(self.cv) and self.cv > 0):
            raise ValueError(f"lognormal cv must be > 0 (use kind='fixed' for cv 0), got {self.cv}")

    @property
    def sigma(self) -> float:
        return math.sqrt(math.log1p(self.cv**2))

    @property
    def mu(self) -> float:
        return math.log(self.mean_tokens) - self.sigma**2 / 2

    @property
    def mean(self) -> float:
        return float(self.mean_tokens)

    @property
    def second_moment(self) -> float:
        return self.mean_tokens**2 * (1 + self.cv**2)

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        x = np.rint(rng.lognormal(self.mu, self.sigma, size=n))
        return np.maximum(x, 1).astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Empirical:
    """Lengths resampled (uniformly, with replacement) from observed values, e.g. a trace column.

    ``mean`` and ``second_moment`` are exact: they are the moments of ``values`` themselves.
    """

    values: NDArray[np.int64]
    """Observed token counts, each >= 1 (at least one value)."""
    source: str = "values"
    """Where the values came from (``file:column``), for reports."""

    def __post_init__(self) -> None:
        if len(self.values) == 0:
            raise ValueError(f"empirical lengths from {self.source} need at least one value")
        if np.min(self.values) < 1:
            raise ValueError(
                f"empirical lengths from {self.source} must all be >= 1 token, "
                f"got {np.min(self.values)}"
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], column: str) -> Empirical:
        """Read ``column`` of a CSV (header name) or JSONL (key) file, or of an embedded trace.

        Token counts must be whole numbers >= 1; a bad row raises ``FleetsimInputError``.
        """
        return cls(values=read_column(path, column), source=f"{os.fspath(path)}:{column}")

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def second_moment(self) -> float:
        v = np.asarray(self.values, dtype=np.float64)
        return float(np.dot(v, v) / len(v))

    def sample(self, rng: np.random.Generator, n: int) -> NDArray[np.int64]:
        values = np.asarray(self.values, dtype=np.int64)
        return values[rng.integers(0, len(values), size=n)]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class PairedEmpirical:
    """(prompt, output) token counts resampled together, one observed row per request.

    Keeps what independent columns lose: the correlation of a row's prompt and output, and
    filters on both at once, as ``vllm bench serve --dataset-name sharegpt`` samples ShareGPT
    (prompts over 1,024 tokens or rows over 2,048 in all are dropped).
    """

    prompts: NDArray[np.int64]
    outputs: NDArray[np.int64]
    """Observed counts, row-aligned with ``prompts``, each >= 1 (at least one row)."""
    source: str = "rows"

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.outputs):
            raise ValueError(f"paired lengths from {self.source}: {len(self.prompts)} prompts "
                             f"but {len(self.outputs)} outputs")
        if len(self.prompts) == 0:
            raise ValueError(f"paired lengths from {self.source} need at least one row")

    def sample(self, rng: np.random.Generator, n: int
               ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        rows = rng.integers(0, len(self.prompts), size=n)
        return (np.asarray(self.prompts, dtype=np.int64)[rows],
                np.asarray(self.outputs, dtype=np.int64)[rows])
