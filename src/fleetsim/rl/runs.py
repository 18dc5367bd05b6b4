"""Helpers for comparisons of RL systems (the ``fleetsim repro`` entries of StreamRL, RLHFuse,
AReaL-TIK): run an ``[rl]`` config with the user's ``--set`` overrides and keep it in the
reproduction's context, and StreamRL's stage balancing."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetsim.configutil import apply_overrides
from fleetsim.rl.config import rl_config_from_dict
from fleetsim.rl.job import run_rl
from fleetsim.rl.results import RLResult


@dataclass(frozen=True, slots=True)
class _Records:
    requests: dict[str, Any]


@dataclass(frozen=True, slots=True, eq=False)
class RunFiles:
    """What a reproduction writes per run (``summary.json``, ``config.json`` and the
    rollouts' ``requests.csv``), shaped as a serving ``RunResult``."""

    summary: dict[str, Any]
    config: dict[str, Any]
    records: _Records


def with_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    apply_overrides(out, overrides, lambda key: key.removeprefix("rl."))
    return out


def run_kept(ctx: Any, policy: str, load: str, data: Mapping[str, Any]) -> RLResult:
    """Simulate ``data`` (an ``[rl]`` table) with ``ctx``'s overrides; keep it in ``ctx``."""
    if ctx.progress is not None:
        ctx.progress(f"{policy} @ {load}")
    result = run_rl(rl_config_from_dict(with_overrides(data, ctx.overrides)))
    keep(ctx, policy, load, result)
    return result


def keep(ctx: Any, policy: str, load: str, result: RLResult) -> None:
    """Keep ``result`` in ``ctx`` as the run of (``policy``, ``load``)."""
    requests = result.job.gen.recorder.records().requests
    ctx.runs[(policy, load)] = RunFiles(result.summary, result.summary["config"],
                                        _Records(requests))


def balance_split(data: Mapping[str, Any], total_gpus: int, candidates: Sequence[int],
                  overrides: Sequence[str] = ()) -> tuple[int, dict[int, tuple[float, float]]]:
    """StreamRL's stage balancing (Alg. 1, single datacenter): over the candidate numbers of
    generation GPUs x (training gets the rest), profile one step of each stage and pick the x
    minimising max(generation time, training time). The profile is fleetsim's own (one
    synchronous, non-streamed step per split). Returns (x, {x: (generation s, training s)})."""
    profile: dict[int, tuple[float, float]] = {}
    for x in candidates:
        d = copy.deepcopy(dict(data))
        pools = d["pools"]
        pools[0]["num_gpus"], pools[1]["num_gpus"] = x, total_gpus - x
        d["num_steps"] = 1
        d["system"] = {**d.get("system", {}), "streaming": False, "staleness": 0}
        s = run_rl(rl_config_from_dict(with_overrides(d, overrides))).summary
        stages = s["steps"][0]["stages_s"]
        gen = stages.get("generation", 0.0)
        profile[x] = (gen, sum(v for k, v in stages.items()
                               if k not in ("generation", "weight_sync")))
    best = min(profile, key=lambda x: (max(profile[x]), x))
    return best, profile
