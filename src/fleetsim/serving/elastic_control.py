"""The controller of an elastic cluster: it applies the GPU join/leave schedule, and at each
monitoring point measures the last window, asks the trigger, lets the planner plan, and
turns the plan into joins, leaves and flips (``elastic.py``).

The planner's compute time is modelled, not measured (nothing under ``src/`` reads the
clock): ``plan_overhead_s`` after the monitoring point its plan takes effect, and the sum is
reported as scheduling overhead. A monitoring point first makes every replica exact at now
(``Replica.interrupt``), so the window it measures, and hence the plan, is the same with
decode fast-forward on or off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.serving.cluster import Cluster
from fleetsim.serving.contract import (
    Deployment,
    DeploymentPlanner,
    MonitorWindow,
    PoolState,
    ReplanTrigger,
    RequestSource,
    SourceContext,
)
from fleetsim.serving.elastic import LOADING, ROLES, SERVING, ElasticCluster, ElasticPool
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import Request


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuChange:
    """From ``at_s`` on, ``pool`` has ``num_gpus`` GPUs (``elastic.schedule``)."""

    at_s: float
    pool: str
    num_gpus: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlSettings:
    """How the controller runs (``[elastic]``, validated there; see ``elastic_config.py``)."""

    schedule: tuple[GpuChange, ...] = ()
    leave_rule: str = "drain"
    load_from: str = "host"
    startup_s: float = 0.0
    monitor_interval_s: float = 30.0
    plan_overhead_s: float = 0.0


class _CountingSource:
    """A source wrapper that counts arrivals and their prompt tokens (a front end's view)."""

    def __init__(self, inner: RequestSource) -> None:
        self.inner = inner
        self.wants_finishes = inner.wants_finishes
        self.num_arrivals = 0
        self.num_prompt_tokens = 0
        self.arrivals: list[tuple[float, int, int]] = []  # since the last monitoring point

    @property
    def num_requests(self) -> int | None:
        return self.inner.num_requests

    def start(self, ctx: SourceContext) -> None:
        self.inner.start(ctx)

    def on_arrival(self, req: Request, ctx: SourceContext) -> None:
        self.num_arrivals += 1
        self.num_prompt_tokens += req.num_prompt_tokens
        self.arrivals.append((req.arrival_s, req.num_prompt_tokens, req.max_output_tokens))
        self.inner.on_arrival(req, ctx)

    def on_finish(self, req: Request, ctx: SourceContext) -> None:
        self.inner.on_finish(req, ctx)


class ElasticController:
    """Drives an ``ElasticCluster`` from ``config`` (a ``Controller``: see ``contract.py``)."""

    def __init__(self, config: ControlSettings, pools: Sequence[ElasticPool], *,
                 planner: DeploymentPlanner | None, trigger: ReplanTrigger,
                 block_size: int, max_running: int, start_s: float = 0.0) -> None:
        self.config = config
        self.pools = {p.setup.name: p for p in pools}
        self.planner = planner
        self.trigger = trigger
        self.block_size = block_size
        self.max_running = max_running
        self.start_s = start_s
        self.schedule: list[GpuChange] = sorted(config.schedule, key=lambda c: c.at_s)
        self.max_replicas = {p.setup.name: p.setup.num_replicas for p in pools}
        self.elastic: ElasticCluster | None = None
        self.num_plans = 0
        self.overhead_s = 0.0
        self._pending: list[tuple[float, Deployment]] = []  # (effective at, plan)
        self._next_monitor_s = math.inf
        self._window_start_s = start_s
        self._counted = (0, 0, 0)  # arrivals, prompt tokens, finished rows at window start
        self._source: _CountingSource | None = None
        self._carried: tuple[tuple[float, int, int], ...] = ()  # queued at the window start

    # ---- Controller ------------------------------------------------------------------
    def start(self, cluster: Cluster) -> float | None:
        self.elastic = ElasticCluster(cluster, self.pools, startup_s=self.config.startup_s)
        if cluster.source is not None:
            self._source = _CountingSource(cluster.source)
            cluster.source = self._source
        if self.planner is not None:
            self._next_monitor_s = self.start_s + self.config.monitor_interval_s
        return self._next_s()

    def on_tick(self, cluster: Cluster, now_s: float) -> float | None:
        while self.schedule and self.schedule[0].at_s <= now_s:
            self._apply_gpus(self.schedule.pop(0), now_s)
        while self._pending and self._pending[0][0] <= now_s:
            self._apply(self._pending.pop(0)[1], now_s)
        if self._next_monitor_s <= now_s:
            self._monitor(cluster, now_s)
        return self._next_s()

    def _next_s(self) -> float | None:
        times = [self._next_monitor_s]
        if self.schedule:
            times.append(self.schedule[0].at_s)
        if self._pending:
            times.append(self._pending[0][0])
        t = min(times)
        return None if t == math.inf else t

    # ---- the schedule ----------------------------------------------------------------
    def _apply_gpus(self, change: GpuChange, now_s: float) -> None:
        """A pool's GPUs change: replicas beyond them leave (least loaded first, by the
        leaving rule); without a planner, new GPUs are filled with replicas of its role."""
        e = self.elastic
        assert e is not None
        ep = self.pools[change.pool]
        cap = change.num_gpus // ep.num_gpus_per_replica
        self.max_replicas[change.pool] = cap
        e.timeline.append({"time_s": now_s, "action": "gpus", "pool": change.pool,
                           "num_gpus": change.num_gpus, "max_replicas": cap})
        held = [r for r in e.cluster.replicas
                if r.pool == change.pool and e.state[r.replica_id] in (LOADING, SERVING)]
        for r in self._least_loaded([r for r in held if e.state[r.replica_id] == SERVING]):
            if len(held) <= cap:
                break
            if e.can_leave(r.replica_id):
                e.remove(r.replica_id, self.config.leave_rule)
                held.remove(r)
        if self.planner is None:
            for _ in range(cap - self._num_held(change.pool)):
                e.add(change.pool, load_from=self.config.load_from)

    def _num_held(self, pool: str) -> int:
        """Replicas of ``pool`` holding GPUs (leaving ones too: their GPUs are busy)."""
        e = self.elastic
        assert e is not None
        return sum(1 for r in e.cluster.replicas
                   if r.pool == pool and e.state[r.replica_id] != "retired")

    @staticmethod
    def _least_loaded(replicas: list[Replica]) -> list[Replica]:
        return sorted(replicas, key=lambda r: (r.load_tokens, -r.replica_id))

    # ---- monitoring and planning -----------------------------------------------------
    def _monitor(self, cluster: Cluster, now_s: float) -> None:
        window = self._measure(cluster, now_s)
        self._next_monitor_s = now_s + self.config.monitor_interval_s
        if self._finished(cluster):
            self._next_monitor_s = math.inf
        if self.planner is None or not self.trigger.should_replan(window):
            return
        plan = dict(self.planner.plan(self._pool_states(), window, now_s))
        self.num_plans += 1
        self.overhead_s += self.config.plan_overhead_s
        e = self.elastic
        assert e is not None
        e.timeline.append({"time_s": now_s, "action": "plan",
                           "deployment": {f"{p}/{r}": n for (p, r), n in sorted(plan.items())},
                           "overhead_s": self.config.plan_overhead_s,
                           "mean_ttft_s": window.mean_ttft_s, "mean_itl_s": window.mean_itl_s,
                           "num_arrivals": window.num_arrivals})
        if self.config.plan_overhead_s > 0:
            self._pending.append((now_s + self.config.plan_overhead_s, plan))
        else:
            self._apply(plan, now_s)

    def _finished(self, cluster: Cluster) -> bool:
        src = self._source
        if src is None or src.num_requests is None:
            return False
        done = cluster.recorder.num_finished + len(cluster.recorder.aborted)
        return src.num_arrivals >= src.num_requests and done >= src.num_arrivals

    def _measure(self, cluster: Cluster, now_s: float) -> MonitorWindow:
        for r in cluster.replicas:
            r.interrupt()  # settle fast-forward windows: the same window as stepping
        src = self._source
        arrivals, prompt = (src.num_arrivals, src.num_prompt_tokens) if src else (0, 0)
        a0, p0, f0 = self._counted
        rows = cluster.recorder.finished_since(f0)
        self._counted = (arrivals, prompt, f0 + len(rows))
        num_arrivals = arrivals - a0
        itls = [(fin - first) / (n - 1) for _, first, fin, n in rows if n > 1]
        e = self.elastic
        assert e is not None
        in_flight: dict[str, int] = {}
        num_waiting = 0
        queued = []
        for r in e.replicas_in(SERVING):
            in_flight[r.role] = in_flight.get(r.role, 0) + len(r.running) + len(r.waiting)
            num_waiting += len(r.waiting)
            queued += [_backlog(q, now_s) for q in (*r.running, *r.waiting)]
        window = MonitorWindow(
            start_s=self._window_start_s, end_s=now_s, num_arrivals=num_arrivals,
            mean_prompt_tokens=(prompt - p0) / num_arrivals if num_arrivals else math.nan,
            num_finished=len(rows),
            mean_output_tokens=_mean([n for *_, n in rows]),
            mean_ttft_s=_mean([first - arr for arr, first, _, _ in rows]),
            mean_itl_s=_mean(itls), num_waiting=num_waiting, num_in_flight_by_role=in_flight,
            arrivals=tuple(src.arrivals) if src else (), carried=self._carried,
            backlog=tuple(queued))
        self._carried = window.backlog
        if src is not None:
            src.arrivals.clear()
        self._window_start_s = now_s
        return window

    def _pool_states(self) -> list[PoolState]:
        e = self.elastic
        assert e is not None
        out = []
        for name, ep in self.pools.items():
            counts: dict[str, int] = {}
            for r in e.cluster.replicas:
                if r.pool == name and e.state[r.replica_id] in (LOADING, SERVING):
                    counts[r.role] = counts.get(r.role, 0) + 1
            setup = ep.setup
            out.append(PoolState(
                name=name, role=setup.role, num_gpus_per_replica=ep.num_gpus_per_replica,
                max_replicas=self.max_replicas[name], num_replicas_by_role=counts,
                step_model=setup.step_model, num_kv_blocks=setup.num_kv_blocks,
                block_size=self.block_size, max_running=self.max_running))
        return out

    def _apply(self, plan: Deployment, now_s: float) -> None:
        """Move the deployment toward ``plan``: shrink first (flip a surplus replica to a
        role short in its pool, else let it leave), then grow within the pool's GPUs."""
        e = self.elastic
        assert e is not None
        rule, load_from = self.config.leave_rule, self.config.load_from
        self._check_plan(plan)
        for (pool, role), target in sorted(plan.items()):
            surplus = self._least_loaded(e.replicas_in(SERVING, pool, role))
            num_now = len(surplus) + len(e.replicas_in(LOADING, pool, role))
            for r in surplus[:max(0, num_now - max(target, 0))]:
                if not e.can_leave(r.replica_id):
                    continue
                short = [ro for (p, ro), t in sorted(plan.items()) if p == pool and ro != role
                         and t > len(e.replicas_in(SERVING, p, ro))
                         + len(e.replicas_in(LOADING, p, ro))]
                if short:
                    e.flip(r.replica_id, short[0], rule)
                else:
                    e.remove(r.replica_id, rule)
        for (pool, role), target in sorted(plan.items()):
            num_now = len(e.replicas_in(SERVING, pool, role)) + len(
                e.replicas_in(LOADING, pool, role))
            room = self.max_replicas[pool] - self._num_held(pool)
            for _ in range(min(target - num_now, room)):
                e.add(pool, role, load_from)

    def _check_plan(self, plan: Deployment) -> None:
        """A plan names pools of this cluster, roles and whole replica counts >= 0 (a buggy
        planner fails at the plan it got wrong, STYLE.md section 5)."""
        for key, n in plan.items():
            ok = (isinstance(key, tuple) and len(key) == 2 and key[0] in self.pools
                  and key[1] in ROLES and type(n) is int and n >= 0)
            if not ok:
                raise FleetsimInputError(
                    f"elastic.planner ({type(self.planner).__name__})", f"{key!r}: {n!r}",
                    f"plan() must return {{(pool, role): replicas >= 0}} with pools "
                    f"{sorted(self.pools)} and roles {list(ROLES)}")

    def report(self, now_s: float) -> dict[str, Any]:
        """The summary's ``elastic`` section."""
        e = self.elastic
        assert e is not None
        out = {**e.report(now_s), "num_plans": self.num_plans,
               "planner_overhead_s": self.overhead_s,
               "planner_overhead_kind": "modelled (elastic.plan_overhead_s per plan)"}
        planner_report = getattr(self.planner, "report", None)
        if callable(planner_report):  # e.g. the evolving planner's timeline
            out.update(planner_report())
        return out


def _backlog(req: Request, now_s: float) -> tuple[float, int, int]:
    """A request in flight as a replay's arrival at ``now_s``: its prompt left to prefill and
    the outputs left to emit. One already decoding keeps its running slot and its remaining
    decode steps but not its KV (a replay cannot hold KV it did not compute): 1 prompt token
    stands for it, so the replay under-counts attention over its context."""
    left = req.num_prompt_tokens - req.num_computed_tokens
    if req.num_output_tokens == 0 and left > 0:
        return (now_s, left, req.max_output_tokens)
    return (now_s, 1, max(1, req.max_output_tokens - req.num_output_tokens))


def _mean(values: Sequence[float]) -> float:
    # fsum is exactly rounded, so the mean does not depend on the order the window's
    # requests finished in: fast-forward records a window's finishes replica by replica,
    # stepping in time order, and a plain sum differed between them in the last digit.
    return math.fsum(values) / len(values) if values else math.nan


def elastic_pools(setups: Sequence[Any], weight_bytes_by_pool: Mapping[str, float],
                  num_gpus_by_pool: Mapping[str, int]) -> list[ElasticPool]:
    """``ElasticPool``s of the run's pools."""
    return [ElasticPool(setup=s, weight_bytes=weight_bytes_by_pool[s.name],
                        num_gpus_per_replica=num_gpus_by_pool[s.name]) for s in setups]
