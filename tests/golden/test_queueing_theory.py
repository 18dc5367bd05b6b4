"""The real engine driven into textbook queues: one server, FIFO, Poisson arrivals.

With ``max_running = 1``, one-token prompts and a constant step time, a request's service
time is (output tokens) x (step time), so output lengths set the service law: M/G/1, whose
mean wait is Pollaczek-Khinchine's ``lambda E[S^2] / (2 (1 - rho))``. Tolerances come from
independent replications (STYLE.md section 8).
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import simulate

from fleetsim.workloads import Fixed, Poisson, synthesize
from fleetsim.workloads.workload import Workload

STEP_S = 0.001


class Geometric:
    """Output tokens ~ Geometric(p) on {1, 2, ...}: service nearly exponential (M/M/1)."""

    def __init__(self, mean_tokens: float) -> None:
        self.p = 1.0 / mean_tokens

    @property
    def mean(self) -> float:
        return 1.0 / self.p

    @property
    def second_moment(self) -> float:
        return (2.0 - self.p) / self.p**2

    def sample(self, rng, n):
        return rng.geometric(self.p, n).astype(np.int64)


def run_single_server(rate, service_tokens, n, seed):
    rng = np.random.default_rng(seed)
    w = synthesize(arrival=Poisson(rate_per_s=rate), prompt_tokens=Fixed(value=1),
                   output_tokens=service_tokens, rng=rng, num_requests=n)
    rec, _ = simulate(w, step_time_s=STEP_S, max_running=1, debug=False, kv_blocks=10**6)
    return w, rec


def mean_wait_s(rec, warmup):
    r = rec.requests
    order = np.argsort(r["request_id"])
    wait = (r["first_scheduled_s"] - r["arrival_s"])[order]
    return float(wait[warmup:].mean())


@pytest.mark.parametrize("rho", [0.5, 0.8])
@pytest.mark.parametrize("law", ["deterministic", "geometric"])
def test_mg1_mean_wait_matches_pollaczek_khinchine(rho, law):
    tokens = Fixed(value=10) if law == "deterministic" else Geometric(10.0)
    mean_s = tokens.mean * STEP_S
    second_s2 = tokens.second_moment * STEP_S**2
    rate = rho / mean_s
    expected = rate * second_s2 / (2 * (1 - rho))
    waits = [mean_wait_s(run_single_server(rate, tokens, 4000, seed)[1], 400)
             for seed in range(6)]
    se = np.std(waits, ddof=1) / np.sqrt(len(waits))
    assert abs(np.mean(waits) - expected) < 4 * se + 0.03 * expected, (np.mean(waits), expected)


def test_mm1_limit_and_littles_law():
    """Geometric service with a long mean is M/M/1; Little's law holds on the engine's own
    record of queue lengths (time-average number in system = rate x mean sojourn)."""
    rho = 0.6
    tokens = Geometric(50.0)
    rate = rho / (tokens.mean * STEP_S)
    w, rec = run_single_server(rate, tokens, 5000, seed=11)
    mm1_wait = rho * tokens.mean * STEP_S / (1 - rho)
    pk_wait = rate * tokens.second_moment * STEP_S**2 / (2 * (1 - rho))
    assert abs(pk_wait - mm1_wait) / mm1_wait < 0.02  # geometric(50) ~ exponential
    r, tl = rec.requests, rec.timeline
    span_s = float(r["finish_s"].max() - w.arrival_s[0])
    in_system = tl["num_running"] + tl["num_waiting"]
    time_avg_in_system = float((in_system * tl["busy_s"]).sum()) / span_s
    sojourn = float((r["finish_s"] - r["arrival_s"]).mean())
    arrival_rate = len(w) / span_s
    assert time_avg_in_system == pytest.approx(arrival_rate * sojourn, rel=0.05)


def test_server_never_idles_with_work_waiting():
    """Work conservation: busy time equals total service time, whatever the arrivals."""
    tokens = Fixed(value=7)
    w, rec = run_single_server(900.0, tokens, 500, seed=3)
    assert rec.busy_s_by_replica[0] == pytest.approx(len(w) * 7 * STEP_S, rel=1e-9)
    assert isinstance(w, Workload)
