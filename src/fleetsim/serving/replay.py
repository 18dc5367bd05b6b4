"""Replaying a monitoring window under a candidate deployment: the sub-simulation an evolving
planner scores policies with (``policies/evolve.py``, docs/elastic.md "Evolving policies").

A replay runs the window's arrivals (their times and true prompt and output lengths) through
the same engine (``simulate``), performance model, batching, ordering and routing policies as
the live run, on a fresh cluster with the candidate's replicas per pool. What it starts from
and leaves out, said up front because it bounds how well a replay predicts the window:

* every replica starts empty and ready at the window's start: the requests still in flight
  at that point (their queue and KV), weight loads of joining replicas, replicas draining
  after a leave and the prefix cache's contents are not carried over;
* each request runs to its finish, also past the window's end (its TTFT and TPOT count in
  full); no request of a later window competes with it.

So a replay predicts a window well when the carried-over backlog is small against the
window's own work (tested: ``tests/unit/test_evolve.py``), and under-predicts latency when a
queue carries over from an overloaded window.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleetsim.serving.cluster import PoolSetup, simulate
from fleetsim.serving.settings import EngineSettings, PlugIns
from fleetsim.workloads.workload import Workload

Arrival = tuple[float, int, int]
"""(arrival_s, prompt tokens, output tokens) of one request of a window."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayOutcome:
    """What one replay measured over the window's requests."""

    num_requests: int
    mean_ttft_s: float
    """Mean TTFT of the window's requests (NaN without requests)."""
    slo_attainment: float
    """Share of the window's requests meeting the run's ``[slo]`` (TTFT and TPOT)."""
    gpu_seconds: float
    """GPUs of the deployment x the window's length (what holding it for the window costs)."""


class WindowReplayer:
    """Replays windows on deployments of the live run's pools (see the module docstring).

    ``make_plugins`` builds fresh policies per replay (routers keep cursors), with a fixed
    routing seed so one replay of the same window and deployment always gives the same
    outcome."""

    def __init__(self, pools: Sequence[PoolSetup], num_gpus_by_pool: Mapping[str, int],
                 settings: EngineSettings, make_plugins: Callable[[], PlugIns],
                 slo_ttft_s: float, slo_tpot_s: float) -> None:
        self.pools = {p.name: p for p in pools}
        self.num_gpus_by_pool = dict(num_gpus_by_pool)
        # A replay ends when its requests do; its own time bins.
        self.settings = replace(settings, until_s=math.inf, timeline=None)
        self.make_plugins = make_plugins
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.num_replays = 0

    def replay(self, deployment: Mapping[tuple[str, str], int], arrivals: Sequence[Arrival],
               start_s: float, end_s: float, carried: Sequence[Arrival] = ()) -> ReplayOutcome:
        """Serve ``arrivals`` on ``deployment`` ({(pool, role): replicas}; a pool's other
        roles run as pools of their own on the same performance model). ``carried``: the
        backlog queued at ``start_s``, served first and left out of the outcome."""
        setups = []
        num_gpus = 0
        for (name, role), n in sorted(deployment.items()):
            if n <= 0:
                continue
            base = self.pools[name]
            setups.append(replace(base, name=name if role == base.role else f"{name}/{role}",
                                  role=role, num_replicas=n))
            num_gpus += n * self.num_gpus_by_pool[name]
        gpu_seconds = num_gpus * (end_s - start_s)
        if not arrivals:
            return ReplayOutcome(num_requests=0, mean_ttft_s=math.nan, slo_attainment=1.0,
                                 gpu_seconds=gpu_seconds)
        if not setups:
            raise ValueError(f"a replay needs at least one replica, got {dict(deployment)}")
        rows = [*carried, *arrivals]  # carried ones arrive at start_s, before the window's
        workload = Workload(
            arrival_s=np.array([a for a, _, _ in rows], dtype=np.float64),
            num_prompt_tokens=np.array([p for _, p, _ in rows], dtype=np.int64),
            num_output_tokens=np.array([o for _, _, o in rows], dtype=np.int64),
            name="replay")
        self.num_replays += 1
        records, _ = simulate(workload, setups, self.settings, self.make_plugins())
        own = records.requests["request_id"] >= len(carried)
        req = {k: v[own] for k, v in records.requests.items()}
        # The summary's definitions (metrics/summary.py; serving may not import metrics).
        ttft = req["first_token_s"] - req["arrival_s"]
        outputs = req["num_output_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(outputs > 1, (req["finish_s"] - req["first_token_s"])
                            / (outputs - 1), np.nan)
        met = (ttft <= self.slo_ttft_s) & (np.isnan(tpot) | (tpot <= self.slo_tpot_s))
        return ReplayOutcome(num_requests=len(arrivals), mean_ttft_s=float(np.mean(ttft)),
                             slo_attainment=int(met.sum()) / len(arrivals),
                             gpu_seconds=gpu_seconds)
