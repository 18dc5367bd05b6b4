"""Find the highest rate whose SLO attainment meets a target: bracket, then bisect.

The search knows nothing about simulation: it calls ``probe(rate_per_s) -> attainment`` and
keeps every point. Attainment is expected to fall as the rate rises, but a simulated point is
noisy (one arrival pattern, one batching history), so the search does not trust that blindly:

- bisection is geometric (the tolerance is relative, and rates span decades);
- after it converges it re-probes a rate below the answer (``num_verify`` times); a miss there
  breaks monotonicity, and the search goes on below that miss;
- the answer is conservative: the highest passing rate below the lowest failing rate probed,
  so a failing point anywhere pulls it down, and every pair (miss below a pass) is reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

STATUSES = ("converged", "max_runs", "below_min_rate", "at_max_rate")


@dataclass(frozen=True, slots=True)
class Probe:
    """One evaluated rate."""

    rate_per_s: float
    attainment: float
    passed: bool
    extra: dict[str, object] = field(default_factory=dict)
    """Whatever the probe function returned besides attainment (measured rate, cost...)."""


@dataclass(frozen=True, slots=True)
class ThresholdResult:
    """Outcome of a threshold search; ``probes`` are in the order they ran."""

    goodput_rate_per_s: float | None
    """Highest passing rate below the lowest failing one; None when no rate passed."""
    lowest_fail_rate_per_s: float | None
    """Lowest failing rate probed; None when none failed (the answer is a lower bound)."""
    status: str
    """converged | max_runs | below_min_rate (fails even at the lowest allowed rate) |
    at_max_rate (passes at the highest allowed rate: goodput is at least that)."""
    probes: tuple[Probe, ...]
    violations: tuple[tuple[float, float], ...]
    """(failing rate, higher passing rate) pairs: where attainment was not monotone."""

    @property
    def monotone(self) -> bool:
        return not self.violations


ProbeFn = Callable[[float], "float | tuple[float, dict[str, object]]"]


class _Search:
    """The probe log and the bracket derived from it."""

    def __init__(self, probe: ProbeFn, target: float, max_runs: int) -> None:
        self.probe_fn, self.target, self.max_runs = probe, target, max_runs
        self.probes: list[Probe] = []

    @property
    def runs_left(self) -> int:
        return self.max_runs - len(self.probes)

    def eval(self, rate: float) -> bool:
        for p in self.probes:  # never pay twice for the same point
            if math.isclose(p.rate_per_s, rate, rel_tol=1e-9):
                return p.passed
        out = self.probe_fn(rate)
        attainment, extra = out if isinstance(out, tuple) else (out, {})
        # The epsilon keeps 0.9 == 9/10 from failing on float rounding.
        passed = attainment >= self.target - 1e-12
        self.probes.append(Probe(rate, float(attainment), passed, dict(extra)))
        return passed

    def lowest_fail(self) -> float | None:
        fails = [p.rate_per_s for p in self.probes if not p.passed]
        return min(fails) if fails else None

    def best_pass(self) -> float | None:
        """Highest passing rate below every failing one."""
        hi = self.lowest_fail()
        ok = [p.rate_per_s for p in self.probes if p.passed and (hi is None or p.rate_per_s < hi)]
        return max(ok) if ok else None

    def violations(self) -> tuple[tuple[float, float], ...]:
        fails = sorted(p.rate_per_s for p in self.probes if not p.passed)
        passes = sorted(p.rate_per_s for p in self.probes if p.passed)
        return tuple((f, p) for f in fails for p in passes if p > f)


def search_threshold(
    probe: ProbeFn,
    *,
    target: float,
    start_rate_per_s: float,
    min_rate_per_s: float | None = None,
    max_rate_per_s: float | None = None,
    rel_tol: float = 0.05,
    max_runs: int = 20,
    growth: float = 2.0,
    num_verify: int = 1,
) -> ThresholdResult:
    """Highest rate with ``probe(rate) >= target``, to relative tolerance ``rel_tol``.

    ``probe`` returns the attainment (a share in [0, 1]) or ``(attainment, extra)``. The
    search starts at ``start_rate_per_s`` (clamped to the bounds), multiplies or divides by
    ``growth`` until the threshold is bracketed, bisects geometrically until the bracket's
    ratio is at most ``1 + rel_tol``, then verifies ``num_verify`` rates below the answer.
    It never calls ``probe`` more than ``max_runs`` times.
    """
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target must be in (0, 1], got {target}")
    if not rel_tol > 0 or not growth > 1 or max_runs < 1 or not start_rate_per_s > 0:
        raise ValueError("need rel_tol > 0, growth > 1, max_runs >= 1, start_rate_per_s > 0")
    lo_bound = min_rate_per_s if min_rate_per_s is not None else 0.0
    hi_bound = max_rate_per_s if max_rate_per_s is not None else math.inf
    if lo_bound > hi_bound:
        raise ValueError(f"min_rate_per_s {lo_bound} > max_rate_per_s {hi_bound}")
    s = _Search(probe, target, max_runs)
    start = min(max(start_rate_per_s, lo_bound), hi_bound)
    status = _bracket(s, start, lo_bound, hi_bound, growth)
    verified = 0
    while status is None:
        status = _bisect(s, rel_tol)
        if status is not None:
            break
        best = s.best_pass()
        assert best is not None  # _bisect returns None only with a bracket
        check = max(best / (1 + rel_tol) ** 2, lo_bound)
        if verified >= num_verify or s.runs_left < 1 or check >= best:
            status = "converged"
            break
        # Verify a point well inside the passing side: a miss there means noise or a
        # non-monotone region, and the search goes on below it.
        verified += 1
        if s.eval(check):
            status = "converged"
        elif s.best_pass() is None:
            status = ("below_min_rate" if check <= lo_bound
                      else _bracket(s, check, lo_bound, hi_bound, growth))
    return ThresholdResult(s.best_pass(), s.lowest_fail(), status, tuple(s.probes),
                           s.violations())


def _bracket(s: _Search, start: float, lo_bound: float, hi_bound: float,
             growth: float) -> str | None:
    """Probe from ``start`` outward until there is a pass below a fail; None when bracketed."""
    rate = start
    if s.eval(rate):
        while True:
            if rate >= hi_bound:
                return "at_max_rate"
            if s.runs_left < 1:
                return "max_runs"
            rate = min(rate * growth, hi_bound)
            if not s.eval(rate):
                return None
    while True:
        if rate <= lo_bound:
            return "below_min_rate"
        if s.runs_left < 1:
            return "max_runs"
        rate = max(rate / growth, lo_bound)
        if s.eval(rate):
            return None


def _bisect(s: _Search, rel_tol: float) -> str | None:
    """Halve the bracket (in log space) until its ratio is <= 1 + rel_tol."""
    while True:
        lo, hi = s.best_pass(), s.lowest_fail()
        if lo is None or hi is None:
            return "max_runs" if s.runs_left < 1 else None
        if hi / lo <= 1 + rel_tol:
            return None
        if s.runs_left < 1:
            return "max_runs"
        s.eval(math.sqrt(lo * hi))
