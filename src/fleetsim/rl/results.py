"""What an RL job reports: per-step stage times, throughput, GPU utilisation per pool, bubble
time (the summary), the per-stage timeline rows, and a Gantt chart of some steps."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fleetsim.configutil import to_plain

TIMELINE_COLUMNS = ("step", "stage", "pool", "lane", "start_s", "end_s", "num_gpus")
STAGE_ORDER = ("weight_sync", "generation", "fusion_wait", "old_logprob", "reference",
               "reward", "critic_values", "critic_train", "actor_train", "actor_critic_train")
"""The stages that take a share of the step time (they add up to it). Rows of stage
``overlapped_inference`` (RLHFuse's passes on GPUs freed during the generation tail) overlap
generation and are reported apart (``overlapped_inference_s``)."""


@dataclass(frozen=True, slots=True, eq=False)
class RLResult:
    """The job (its rows and per-sample records) and its summary."""

    job: Any
    summary: dict[str, Any]

    @property
    def rows(self) -> list[Any]:
        return self.job.rows


def _span(rows: list[Any]) -> float:
    return max(r.end_s for r in rows) - min(r.start_s for r in rows) if rows else 0.0


def summarize(job: Any) -> dict[str, Any]:
    cfg = job.cfg
    rows = job.rows
    n = cfg.num_steps
    ends = job.step_end_s
    makespan = max([*ends, *(r.end_s for r in rows)])
    by_step: list[dict[str, Any]] = []
    for k in range(n):
        mine = [r for r in rows if r.step == k]
        stages: dict[str, float] = {}
        for stage in STAGE_ORDER:
            part = [r for r in mine if r.stage == stage]
            if part:
                # Generation runs on many replicas at once: its span; other stages: their sum.
                stages[stage] = _span(part) if stage == "generation" else sum(
                    r.end_s - r.start_s for r in part)
        start = min((r.start_s for r in mine), default=0.0)
        overlapped = sum(r.end_s - r.start_s for r in mine if r.stage == "overlapped_inference")
        by_step.append({"step": k, "start_s": start, "end_s": ends[k],
                        "time_s": ends[k] - (ends[k - 1] if k else start), "stages_s": stages,
                        "overlapped_inference_s": overlapped})
    samples = cfg.num_samples_per_step
    tokens = sum(int((s.batch.prompt_tokens + s.batch.response_tokens).sum()) for s in job.steps)
    response = sum(int(s.batch.response_tokens.sum()) for s in job.steps)
    steady = (samples * (n - 1) / (ends[-1] - ends[0])) if n >= 2 else samples * n / ends[-1]
    pools: dict[str, Any] = {}
    for p in cfg.pools:
        busy = sum((r.end_s - r.start_s) * r.num_gpus for r in rows
                   if r.pool == p.name and r.stage != "generation")
        if "generation" in p.stages:
            busy += job.source.busy_gpu_s()
        pools[p.name] = {"gpu": job.gpus[p.name].name, "num_gpus": p.num_gpus,
                         "stages": list(p.stages), "busy_gpu_s": busy,
                         "utilization": busy / (p.num_gpus * makespan) if makespan else 0.0}
    tail_idle = 0.0
    for k in range(n):
        gen = [r for r in rows if r.step == k and r.stage == "generation"]
        if gen:
            last = max(r.end_s for r in gen)
            tail_idle += sum((last - r.end_s) * r.num_gpus for r in gen)
            # lanes that generated nothing this step idled through all of it
            tail_idle += (job.source.num_lane_gpus - sum(r.num_gpus for r in gen)) * _span(gen)
    stage_mean = {}
    for stage in STAGE_ORDER:
        vals = [s["stages_s"][stage] for s in by_step if stage in s["stages_s"]]
        if vals:
            stage_mean[stage] = float(np.mean(vals))
    return {
        "system": cfg.system.name,
        "placement": "colocated" if cfg.colocated else "disaggregated",
        "algorithm": cfg.algorithm,
        "actor": job.actor.name,
        "num_steps": n,
        "samples_per_step": samples,
        "makespan_s": makespan,
        "mean_step_time_s": float(np.mean([s["time_s"] for s in by_step])),
        "stage_time_s": stage_mean,
        "samples_per_s": samples * n / makespan,
        "steady_samples_per_s": steady,
        "tokens_per_s": tokens / makespan,
        "response_tokens_per_s": response / makespan,
        "pools": pools,
        "bubble": {
            "pipeline_s": job.bubble_s,
            "pipeline_gpu_s": job.bubble_gpu_s,
            "generation_tail_idle_gpu_s": tail_idle,
        },
        "fusion": {
            "tail_migrations": job.migrations,
            "fused_training_searches": job.fused.searches if job.fused is not None else [],
        },
        "generation": job.source.report(
            response / (samples * n),
            int(max(s.batch.response_tokens.max() for s in job.steps))),
        "steps": by_step,
        "config": to_plain(cfg),
    }


def write_timeline_csv(path: Path, rows: list[Any]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TIMELINE_COLUMNS)
        for r in sorted(rows, key=lambda r: (r.start_s, r.lane)):
            w.writerow([r.step, r.stage, r.pool, r.lane, f"{r.start_s:.6f}", f"{r.end_s:.6f}",
                        r.num_gpus])


COLORS = {"weight_sync": "#7f7f7f", "generation": "#1f77b4", "old_logprob": "#ff7f0e",
          "reference": "#2ca02c", "reward": "#9467bd", "critic_values": "#8c564b",
          "critic_train": "#e377c2", "actor_train": "#d62728"}


def gantt(path: Path, job: Any, num_steps: int = 2) -> None:
    """Stages as coloured bars, GPU groups on the y axis (generation replicas one lane each;
    a bar of a whole pool spans its lanes), for the first ``num_steps`` steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = job.cfg
    steps = set(range(min(num_steps, cfg.num_steps)))
    lanes: dict[str, list[int]] = {}  # lane name -> y rows it covers
    y = 0
    pool_rows: dict[str, list[int]] = {}
    # the agentic source's workers (a resource manager's split) may outnumber the replicas
    num_lanes = len({r.lane for r in job.rows if r.stage == "generation"} | {
        f"gen-{r}" for r in range(job.gen.num_replicas)})
    for p in cfg.pools:
        ys = []
        if "generation" in p.stages:
            for r in range(num_lanes):
                lanes[f"gen-{r}"] = [y]
                ys.append(y)
                y += 1
        if set(p.stages) - {"generation"} and not ys:
            ys.append(y)
            y += 1
        pool_rows[p.name] = ys
        lanes[p.name] = ys
    labels = [""] * y
    for name, ys in lanes.items():
        if len(ys) == 1 and not labels[ys[0]]:
            labels[ys[0]] = name
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.18 * y + 1.5)), dpi=110)
    seen: set[str] = set()
    for r in job.rows:
        if r.step not in steps or r.end_s <= r.start_s:
            continue
        ys = lanes.get(r.lane, pool_rows.get(r.pool, []))
        if not ys:
            continue
        lo, hi = min(ys), max(ys)
        ax.barh(lo - 0.4 + (hi - lo + 0.8) / 2, r.end_s - r.start_s, left=r.start_s,
                height=hi - lo + 0.8, color=COLORS.get(r.stage, "#17becf"),
                edgecolor="none", label=r.stage if r.stage not in seen else None, alpha=0.9)
        seen.add(r.stage)
    step_word = "step" if len(steps) == 1 else "steps"
    ax.set_yticks(range(y))
    ax.set_yticklabels(labels, fontsize=6 if y > 16 else 8)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_title(f"{cfg.system.name}: {job.actor.name}, {cfg.num_prompts_per_step}x"
                 f"{cfg.samples_per_prompt} samples, first {len(steps)} {step_word}", fontsize=9)
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def samples_table(job: Any) -> dict[str, np.ndarray]:
    """Every sample of every step: generated, scored and trained counts and versions."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in (
        "step", "generated", "scored", "trained", "gen_version", "trained_at_step",
        "finish_s")}
    for k, s in enumerate(job.steps):
        n = s.batch.num_samples
        cols["step"].append(np.full(n, k))
        cols["generated"].append(s.num_generated)
        cols["scored"].append(s.num_scored)
        cols["trained"].append(s.num_trained)
        cols["gen_version"].append(np.full(n, s.version))
        cols["trained_at_step"].append(s.trained_version)
        cols["finish_s"].append(s.finish_s)
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}


def is_finite_summary(summary: dict[str, Any]) -> bool:
    return all(math.isfinite(v) for v in (summary["makespan_s"], summary["samples_per_s"]))
