"""Traffic that swings (workload.rate_profile): the time-rescaling map and its inverse, the
arrival counts it produces, its equivalence with rate_scale when flat, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.cli import main
from fleetsim.config import config_from_dict
from fleetsim.run import run
from fleetsim.workloads.rate_profile import RateProfile

SWING = [[0, 0.5], [600, 2.0], [1200, 0.5]]


@st.composite
def profiles(draw):
    n = draw(st.integers(1, 6))
    gaps = draw(st.lists(st.floats(1, 500), min_size=n, max_size=n))
    times = np.cumsum(gaps) - gaps[0] + draw(st.sampled_from([0.0, 30.0]))
    mults = draw(st.lists(st.floats(0, 5), min_size=n, max_size=n))
    mults[-1] = max(mults[-1], 0.1)
    if times[0] > 0:
        mults[0] = max(mults[0], 0.1)
    return RateProfile(times_s=tuple(times.tolist()), multipliers=tuple(mults))


@settings(max_examples=150, deadline=None)
@given(profile=profiles(), x=st.lists(st.floats(0, 5000), min_size=1, max_size=20))
def test_warp_inverts_the_cumulative_rate_and_keeps_order(profile, x):
    x = np.sort(np.asarray(x))
    t = profile.warp(x)
    assert np.all(np.diff(t) >= 0)
    assert np.allclose(profile.cumulative(t), x, rtol=1e-9, atol=1e-6)


def test_arrivals_follow_the_profile():
    """Counts per 300 s window equal rate x the profile's area over it (Poisson error)."""
    cfg = {"workload": {"trace": "synthetic", "rate_per_s": 4, "duration_s": 1800,
                        "prompt_tokens": {"kind": "fixed", "value": 64},
                        "output_tokens": {"kind": "fixed", "value": 4},
                        "rate_profile": SWING}}
    arrivals = run(config_from_dict(cfg)).records.requests["arrival_s"]
    counts = np.histogram(arrivals, bins=6, range=(0, 1800))[0]
    profile = RateProfile.from_points(SWING)
    edges = profile.cumulative(np.linspace(0, 1800, 7))
    expected = 4 * np.diff(edges)  # 1050, 1950, 1950, 1050, 600, 600
    assert np.all(np.abs(counts - expected) < 4 * np.sqrt(expected))


def test_a_flat_profile_is_rate_scale():
    """m = 2 everywhere replays the trace exactly as rate_scale = 2 does."""
    base = {"workload": {"max_requests": 150}}
    flat = run(config_from_dict({"workload": {**base["workload"],
                                              "rate_profile": [[0, 2.0]]}}))
    scaled = run(config_from_dict({"workload": {**base["workload"], "rate_scale": 2.0}}))
    for col in ("arrival_s", "first_token_s", "finish_s"):
        assert np.array_equal(flat.records.requests[col], scaled.records.requests[col],
                              equal_nan=True)


def test_a_trace_keeps_its_order_and_lengths_under_a_swing():
    plain = run(config_from_dict({"workload": {"max_requests": 300}})).records.requests
    swung = run(config_from_dict({"workload": {"max_requests": 300,
                                               "rate_profile": SWING}})).records.requests
    by_id = [np.argsort(r["request_id"]) for r in (plain, swung)]
    assert np.array_equal(plain["num_prompt_tokens"][by_id[0]],
                          swung["num_prompt_tokens"][by_id[1]])
    arrivals = swung["arrival_s"][by_id[1]]
    assert np.all(np.diff(arrivals) >= 0)
    assert not np.array_equal(plain["arrival_s"][by_id[0]], arrivals)


@pytest.mark.parametrize(("profile", "needle"), [
    ("[[0, 1], [0, 2]]", "increase"),
    ("[[0, 1], [10, 0]]", "last multiplier"),
    ("[[0, 1, 2]]", "[time_s, multiplier]"),
    ("[[0, -1], [5, 1]]", "[0, 1e6]"),
    ("[]", "at least one"),
])
def test_a_bad_profile_is_one_line_naming_the_field(profile, needle, capsys, tmp_path):
    code = main(["run", "--out", str(tmp_path / "o"), "--set",
                 f"workload.rate_profile={profile}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "workload" in err and "rate_profile" in err and needle in err
