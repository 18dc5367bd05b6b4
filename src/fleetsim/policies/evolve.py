"""``evolve``: a deployment planner that evolves its own policy while the cluster serves, the
evolution plane of Autopoiesis (arXiv 2604.07144) with a built-in, seeded proposer.

A *policy* is a planner and a re-planning trigger from the registries with fixed arguments;
the *policy space* is the grid the arguments span (``EvolvePlanner``'s fields). One policy, the
incumbent, serves. At every monitoring point:

1. every policy of the space sees the window (its trigger is asked and its planner plans
   against the pools as they would be under its own deployment), so each holds the deployment
   it would run: a counterfactual that costs no simulation;
2. the search (a (1+lambda) evolution strategy: the incumbent and ``num_candidates`` of its
   neighbours, policies that differ in the planner or in the trigger, drawn by a seeded
   generator) replays, under ``score_on = "forecast"`` (the default), a forecast of the next
   window under the deployment each policy holds now (the one it would serve it with), or,
   under ``score_on = "window"``, the window just measured under the deployment each held
   while it passed (``serving/replay.py``; candidates holding the same deployment share a
   replay). Score: SLO attainment capped at ``target_attainment``; below it, the lower mean
   TTFT; then fewer GPU-seconds (``score``); a candidate must beat the incumbent's score to
   win;
3. the search costs ``replay_cost_s`` per replay (modelled: a simulator reads no clock); the
   winner is swapped in at the first monitoring point after the search ends, and the cluster
   moves to the deployment it holds (the elastic engine charges that reconfiguration as any
   plan's). While a search runs, and at a swap, no other starts.

The incumbent's own plan is what the cluster runs between swaps. Ask the planner at every
point (``trigger = "always"``): the policies carry their own triggers. With ``llm_url`` an
LLM writes one more candidate per search (``llm_proposer.py``): it joins the space once its
code loads and plans validly under the limits, and leaves it when it later fails.

Why a forecast: scored on the window just passed, a policy is judged by how its deployment
did on a load that is over; on a ramp the cheapest policy that kept up with the last window
wins, and it holds too few replicas for the next one (measured: docs/elastic.md, the P/D
swing). The forecast's rate is the highest of the last ``forecast_windows`` windows' rates
and of the linear trend through the last two (2 x last - previous, the one-step forecast of
ARIMA(0,2,0), as the ``sla`` planner's ``linear`` predictor): a ramp continues, and a dip
between two peaks does not make a smaller deployment look safe for ``forecast_windows``
windows. Its requests are the last window's (their lengths and burstiness), time-compressed
to that rate and repeated to fill one monitoring interval, after the backlog in flight now.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from fleetsim.inputs import limits_of
from fleetsim.registry import PolicySpec
from fleetsim.serving.contract import (
    Deployment,
    DeploymentPlanner,
    MonitorWindow,
    PoolState,
    ReplanTrigger,
)
from fleetsim.serving.replay import Arrival, ReplayOutcome

from .llm_proposer import PROMPT, LlmPlanner, PolicyRejected, ask, extract_code, window_context
from .planners import make_planner, make_trigger, register_planner


class Replayer(Protocol):
    def replay(self, deployment: Mapping[tuple[str, str], int], arrivals: Sequence[Arrival],
               start_s: float, end_s: float,
               carried: Sequence[Arrival] = ()) -> ReplayOutcome: ...


Part = tuple[str, tuple[tuple[str, Any], ...]]
"""A registry name and its arguments, as sorted (key, value) pairs."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A point of the policy space: a planner and a trigger with their arguments."""

    planner: Part
    trigger: Part

    @property
    def label(self) -> str:
        return f"{_label(self.planner)}+{_label(self.trigger)}"


def _label(part: Part) -> str:
    name, args = part
    return name + (f"({','.join(f'{k}={v}' for k, v in args)})" if args else "")


@register_planner("evolve")
@dataclass(slots=True)
class EvolvePlanner:
    """Evolves the serving policy by replaying each window (see the module docstring)."""

    sla_itl_s: tuple[float, ...] = (0.025, 0.05)
    """The space's ``sla`` planners: these ITL targets (seconds; its decode sizing uses them,
    its prefill sizing uses no target, so TTFT targets would repeat one policy) ..."""
    sla_predictors: tuple[str, ...] = ("constant", "linear")
    """... times these load predictors (``sla``'s ``predictor``)."""
    concurrency_targets: tuple[int, ...] = (16, 32, 64, 128)
    """The space's ``concurrency`` planners: these in-flight targets per replica."""
    periodic_every: tuple[int, ...] = (2, 4)
    """The space's triggers: ``always``, ``periodic`` with each of these ``every``, and
    ``threshold`` (its defaults) when ``threshold`` is true."""
    threshold: bool = True
    """Whether the ``threshold`` trigger is in the space."""
    num_candidates: int = 4
    """Neighbours of the incumbent replayed per monitoring point (lambda)."""
    replay_cost_s: float = 0.5
    """Modelled search time per replay (one sub-simulation of a window), seconds."""
    target_attainment: float = 0.99
    """Score: SLO attainment up to this counts, beyond it only GPU-seconds do."""
    seed: int = 0
    """Seed of the search's generator (the neighbours drawn)."""
    score_on: str = "forecast"
    """What candidates are replayed on: forecast (the next window as forecast, under the
    deployment each holds now) | window (the window just measured, under the deployment each
    held while it passed)."""
    forecast_windows: int = 3
    """The forecast's rate is the highest of the last this many windows' rates and the
    linear trend through the last two."""
    llm_url: str = ""
    """An OpenAI-compatible endpoint (``http://host:port/v1``) that writes one more candidate
    per search (``llm_proposer.py``); empty: the built-in proposer only."""
    llm_model: str = ""
    """The model the endpoint is asked for."""
    llm_timeout_s: float = 30.0
    """Time limit of one call to the endpoint, seconds."""
    llm_max_lines: int = 100_000
    """Budget of executed lines per call of LLM-written code (its time limit)."""
    _replayer: Replayer | None = field(default=None, repr=False)
    _space: list[Policy] = field(default_factory=list, repr=False)
    _live: dict[Policy, tuple[DeploymentPlanner, ReplanTrigger]] = field(
        default_factory=dict, repr=False)
    _held: dict[Policy, dict[tuple[str, str], int]] = field(default_factory=dict, repr=False)
    _rng: Any = field(default=None, repr=False)
    _incumbent: Policy | None = field(default=None, repr=False)
    _pending: tuple[float, Policy] | None = field(default=None, repr=False)  # (ready at, winner)
    _start_s: float = field(default=0.0, repr=False)
    _busy_until_s: float = field(default=-math.inf, repr=False)  # the running search's end
    timeline: list[dict[str, Any]] = field(default_factory=list, init=False)
    """One record per monitoring point and per swap (state, reported)."""
    search_overhead_s: float = field(default=0.0, init=False)
    """Modelled search time spent so far (state, reported)."""
    llm_warning: str = field(default="", init=False)
    """Why the LLM proposer is off, when its endpoint failed (state, reported)."""
    _replaced: dict[Policy, Policy] = field(default_factory=dict, repr=False)
    _num_written: int = field(default=0, repr=False)  # LLM-written policies so far
    _rates: list[float] = field(default_factory=list, repr=False)  # arrivals/s per window

    def __post_init__(self) -> None:
        if not (self.sla_itl_s and self.sla_predictors) and not self.concurrency_targets:
            raise ValueError(f"the policy space is empty (sla_itl_s={list(self.sla_itl_s)}, "
                             f"sla_predictors={list(self.sla_predictors)}, concurrency_targets="
                             f"{list(self.concurrency_targets)}): give sla_itl_s and "
                             f"sla_predictors, or concurrency_targets, at least one value")
        bad = [p for p in self.sla_predictors if p not in ("constant", "linear")]
        if bad or any(t <= 0 for t in self.sla_itl_s) or any(
                c < 1 for c in self.concurrency_targets) or any(k < 1 for k in
                                                                self.periodic_every):
            raise ValueError(f"sla_predictors must be constant|linear, sla_itl_s > 0, "
                             f"concurrency_targets and periodic_every >= 1, got "
                             f"{self.sla_predictors}, {self.sla_itl_s}, "
                             f"{self.concurrency_targets}, {self.periodic_every}")
        if self.score_on not in ("forecast", "window"):
            raise ValueError(f"score_on must be forecast or window, got {self.score_on!r}")
        if self.forecast_windows < 1:
            raise ValueError(f"forecast_windows must be >= 1, got {self.forecast_windows}")
        if self.num_candidates < 1:
            raise ValueError(f"num_candidates must be >= 1, got {self.num_candidates}")
        if not (math.isfinite(self.replay_cost_s) and self.replay_cost_s >= 0):
            raise ValueError(f"replay_cost_s must be >= 0 seconds, got {self.replay_cost_s}")
        if not (self.llm_timeout_s > 0 and self.llm_max_lines >= 1):
            raise ValueError(f"llm_timeout_s must be > 0 and llm_max_lines >= 1, got "
                             f"{self.llm_timeout_s}, {self.llm_max_lines}")
        if not 0 < self.target_attainment <= 1:
            raise ValueError(f"target_attainment must be in (0, 1], got "
                             f"{self.target_attainment}")
        if not 0 <= self.seed < 2**63:  # before numpy's own, less helpful, message
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        # The grid's values become the arguments of the planners and triggers it builds: held
        # to their bounds here, so that a bad one is named as this planner's argument.
        for name, values, arg in (("sla_itl_s", self.sla_itl_s, "itl_s"),
                                  ("concurrency_targets", self.concurrency_targets,
                                   "target_in_flight"),
                                  ("periodic_every", self.periodic_every, "every")):
            lo, hi = limits_of(arg)
            if any(not lo <= v <= hi for v in values):
                raise ValueError(f"{name} must be in [{lo:g}, {hi:g}] (the {arg} of the "
                                 f"policies it spans), got {list(values)}")
        self._space = self.space()
        self._rng = np.random.default_rng(self.seed)

    # ---- the policy space --------------------------------------------------------------
    def space(self) -> list[Policy]:
        """Every policy, in a fixed order (the first is the initial incumbent)."""
        planners: list[Part] = [("sla", (("itl_s", t), ("predictor", p)))
                                for t, p in itertools.product(self.sla_itl_s,
                                                              self.sla_predictors)]
        planners += [("concurrency", (("target_in_flight", c),))
                     for c in self.concurrency_targets]
        triggers: list[Part] = [("always", ())] + [("periodic", (("every", k),))
                                       for k in self.periodic_every]
        if self.threshold:
            triggers.append(("threshold", ()))
        return [Policy(p, t) for p, t in itertools.product(planners, triggers)]

    def bind(self, replayer: Replayer) -> None:
        """Give the planner the run's replayer (``run`` does, before the run)."""
        self._replayer = replayer

    # ---- DeploymentPlanner -------------------------------------------------------------
    def plan(self, pools: Sequence[PoolState], window: MonitorWindow,
             now_s: float) -> Deployment:
        if self._replayer is None:
            raise RuntimeError("EvolvePlanner.plan before bind(replayer)")
        if self._incumbent is None:
            self._start(pools)
            self._start_s = window.start_s
        assert self._incumbent is not None
        # What each policy held while the window passed (the incumbent's: what ran).
        was_held = {p: dict(d) for p, d in self._held.items()}
        self._rates.append(window.num_arrivals / window.interval_s)
        swapped = self._pending is not None and self._pending[0] <= now_s
        if swapped:
            assert self._pending is not None
            self._swap(self._pending[1], now_s)
        for policy in list(self._space):  # 1. every policy plans on its own deployment
            self._step(policy, pools, window, now_s)
        # 2. the search; not at a swap (the new incumbent has served no window yet).
        if (self._pending is None and not swapped and now_s >= self._busy_until_s
                and window.arrivals):
            self._search(was_held, pools, window, now_s)
        return dict(self._held[self._incumbent])

    def _start(self, pools: Sequence[PoolState]) -> None:
        live = {(p.name, role): n for p in pools for role, n in p.num_replicas_by_role.items()}
        for policy in self._space:
            self._live[policy] = (
                make_planner(PolicySpec(name=policy.planner[0], args=dict(policy.planner[1]))),
                make_trigger(PolicySpec(name=policy.trigger[0], args=dict(policy.trigger[1]))))
            self._held[policy] = dict(live)
        self._incumbent = self._space[0]

    def _step(self, policy: Policy, pools: Sequence[PoolState], window: MonitorWindow,
              now_s: float) -> None:
        planner, trigger = self._live[policy]
        if not trigger.should_replan(window):
            return
        try:
            proposed = self._propose_of(planner, policy, pools, window, now_s)
        except PolicyRejected as err:
            self._discard(policy, str(err), now_s)
            return
        held = self._held[policy]
        cap = {p.name: p.max_replicas for p in pools}
        for (name, role), n in proposed.items():
            held[(name, role)] = min(n, cap[name])

    def _propose_of(self, planner: DeploymentPlanner, policy: Policy,
                    pools: Sequence[PoolState], window: MonitorWindow,
                    now_s: float) -> Deployment:
        held = self._held[policy]
        # The pools as they would be under this policy's own deployment.
        own = [replace(p, num_replicas_by_role={r: n for (name, r), n in held.items()
                                                if name == p.name}) for p in pools]
        return planner.plan(own, window, now_s)

    def _search(self, was_held: dict[Policy, dict[tuple[str, str], int]],
                pools: Sequence[PoolState], window: MonitorWindow, now_s: float) -> None:
        assert self._replayer is not None and self._incumbent is not None
        inc = self._incumbent
        pool = self._neighbours(inc)
        picks = self._rng.choice(len(pool), size=min(self.num_candidates, len(pool)),
                                 replace=False) if pool else []
        candidates = [inc] + [pool[i] for i in sorted(picks)]
        written = self._ask_llm(was_held, pools, window, now_s) if self.llm_url else None
        if written is not None:
            candidates.append(written)
        if self.score_on == "window":
            held, target = was_held, (window.arrivals, window.start_s, window.end_s,
                                      window.carried)
            rate = self._rates[-1]
        else:
            rate = self.forecast_rate()
            held = self._held  # an LLM-written candidate holds the plan it made just now
            target = (forecast_arrivals(window, rate), window.end_s,
                      window.end_s + window.interval_s, window.backlog)
        scored = []
        by_deployment: dict[tuple[tuple[tuple[str, str], int], ...], ReplayOutcome] = {}
        for policy in candidates:
            # Candidates holding the same deployment share one replay (it is deterministic).
            key = tuple(sorted(held[policy].items()))
            if key not in by_deployment:
                by_deployment[key] = self._replayer.replay(held[policy], *target)
            scored.append((policy, by_deployment[key]))
        num_replays = len(by_deployment)
        search_s = num_replays * self.replay_cost_s
        self.search_overhead_s += search_s
        self._busy_until_s = now_s + search_s
        best_policy, best = scored[0]
        for policy, out in scored[1:]:
            if self._score(out) > self._score(best):
                best_policy, best = policy, out
        record: dict[str, Any] = {
            "time_s": now_s, "action": "search", "window": [window.start_s, window.end_s],
            "num_arrivals": window.num_arrivals, "incumbent": inc.label,
            "incumbent_deployment": _plain(held[inc]), "scored_on": self.score_on,
            "scored_window": [target[1], target[2]], "scored_rate_per_s": rate,
            "scores": [{"policy": p.label, **_outcome(o)} for p, o in scored],
            "winner": best_policy.label, "num_replays": num_replays,
            "search_s": search_s}
        self.timeline.append(record)
        if best_policy != inc:
            self._pending = (now_s + search_s, best_policy)

    def forecast_rate(self) -> float:
        """Arrivals per second the next window is scored at (the module docstring)."""
        rates = self._rates[-self.forecast_windows:]
        trend = [2 * rates[-1] - rates[-2]] if len(rates) >= 2 else []
        return max(rates + trend)

    def _neighbours(self, policy: Policy) -> list[Policy]:
        return [p for p in self._space if p != policy
                and (p.planner == policy.planner or p.trigger == policy.trigger)]

    def _score(self, out: ReplayOutcome) -> tuple[float, float, float]:
        return score(out.slo_attainment, out.mean_ttft_s, out.gpu_seconds,
                     self.target_attainment)

    def _swap(self, winner: Policy, now_s: float) -> None:
        assert self._incumbent is not None
        self.timeline.append({"time_s": now_s, "action": "swap", "from": self._incumbent.label,
                              "to": winner.label, "deployment": _plain(self._held[winner])})
        self._replaced[winner] = self._incumbent
        self._incumbent = winner
        self._pending = None

    # ---- the LLM proposer (llm_proposer.py) --------------------------------------------
    def _ask_llm(self, was_held: dict[Policy, dict[tuple[str, str], int]],
                 pools: Sequence[PoolState], window: MonitorWindow,
                 now_s: float) -> Policy | None:
        """One LLM-written policy, validated on this window (its plan, then the search's
        replay), or None: rejected code is recorded with its reason; an endpoint that fails
        turns the proposer off with one warning."""
        assert self._incumbent is not None
        prompt = (PROMPT.replace("{ttft_s}", str(getattr(self._replayer, "slo_ttft_s", 1.0)))
                  .replace("{tpot_s}", str(getattr(self._replayer, "slo_tpot_s", 0.05)))
                  .replace("{context}", window_context(window))
                  .replace("{incumbent}", self._incumbent.label))
        try:
            text = ask(self.llm_url, self.llm_model, prompt, self.llm_timeout_s)
        except (OSError, ValueError) as err:
            self.llm_warning = (f"elastic.planner.args.llm_url: {self.llm_url!r} failed "
                                f"({err}); evolving with the built-in proposer only")
            warnings.warn(self.llm_warning, stacklevel=2)
            self.llm_url = ""
            return None
        self._num_written += 1
        policy = Policy(("llm", (("n", self._num_written),)), ("always", ()))
        record: dict[str, Any] = {"time_s": now_s, "action": "llm", "policy": policy.label}
        try:
            planner = LlmPlanner(extract_code(text), self.llm_max_lines)
            self._live[policy] = (planner, make_trigger(PolicySpec(name="always")))
            self._held[policy] = dict(was_held[self._incumbent])
            plan = self._propose_of(planner, policy, pools, window, now_s)
        except PolicyRejected as err:
            self._live.pop(policy, None)
            self._held.pop(policy, None)
            self.timeline.append({**record, "status": "rejected", "reason": str(err)})
            return None
        cap = {p.name: p.max_replicas for p in pools}
        held = self._held[policy]
        for (name, role), n in plan.items():
            held[(name, role)] = min(n, cap[name])
        # Scored on this window with the plan it makes from it (it held nothing before).
        was_held[policy] = dict(held)
        self._space.append(policy)
        self.timeline.append({**record, "status": "accepted", "code": planner.code})
        return policy

    def _discard(self, policy: Policy, reason: str, now_s: float) -> None:
        """An LLM-written policy that failed later leaves the space; if it served, the policy
        it replaced serves again."""
        self._space.remove(policy)
        self.timeline.append({"time_s": now_s, "action": "llm", "policy": policy.label,
                              "status": "discarded", "reason": reason})
        if self._pending is not None and self._pending[1] == policy:
            self._pending = None
        if self._incumbent == policy:
            self._swap(self._replaced[policy], now_s)

    def report(self) -> dict[str, Any]:
        """The ``evolution`` section of the summary's ``elastic`` one."""
        searches = [t for t in self.timeline if t["action"] == "search"]
        swaps = [t for t in self.timeline if t["action"] == "swap"]
        first = swaps[0]["from"] if swaps else (
            self._incumbent.label if self._incumbent else self._space[0].label)
        serving = [{"policy": first, "from_s": self._start_s}]
        serving += [{"policy": t["to"], "from_s": t["time_s"]} for t in swaps]
        return {"evolution": {
            "serving": serving,
            "incumbent": self._incumbent.label if self._incumbent else self._space[0].label,
            "space_size": len(self._space),
            "num_searches": len(searches),
            "num_replays": sum(t["num_replays"] for t in searches),
            "num_swaps": len(swaps),
            "search_overhead_s": self.search_overhead_s,
            "search_overhead_kind": "modelled (replay_cost_s per replay)",
            "llm_warning": self.llm_warning,
            "timeline": self.timeline}}


def score(slo_attainment: float, mean_ttft_s: float, gpu_seconds: float,
          target_attainment: float) -> tuple[float, float, float]:
    """A replay's score, higher is better: SLO attainment up to the target; below it, equal
    attainment is broken by the lower mean TTFT (cost must not decide between deployments
    that all miss: after an overloaded window every candidate may replay at 0, and the
    cheapest would win, measured on the P/D swing); then fewer GPU-seconds."""
    capped = min(slo_attainment, target_attainment)
    late = 0.0 if capped >= target_attainment or math.isnan(mean_ttft_s) else mean_ttft_s
    return (capped, -late, -gpu_seconds)


def forecast_arrivals(window: MonitorWindow, rate_per_s: float) -> tuple[Arrival, ...]:
    """The next window ``[end_s, end_s + interval_s)`` at ``rate_per_s``: the window's
    arrivals, their offsets compressed by (its rate / ``rate_per_s``), repeated until the
    interval is full (a rate below the window's stretches them, and the interval cuts)."""
    if not window.arrivals or rate_per_s <= 0:
        return ()
    interval = window.interval_s
    scale = (len(window.arrivals) / interval) / rate_per_s
    span = interval * scale  # one compressed copy of the window
    out: list[Arrival] = []
    for copy in range(math.ceil(1 / scale - 1e-9)):
        for at_s, prompt, output in window.arrivals:
            t = window.end_s + copy * span + (at_s - window.start_s) * scale
            if t < window.end_s + interval:
                out.append((t, prompt, output))
    return tuple(out)


def _plain(deployment: Mapping[tuple[str, str], int]) -> dict[str, int]:
    return {f"{p}/{r}": n for (p, r), n in sorted(deployment.items())}


def _outcome(out: ReplayOutcome) -> dict[str, float]:
    return {"slo_attainment": out.slo_attainment, "mean_ttft_s": out.mean_ttft_s,
            "gpu_seconds": out.gpu_seconds}
