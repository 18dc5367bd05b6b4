"""Helpers for comparisons of RL systems (the ``fleetsim repro`` entries of StreamRL, RLHFuse,
AReaL-TIK): run an ``[rl]`` config with the user's ``--set`` overrides and keep it in the
reproduction's context, and StreamRL's stage balancing."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from fleetsim.configutil import apply_overrides
from fleetsim.results import RequestRows, RunFiles
from fleetsim.rl.config import rl_config_from_dict
from fleetsim.rl.job import run_rl
from fleetsim.rl.results import RLResult


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
    ctx.keep(policy, load, result.summary, result.summary["config"],
             result.job.gen.recorder.records().requests)


def rl_files(data: Mapping[str, Any]) -> RunFiles:
    """Simulate the ``[rl]`` table ``data`` (overrides already applied) and keep what is
    written of it: a run that can go to a helper process (``run_kept_many``)."""
    result = run_rl(rl_config_from_dict(dict(data)))
    return RunFiles(result.summary, result.summary["config"],
                    RequestRows(result.job.gen.recorder.records().requests))


def run_kept_many(ctx: Any, runs: Sequence[tuple[str, str, Mapping[str, Any]]]
                  ) -> list[dict[str, Any]]:
    """``run_kept`` for each (policy, load, data) of ``runs``, spread over ``ctx.subruns``
    (they must be independent); kept in ``runs``' order. Returns their summaries."""
    datas = [with_overrides(data, ctx.overrides) for _, _, data in runs]
    for data in datas:
        rl_config_from_dict(copy.deepcopy(data))  # bad input fails here, before any run
    out = []
    for (policy, load, _), files in zip(runs, ctx.subruns.map(rl_files, datas), strict=True):
        if ctx.progress is not None:
            ctx.progress(f"{policy} @ {load}")
        ctx.runs[(policy, load)] = files
        out.append(files.summary)
    return out


def split_probes(data: Mapping[str, Any], total_gpus: int, candidates: Sequence[int],
                 overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The profiling runs of StreamRL's stage balancing, one per candidate split (x
    generation GPUs, training gets the rest): one synchronous, non-streamed step each."""
    probes = []
    for x in candidates:
        d = copy.deepcopy(dict(data))
        pools = d["pools"]
        pools[0]["num_gpus"], pools[1]["num_gpus"] = x, total_gpus - x
        d["num_steps"] = 1
        d["system"] = {**d.get("system", {}), "streaming": False, "staleness": 0}
        probes.append(with_overrides(d, overrides))
    return probes


def probe_summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """One probe's summary (``split_probes``), in a helper process or here."""
    return run_rl(rl_config_from_dict(dict(data))).summary


def pick_split(candidates: Sequence[int], summaries: Sequence[Mapping[str, Any]]
               ) -> tuple[int, dict[int, tuple[float, float]]]:
    """StreamRL's choice from the probes' summaries: the x minimising max(generation time,
    training time). Returns (x, {x: (generation s, training s)})."""
    profile: dict[int, tuple[float, float]] = {}
    for x, s in zip(candidates, summaries, strict=True):
        stages = s["steps"][0]["stages_s"]
        gen = stages.get("generation", 0.0)
        profile[x] = (gen, sum(v for k, v in stages.items()
                               if k not in ("generation", "weight_sync")))
    best = min(profile, key=lambda x: (max(profile[x]), x))
    return best, profile


def balance_split(data: Mapping[str, Any], total_gpus: int, candidates: Sequence[int],
                  overrides: Sequence[str] = ()) -> tuple[int, dict[int, tuple[float, float]]]:
    """StreamRL's stage balancing (Alg. 1, single datacenter): over the candidate numbers of
    generation GPUs x (training gets the rest), profile one step of each stage and pick the x
    minimising max(generation time, training time). The profile is fleetsim's own (one
    synchronous, non-streamed step per split). Returns (x, {x: (generation s, training s)})."""
    probes = split_probes(data, total_gpus, candidates, overrides)
    return pick_split(candidates, [probe_summary(d) for d in probes])
