"""Length distributions, arrival processes, synthesize() and the transformations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fleetsim.errors import FleetsimInputError
from fleetsim.workloads import (
    Constant,
    Empirical,
    Fixed,
    Gamma,
    LogNormal,
    Poisson,
    Uniform,
    Workload,
    arrival_times_s,
    head,
    load_trace,
    scale_rate,
    synthesize,
    time_slice,
)

N = 200_000


def sample_moments_match(dist, rng: np.random.Generator, n: int = N) -> None:  # noqa: ANN001
    """Sample mean and mean square within 5 standard errors of the object's own moments."""
    x = dist.sample(rng, n).astype(np.float64)
    se_mean = np.sqrt(max(dist.second_moment - dist.mean**2, 0.0) / n)
    assert abs(x.mean() - dist.mean) <= 5 * se_mean + 1e-9 + 0.002 * dist.mean
    se_sq = np.std(x**2) / np.sqrt(n)
    assert abs(np.mean(x**2) - dist.second_moment) <= 5 * se_sq + 0.01 * dist.second_moment


@pytest.mark.parametrize(
    "dist",
    [
        Fixed(value=7),
        Uniform(low=1, high=10),
        Uniform(low=100, high=2000),
        LogNormal(mean_tokens=1000.0, cv=1.0),
        LogNormal(mean_tokens=200.0, cv=0.5),
        Empirical(values=np.array([1, 5, 5, 100, 7000])),
    ],
    ids=lambda d: type(d).__name__,
)
def test_length_sample_moments(dist) -> None:  # noqa: ANN001
    rng = np.random.default_rng(1)
    sample_moments_match(dist, rng)
    x = dist.sample(rng, 1000)
    assert x.dtype == np.int64
    assert x.min() >= 1


def test_fixed_and_uniform_exact_moments() -> None:
    assert Fixed(value=3).second_moment == 9.0
    u = Uniform(low=1, high=3)
    assert u.mean == 2.0
    assert u.second_moment == pytest.approx((1 + 4 + 9) / 3)


def test_lognormal_clips_to_one_token() -> None:
    x = LogNormal(mean_tokens=1.0, cv=3.0).sample(np.random.default_rng(0), 10_000)
    assert x.min() == 1


def test_empirical_from_sharegpt_stats_and_the_azure_slice() -> None:
    dist = Empirical.from_file("embedded:sharegpt_lengths", "num_decode_tokens")
    assert len(dist.values) == 30_731  # data/README.md: every row of etalon's file
    assert dist.mean == pytest.approx(439, abs=1)
    dist = Empirical.from_file("embedded:azure_conv_2023", "GeneratedTokens")
    assert dist.mean == pytest.approx(
        load_trace("embedded:azure_conv_2023").num_output_tokens.mean()
    )


def test_empirical_errors(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("num_decode_tokens\n5\n0\n")
    with pytest.raises(FleetsimInputError, match=r"s\.csv, line 3, column 'num_decode_tokens'"):
        Empirical.from_file(path, "num_decode_tokens")
    with pytest.raises(FleetsimInputError, match="missing column 'nope'"):
        Empirical.from_file(path, "nope")
    with pytest.raises(ValueError, match="at least one"):
        Empirical(values=np.array([], dtype=np.int64))


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Fixed(value=0),
        lambda: Uniform(low=5, high=4),
        lambda: Uniform(low=0, high=4),
        lambda: LogNormal(mean_tokens=0.5, cv=1.0),
        lambda: LogNormal(mean_tokens=10.0, cv=0.0),
        lambda: Poisson(rate_per_s=0.0),
        lambda: Gamma(rate_per_s=1.0, cv=-1.0),
        lambda: Constant(rate_per_s=float("inf")),
    ],
)
def test_distribution_validation(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="got"):
        bad()


# --- arrivals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_interarrival_cv_and_rate(cv: float) -> None:
    proc = Gamma(rate_per_s=4.0, cv=cv)
    iat = proc.sample(np.random.default_rng(2), N)
    assert iat.mean() == pytest.approx(0.25, rel=0.02)
    assert iat.std() / iat.mean() == pytest.approx(cv, rel=0.05)
    assert np.mean(iat**2) == pytest.approx(proc.second_moment, rel=0.1)


def test_poisson_moments() -> None:
    proc = Poisson(rate_per_s=10.0)
    iat = proc.sample(np.random.default_rng(3), N)
    assert iat.mean() == pytest.approx(proc.mean, rel=0.02)
    assert np.mean(iat**2) == pytest.approx(proc.second_moment, rel=0.03)
    assert iat.std() / iat.mean() == pytest.approx(1.0, rel=0.02)


def test_arrival_times_start_at_zero_and_respect_limits() -> None:
    rng = np.random.default_rng(4)
    t = arrival_times_s(Poisson(rate_per_s=5.0), rng, num_requests=100)
    assert len(t) == 100
    assert t[0] == 0.0
    assert np.all(np.diff(t) >= 0)
    t = arrival_times_s(Poisson(rate_per_s=5.0), rng, until_s=1000.0)
    assert t[-1] < 1000.0
    assert len(t) == pytest.approx(5000, rel=0.1)
    t = arrival_times_s(Constant(rate_per_s=2.0), rng, num_requests=10, until_s=2.0)
    np.testing.assert_allclose(t, [0.0, 0.5, 1.0, 1.5])


def test_synthesize_is_deterministic_per_seed() -> None:
    def make(seed: int) -> Workload:
        return synthesize(
            arrival=Gamma(rate_per_s=3.0, cv=2.0),
            prompt_tokens=LogNormal(mean_tokens=500.0, cv=1.0),
            output_tokens=Uniform(low=1, high=64),
            rng=np.random.default_rng(seed),
            num_requests=500,
        )

    a, b, c = make(7), make(7), make(8)
    assert len(a) == 500
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)
    np.testing.assert_array_equal(a.num_prompt_tokens, b.num_prompt_tokens)
    assert not np.array_equal(a.num_prompt_tokens, c.num_prompt_tokens)


# --- transformations ---------------------------------------------------------------------------


def small() -> Workload:
    return Workload(
        arrival_s=np.array([0.0, 1.0, 2.0, 3.0, 4.0]),
        num_prompt_tokens=np.array([10, 11, 12, 13, 14]),
        num_output_tokens=np.array([1, 2, 3, 4, 5]),
        hash_ids=((1,), (2,), (3,), (4,), (5,)),
        priority=np.array([0, 1, 0, 1, 0]),
    )


def test_rate_scaling_halves_span() -> None:
    w = load_trace("embedded:azure_conv_2023")
    fast = scale_rate(w, 2.0)
    assert fast.arrival_s[-1] == pytest.approx(w.arrival_s[-1] / 2)
    assert len(fast) == len(w)
    np.testing.assert_array_equal(fast.num_prompt_tokens, w.num_prompt_tokens)
    assert scale_rate(w, 1.0) is w
    with pytest.raises(ValueError, match="got 0"):
        scale_rate(w, 0)


def test_time_slice_keeps_window_and_shifts() -> None:
    w = time_slice(small(), start_s=1.0, duration_s=2.0)
    np.testing.assert_allclose(w.arrival_s, [0.0, 1.0])
    assert w.num_prompt_tokens.tolist() == [11, 12]
    assert w.hash_ids == ((2,), (3,))
    assert w.priority is not None
    assert w.priority.tolist() == [1, 0]
    assert len(time_slice(small(), start_s=2.5)) == 2
    assert len(time_slice(small(), start_s=10.0)) == 0


def test_time_slice_on_real_trace() -> None:
    w = load_trace("embedded:azure_conv_2023")
    sliced = time_slice(w, start_s=300.0, duration_s=60.0)
    assert sliced.arrival_s[0] >= 0
    assert sliced.arrival_s[-1] < 60.0
    expected = np.sum((w.arrival_s >= 300.0) & (w.arrival_s < 360.0))
    assert len(sliced) == expected


def test_head() -> None:
    assert head(small(), 2).num_output_tokens.tolist() == [1, 2]
    assert len(head(small(), None)) == 5
    assert len(head(small(), 99)) == 5
