"""LoongServe's ablation (the artifact's Figure 12): ESP against fixed parallel layouts of the
same 8 GPUs, on the Zipf mixes, by SLO attainment.

From ``test/longserve/ae-plot-fig-10-11-12.py`` (``draw_fig_12``) and
``5-start-api-server.py``:

- variants: LoongServe (4 instances of TP 2, ESP); "w/o ESP (TP=2, SP=4)" (the same gang, a
  fixed degree of parallelism); "w/o ESP (TP=8)" (one TP 8 instance, 900,000 KV tokens);
  "w/o ESP (TP=2) x 4" (four TP 2 instances of 210,000 tokens behind a round-robin proxy);
  ``--max_num_ooe 64`` for the Zipf sets;
- SLO: a request attains it when its TTFT is at most ``max(25 x standalone, 15 s)``, the
  standalone time being the analytical model's prefill of its prompt alone on sp 4 x tp 2
  (``Profiler.predict_time_consumption_one_req``), and its TPOT at most 50 ms; the curve is
  the share of requests attaining it; a variant's max throughput is where it first falls
  below 90%, interpolated;
- the Zipf mixes at alpha 1.0, 1.2 and 1.4, swept up to the figure's x limits (1.5, 3.7 and
  11 req/s), two minutes of Poisson arrivals per rate here (CPU time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fleetsim.config import config_from_dict
from fleetsim.esp import AnalyticalModel, EspCostModel, fit_analytical
from fleetsim.hardware import get_gpu
from fleetsim.metrics.slo import attainment, crossing_rate
from fleetsim.models import get_model
from fleetsim.run import run
from fleetsim.workloads import Workload
from fleetsim.workloads.long_context import workload

ALPHAS = (1.0, 1.2, 1.4)
RATES: dict[float, tuple[float, ...]] = {1.0: (0.25, 0.5, 0.75, 1.0, 1.25, 1.5),
                                         1.2: (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.7),
                                         1.4: (2.0, 4.0, 6.0, 8.0, 10.0, 12.0)}
ARRIVALS_S, MIN_REQUESTS = 120.0, 60
TTFT_TOL, TTFT_FLOOR_S, TPOT_SLO_S, ATTAINMENT = 25.0, 15.0, 0.050, 0.90
MAX_OOE, MAX_RUNNING = 64, 1024
VARIANTS = ("loongserve", "no-esp tp2 sp4", "no-esp tp8", "no-esp tp2 x4")
# Figure 12 as the authors' notebook printed it (``test/longserve/6-data-analyse-evaluation.
# ipynb``, ``plot_ablation_slo_atta_with_rate``): alpha -> max req/s at 90% attainment, in
# VARIANTS order.
PUBLISHED: dict[float, tuple[float, float, float, float]] = {
    1.0: (1.122, 0.481, 0.405, 0.360), 1.2: (2.925, 1.478, 1.355, 1.289),
    1.4: (8.757, 5.447, 5.723, 5.000)}
CAPACITY = {2: 210_000, 8: 900_000}  # --max_total_token_num by TP (get_lightllm_params)
BATCH_MAX_TOKENS = 500_000  # --batch_max_tokens
COLUMNS = ("arrival_s", "first_token_s", "finish_s", "num_prompt_tokens", "num_output_tokens")


class Layouts:
    """The model and GPU of the layouts, and the scheduler's fitted predictor of the TP 2
    instance (the SLO's standalone time: the artifact's ``Profiler``)."""

    def __init__(self, model: str, gpu: str) -> None:
        self.model, self.gpu = model, gpu
        cost = EspCostModel(get_model(model), get_gpu(gpu), 2)
        self.fit: dict[int, AnalyticalModel] = {2: fit_analytical(cost, 4, CAPACITY[2])}


def group_config(model: str, gpu: str, tp: int, num_instances: int, *, elastic: bool,
                 max_running: int, max_out_of_order: int) -> dict[str, Any]:
    """A LoongServe layout as a fleetsim config: ``num_instances`` instances of ``tp`` GPUs
    planned by the ``esp`` group planner (``elastic`` False: one member of every instance,
    the fixed degree of "w/o ESP")."""
    return {
        "model": model,
        "hardware": {"gpu": gpu, "tp": tp, "num_replicas": num_instances},
        "engine": {"num_kv_blocks": CAPACITY[tp] // 16, "max_batched_tokens": BATCH_MAX_TOKENS,
                   "max_running": max_running, "enable_prefix_caching": False,
                   "swap_space_gib": 0.0},
        # a member prefills its whole batch in one iteration, then decodes (the code's
        # prefill and decode iterations)
        "policy": {"batching": {"name": "prefill_first"}},
        "group": {"planner": {"name": "esp", "args": {
            "elastic": elastic, "max_running": max_running,
            "max_out_of_order": max_out_of_order}}},
        "slo": {"ttft_s": 1e6, "tpot_s": 1e6},
        "seed": 0,
    }


def run_variant(variant: str, wl: Workload, layouts: Layouts) -> dict[str, Any]:
    """Serve ``wl`` on the variant's layout of the 8 GPUs; the requests' columns."""
    def serve(tp: int, instances: int, elastic: bool, part: Workload) -> Mapping[str, Any]:
        cfg = group_config(layouts.model, layouts.gpu, tp, instances, elastic=elastic,
                           max_running=MAX_RUNNING, max_out_of_order=MAX_OOE)
        return run(config_from_dict(cfg), workload=part).records.requests
    if variant == "loongserve":
        return {c: serve(2, 4, True, wl)[c] for c in COLUMNS}
    if variant == "no-esp tp2 sp4":
        return {c: serve(2, 4, False, wl)[c] for c in COLUMNS}
    if variant == "no-esp tp8":
        return {c: serve(8, 1, False, wl)[c] for c in COLUMNS}
    if variant == "no-esp tp2 x4":
        parts = [serve(2, 1, False, _every(wl, k, 4)) for k in range(4)]  # the proxy's round
        return {c: np.concatenate([p[c] for p in parts]) for c in COLUMNS}  # robin
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")


def _every(wl: Workload, start: int, step: int) -> Workload:
    return Workload(arrival_s=wl.arrival_s[start::step],
                    num_prompt_tokens=wl.num_prompt_tokens[start::step],
                    num_output_tokens=wl.num_output_tokens[start::step],
                    name=f"{wl.name} [{start}::{step}]")


def ablation_attainment(requests: Mapping[str, Any], fit: Any) -> float:
    """Share of requests within both SLOs (``get_both_slo_attainment``, per request), from
    their columns (``COLUMNS``): each request's TTFT target scales with its standalone
    prefill."""
    arrival, first, finish = (np.asarray(requests[c], dtype=np.float64)
                              for c in ("arrival_s", "first_token_s", "finish_s"))
    prompt = np.asarray(requests["num_prompt_tokens"], dtype=np.float64)
    out = np.asarray(requests["num_output_tokens"], dtype=np.float64)
    ttft_slo_s = np.array([max(TTFT_TOL * fit.predict_s(4, n, n * n), TTFT_FLOOR_S)
                           for n in prompt])
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_s = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    return attainment(first - arrival, tpot_s, ttft_slo_s, TPOT_SLO_S)


def ablation(layouts: Layouts, seed: int, progress: Any = None,
             alphas: Sequence[float] = ALPHAS) -> dict[float, dict[str, list[float]]]:
    """alpha -> variant -> attainment per rate of ``RATES[alpha]``, up to the first rate
    below 90% (where the variant's crossing is set: higher rates are not run, CPU time)."""
    out: dict[float, dict[str, list[float]]] = {}
    for alpha in alphas:
        out[alpha] = {v: [] for v in VARIANTS}
        for rate in RATES[alpha]:
            n = max(MIN_REQUESTS, round(rate * ARRIVALS_S))
            wl = workload(f"zipf{alpha:g}", n, rate, seed)
            for variant in VARIANTS:
                done = out[alpha][variant]
                if done and done[-1] < ATTAINMENT:
                    continue
                if progress is not None:
                    progress(f"{variant} zipf{alpha:g} @ {rate:g} req/s")
                out[alpha][variant].append(ablation_attainment(run_variant(variant, wl, layouts),
                                                      layouts.fit[2]))
    return out


def ablation_notes(curves: dict[float, dict[str, list[float]]]) -> list[str]:
    notes = []
    for alpha, by_variant in curves.items():
        rates = RATES[alpha]
        best = {v: crossing_rate(rates, a, ATTAINMENT, rising=False)
            for v, a in by_variant.items()}
        ls = best["loongserve"]
        parts = []
        for v, b in best.items():
            shown = ("< first rate" if b is None else
                     f">= {rates[-1]:g}" if b >= rates[-1] else f"{b:.2f}")
            ratio = ("" if v == "loongserve" or b is None or ls is None or b <= 0
                     else f" ({ls / b:.2f}x)")
            parts.append(f"{v} {shown}{ratio}")
        notes.append(f"ablation (Figure 12), zipf {alpha:g}: max req/s at 90% attainment of "
                     f"TTFT <= max(25 x standalone, 15 s) and TPOT <= 50 ms: "
                     + ", ".join(parts) + "; attainment per rate "
                     + "/".join(f"{r:g}" for r in rates) + ": " + "; ".join(
                         f"{v} " + "/".join([f"{x:.0%}" for x in a]
                                            + ["-"] * (len(rates) - len(a)))
                         for v, a in by_variant.items()))
        notes.append(_published_note(alpha, best, rates[-1]))
    return notes


def _published_note(alpha: float, best: Mapping[str, float | None], top: float) -> str:
    """fleetsim's crossings against the notebook's Figure 12 values, with relative errors,
    and the published ratios (LoongServe over each fixed layout)."""
    published = dict(zip(VARIANTS, PUBLISHED[alpha], strict=True))
    parts = []
    for v, pub in published.items():
        ours = best.get(v)
        shown = ("< first rate" if ours is None else
                 f">= {top:g}" if ours >= top else f"{ours:.2f}")
        err = "" if ours is None else f" ({ours / pub - 1:+.0%})"
        ratio = "" if v == "loongserve" else f", {published['loongserve'] / pub:.2f}x"
        parts.append(f"{v} {shown} vs {pub:g}{err}{ratio}")
    return (f"ablation (Figure 12), zipf {alpha:g}, fleetsim vs the authors' notebook "
            f"(6-data-analyse-evaluation.ipynb; published ratios after the comma): "
            + ", ".join(parts))

