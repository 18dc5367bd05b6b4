"""Deployment planners (``plan(pools, window, now_s) -> Deployment``) and re-planning triggers
(``should_replan(window) -> bool``) of an elastic cluster (``serving/elastic_control.py``).

Planners size the pools from what the last monitoring window measured:

* ``sla``: NVIDIA Dynamo's SLA planner (github.com/ai-dynamo/dynamo, Apache-2.0,
  docs/architecture/sla_planner.md, "Scaling Algorithm"): the next interval's load is the last
  one's (its ``constant`` load predictor); prefill replicas = ceil(rate x ISL x min(1,
  TTFT correction) / prefill throughput), decode replicas = ceil(rate x OSL / the best decode
  throughput whose ITL meets the target divided by the ITL correction), the corrections
  being measured / expected latency. Dynamo reads the throughputs from a pre-deployment
  profile; here the pool's performance model is that profile. A mixed pool (Dynamo plans P/D
  only) time-shares its GPUs between the phases: it gets the sum of the two needs.
* ``static``: the same sizing, once, from the first window; then it holds: the static
  baseline, so a comparison isolates what re-planning itself gains.
* ``concurrency``: Knative's concurrency autoscaler (KPA, knative.dev docs "Configuring
  concurrency": desired pods = in-flight requests / (target concurrency x target
  utilisation, 0.7 by default)), per role, from the requests in flight at the monitoring
  point.

Triggers: ``always``; ``periodic`` (every k-th monitoring point); ``threshold`` (a latency
above its target, or a stage over- or under-full, as Dynamo's load-based planner compares
its metrics with thresholds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetsim.errors import FleetsimInputError
from fleetsim.registry import PolicySpec, build, lookup, make_registry
from fleetsim.serving.contract import (
    Deployment,
    DeploymentPlanner,
    MonitorWindow,
    PoolState,
    ReplanTrigger,
)

PLANNERS, register_planner = make_registry("deployment planner")
TRIGGERS, register_trigger = make_registry("replan trigger")


# ---- profiling the performance model (Dynamo's interpolators) ------------------------------
def prefill_time_s(pool: PoolState, num_prompt_tokens: int) -> float:
    """One prompt prefilled alone (Dynamo profiles prefill single-batched)."""
    return pool.step_model.step_time_s([(num_prompt_tokens, 0)], 0, 0)


def decode_step_s(pool: PoolState, batch: int, context_tokens: int) -> float:
    return pool.step_model.step_time_s((), batch, batch * context_tokens)


def best_decode_throughput(pool: PoolState, itl_s: float, context_tokens: int) -> float:
    """Output tokens/s of one replica at the largest batch whose step meets ``itl_s`` (at
    least batch 1), within its running and KV limits."""
    max_batch = max(1, min(pool.max_running,
                           pool.num_kv_blocks * pool.block_size // max(1, context_tokens)))
    lo, hi = 1, max_batch  # step time grows with the batch: bisect for the largest that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_step_s(pool, mid, context_tokens) <= itl_s:
            lo = mid
        else:
            hi = mid - 1
    return lo / decode_step_s(pool, lo, context_tokens)


def _fill(pools: Sequence[PoolState], role: str, need: int) -> dict[tuple[str, str], int]:
    """``need`` replicas of ``role`` over the pools that take it, in order, each up to its
    GPUs (at least one in the first, so no stage is left empty)."""
    out: dict[tuple[str, str], int] = {}
    left = max(1, need)
    for pool in pools:
        n = min(left, pool.max_replicas)
        out[(pool.name, role)] = n
        left -= n
    return out


def _by_role(pools: Sequence[PoolState]) -> dict[str, list[PoolState]]:
    out: dict[str, list[PoolState]] = {}
    for p in pools:
        out.setdefault(p.role, []).append(p)
    return out


# ---- planners ----------------------------------------------------------------------------
@register_planner("sla")
@dataclass(slots=True)
class SlaPlanner:
    """Dynamo's SLA planner: prefill and decode replicas from measured load and latency
    against ``ttft_s`` and ``itl_s`` targets (see the module docstring)."""

    ttft_s: float = 1.0
    """Time-to-first-token target, seconds."""
    itl_s: float = 0.05
    """Inter-token latency target, seconds."""
    predictor: str = "constant"
    """Next interval's request rate: constant (the last one's, Dynamo's ``constant``) |
    linear (2 x last - previous, the one-step forecast of ARIMA(0,2,0): a ramp continues)."""
    _isl: float = field(default=math.nan, repr=False)
    _last_rate: float = field(default=math.nan, repr=False)
    _osl: float = field(default=math.nan, repr=False)

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"ttft_s and itl_s must be > 0 seconds, got {self.ttft_s}, "
                             f"{self.itl_s}")
        if self.predictor not in ("constant", "linear"):
            raise ValueError(f"predictor must be constant or linear, got {self.predictor!r}")

    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment:
        # Lengths of the last window that measured them (a quiet window keeps the old ones).
        if not math.isnan(window.mean_prompt_tokens):
            self._isl = window.mean_prompt_tokens
        if not math.isnan(window.mean_output_tokens):
            self._osl = window.mean_output_tokens
        if math.isnan(self._isl) or math.isnan(self._osl):
            return {}  # nothing measured yet: keep the deployment
        rate = window.num_arrivals / window.interval_s
        last, self._last_rate = self._last_rate, rate
        if self.predictor == "linear" and not math.isnan(last):
            rate = max(0.0, 2 * rate - last)
        isl, osl = max(1, round(self._isl)), max(1.0, self._osl)
        context = isl + int(osl / 2)  # Dynamo: next_isl + next_osl / 2
        out: dict[tuple[str, str], int] = {}
        for role, group in _by_role(pools).items():
            p = group[0]
            expected_ttft = prefill_time_s(p, isl)
            p_corr = (window.mean_ttft_s / expected_ttft
                      if not math.isnan(window.mean_ttft_s) else 1.0)
            prefill_need = rate * isl * min(1.0, p_corr) / (isl / expected_ttft)
            num_running = window.num_in_flight_by_role.get(role, 0)
            num_decoding = max(1, round(num_running / max(1, sum(
                q.num_replicas_by_role.get(role, 0) for q in group))))
            expected_itl = decode_step_s(p, num_decoding, context)
            d_corr = (window.mean_itl_s / expected_itl
                      if not math.isnan(window.mean_itl_s) else 1.0)
            decode_need = rate * osl / best_decode_throughput(p, self.itl_s / max(d_corr, 1e-9),
                                                               context)
            need = {"prefill": prefill_need, "decode": decode_need}.get(
                role, prefill_need + decode_need)
            out.update(_fill(group, role, math.ceil(need - 1e-9)))
        return out


@register_planner("static")
@dataclass(slots=True)
class StaticPlanner:
    """The SLA planner's sizing from the first window, then held for the rest of the run."""

    ttft_s: float = 1.0
    """Time-to-first-token target, seconds."""
    itl_s: float = 0.05
    """Inter-token latency target, seconds."""
    _first: Deployment | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        SlaPlanner(self.ttft_s, self.itl_s)  # the targets it plans with, checked at build

    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment:
        if self._first is None:
            first = SlaPlanner(self.ttft_s, self.itl_s).plan(pools, window, now_s)
            if first:
                self._first = first
            return first
        return self._first


@register_planner("concurrency")
@dataclass(slots=True)
class ConcurrencyPlanner:
    """Knative's KPA: replicas = in-flight requests / (target x utilisation), per role."""

    target_in_flight: int = 64
    """Requests in flight one replica is sized for (Knative's container concurrency)."""
    target_utilization: float = 0.7
    """Share of ``target_in_flight`` to aim at (Knative's default, 70%)."""

    def __post_init__(self) -> None:
        if self.target_in_flight < 1 or not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_in_flight must be >= 1 and target_utilization in "
                             f"(0, 1], got {self.target_in_flight}, {self.target_utilization}")

    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment:
        out: dict[tuple[str, str], int] = {}
        per_replica = self.target_in_flight * self.target_utilization
        for role, group in _by_role(pools).items():
            in_flight = window.num_in_flight_by_role.get(role, 0)
            out.update(_fill(group, role, math.ceil(in_flight / per_replica)))
        return out


# ---- triggers ----------------------------------------------------------------------------
@register_trigger("always")
@dataclass(slots=True)
class Always:
    """Plan at every monitoring point."""

    def should_replan(self, window: MonitorWindow) -> bool:
        return True


@register_trigger("periodic")
@dataclass(slots=True)
class Periodic:
    """Plan at every ``every``-th monitoring point (the first included)."""

    every: int = 1
    """Monitoring points between plans."""
    num_seen: int = field(default=0, init=False)
    """Monitoring points seen so far (state, not an argument)."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"every must be >= 1, got {self.every}")

    def should_replan(self, window: MonitorWindow) -> bool:
        due = self.num_seen % self.every == 0
        self.num_seen += 1
        return due


@register_trigger("threshold")
@dataclass(slots=True)
class Threshold:
    """Plan when a latency misses its target, when requests queue, or when the cluster
    runs far under its targets (scale-down): Dynamo's load-based planner's thresholds."""

    ttft_s: float = 1.0
    """Plan when the window's mean TTFT exceeds this (seconds)."""
    itl_s: float = 0.05
    """Plan when the window's mean ITL exceeds this (seconds)."""
    max_waiting: int = 0
    """Plan when more requests than this wait in queues at the monitoring point."""
    low_share: float = 0.3
    """Plan when both latencies are under this share of their targets (over-provisioned)."""

    def should_replan(self, window: MonitorWindow) -> bool:
        ttft, itl = window.mean_ttft_s, window.mean_itl_s
        if ttft > self.ttft_s or itl > self.itl_s or window.num_waiting > self.max_waiting:
            return True
        return (ttft < self.low_share * self.ttft_s and itl < self.low_share * self.itl_s)


def make_planner(spec: PolicySpec, where: str = "elastic.planner") -> DeploymentPlanner:
    cls = lookup(PLANNERS, spec.name, f"{where}.name")
    planner: DeploymentPlanner = build(cls, spec.args, where)
    if not callable(getattr(planner, "plan", None)):
        raise FleetsimInputError(f"{where}.name", spec.name, "a deployment planner defines "
                                 "plan(pools, window, now_s) -> {(pool, role): replicas}")
    return planner


def make_trigger(spec: PolicySpec, where: str = "elastic.trigger") -> ReplanTrigger:
    cls = lookup(TRIGGERS, spec.name, f"{where}.name")
    trigger: ReplanTrigger = build(cls, spec.args, where)
    return trigger
