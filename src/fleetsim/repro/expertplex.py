"""ExpertPlex: prefill and decode share one pool of expert (MoE) servers while attention is
disaggregated per phase; adaptive persistent kernels (APK) switch the pool's SMs between the
phases' expert work at GEMM tile boundaries. Against PD colocation and instance-level PD
disaggregation, by goodput (the highest request rate at which 90% of requests meet both the
TTFT and the TPOT SLO).

What we know of the paper (arXiv 2607.18002 v2) is its abstract and a third-party summary of
it; the paper's text was not found by our search. Taken from it [paper]: the mechanism,
the tile latency model x_moe = sum_{e: m_e>0} ceil(m_e/M_t), the SM re-allocation
q' = min(Q_max, ceil_c(q * x_moe / x*_moe)), APK's measured cost (decode +8%, prefill 1.12x vs
exclusive runs), the metric and the headlines (goodput 2.01x vs instance-level PD, 1.66x vs
colocation). Our choices (the summary names MiniMax-M2.7 / GLM-5.1, which fleetsim's catalog
lacks):
- Qwen3-235B-A22B (catalog; 128 experts, top-8, 94 layers) in bf16 on HGX H200 nodes (8 GPUs
  on NVLink, 50 GB/s network per GPU), 32 GPUs for every system (--quick: 16);
- step times from fleetsim's measured H200 tables (dense part per GPU: ``perf``; expert GEMMs:
  the larger of the tiles' compute, slope fitted on the MoE table, ``moe/tile_model.py``, and
  the HBM reads of each GPU's active experts, plus the GEMM launch; all-to-alls:
  ``moe/step_model.all_to_all_s``), the same for all three systems (``moe/expertplex.py``),
  run on fleetsim's engine: ExpertPlex's pool is a shared resource whose SMs the two
  attention groups' steps draw on as jobs (``serving/shared_steps.py``);
- M_t = 64 (Hopper's wgmma instruction computes 64-row tiles), 132 SMs (H200 datasheet),
  clusters of c = 2 SMs, Q_max = 7/8 of the SMs; decode's reference allocation: x*_moe the
  tiles of its largest batch, q the fewest SMs with which that step meets 90% of the TPOT SLO;
- vLLM-style continuous batching, 2,048 prompt tokens per GPU per step, at most 128 decoding
  requests per GPU; instances of 8 GPUs (a full bf16 copy of the model fits with room for KV);
  KV in what the weights leave of 90% of HBM (attention GPUs of ExpertPlex: no experts);
- ShareGPT rows (``embedded:sharegpt_lengths``, vLLM's benchmark filter: prompt <= 1,024,
  prompt + output <= 2,048), Poisson arrivals; SLOs TTFT <= 2 s and TPOT <= 100 ms, 90% of
  requests meeting both (the paper's SLO values are not in what we could read);
- every system gets its best split of the budget (PD: prefill vs decode instances; ExpertPlex:
  pool size and attention GPUs per phase), found by the same rate sweep;
- attribution: ``expertplex-static-sm``, ExpertPlex's best split with decode keeping its
  reference share of the pool's SMs (the SM re-allocation removed; the shared pool, one copy
  of the experts, stays).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.expert_pool import Limits, simulate
from fleetsim.hardware import get_gpu
from fleetsim.metrics.slo import attainment, crossing_rate
from fleetsim.models import get_model
from fleetsim.moe.expertplex import CostModel, SystemLayout, sm_policy
from fleetsim.repro.frame import (
    Comparison,
    Loads,
    Metric,
    Paper,
    ReproContext,
    Reproduction,
    add,
    better_ratio,
    is_bound,
    setup_from,
)
from fleetsim.workloads.loaders import read_column

SYSTEMS = ("expertplex", "pd_instance", "pd_colocated")
ABLATION = "expertplex-static-sm"
"""ExpertPlex at its best split with the SM re-allocation removed: decode keeps its reference
share of the pool's SMs whatever batch it runs (``SmPolicy.adaptive``)."""
PAPER_VS = {"pd_instance": 2.01, "pd_colocated": 1.66}
# Up to 10 req/s per GPU: with the expert cost's weight-read term the baselines' knee moved
# past the earlier grid's top (6), where their goodput was only a lower bound.
RATES_PER_GPU = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
QUICK_RATES_PER_GPU = (1.0, 2.0, 4.0, 6.0, 10.0)
Runs = list[tuple[float, dict[str, Any]]]
"""A layout's sweep: (SLO attainment, summary) per rate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertPlexSetup:
    """What ``--set key=value`` may change (defaults: the module docstring's setting)."""

    model: str = "qwen3-235b"
    """A catalog MoE model (``fleetsim models``)."""
    gpu_budget: int = 32
    instance_gpus: int = 8
    pool_sizes: tuple[int, ...] = (4, 8, 16)
    attention_step: int = 8
    """ExpertPlex's prefill attention GPUs are tried in steps of this many."""
    duration_s: float = 30.0
    """Seconds of Poisson arrivals per run (the requests: rate x duration)."""
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.1
    target: float = 0.9
    tile_m: int = 64
    sm_cluster: int = 2
    token_budget_per_gpu: int = 2048
    max_decode_per_gpu: int = 128
    nvlink_domain: int = 8
    overlap: bool = False
    """ExpertPlex's attention groups overlap their attention with their expert work
    (micro-batch ping-pong; not in what we could read of the paper): a step takes
    max(attention, experts) instead of their sum. The baselines are unchanged."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("gpu_budget", "instance_gpus", "attention_step", "tile_m",
                     "sm_cluster", "token_budget_per_gpu", "max_decode_per_gpu",
                     "nvlink_domain"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise FleetsimInputError(name, value, "must be an integer >= 1")
        if self.gpu_budget % self.instance_gpus or self.gpu_budget < 2 * self.instance_gpus:
            raise FleetsimInputError("gpu_budget", self.gpu_budget,
                                     f"must be a multiple of instance_gpus "
                                     f"({self.instance_gpus}), at least two instances")
        if not self.pool_sizes or any(isinstance(p, bool) or not isinstance(p, int) or p < 1
                                      for p in self.pool_sizes):
            raise FleetsimInputError("pool_sizes", self.pool_sizes,
                                     "give pool sizes in GPUs, e.g. [4, 8]")
        for name in ("ttft_slo_s", "tpot_slo_s", "duration_s"):
            if not getattr(self, name) > 0:
                raise FleetsimInputError(name, getattr(self, name), "must be > 0 seconds")
        if not 0 < self.target <= 1:
            raise FleetsimInputError("target", self.target, "must be in (0, 1]")
        if self.token_budget_per_gpu < 1024:
            raise FleetsimInputError("token_budget_per_gpu", self.token_budget_per_gpu,
                                     "must be >= 1024 (the longest ShareGPT prompt kept)")


QUICK = {"gpu_budget": 16, "duration_s": 10.0, "pool_sizes": [8], "attention_step": 4}
HBM_USE = 0.9
"""Share of HBM weights may take (the rest: activations; KV on attention GPUs is extra)."""


def layouts(setup: ExpertPlexSetup, cost: CostModel) -> dict[str, list[SystemLayout]]:
    """Every system's candidate splits of the same GPU budget."""
    n_inst = setup.gpu_budget // setup.instance_gpus
    hbm = cost.gpu.hbm_bytes * HBM_USE
    model_bytes = cost.model.num_params * cost.model.weight_dtype_bytes
    if model_bytes > hbm * setup.instance_gpus:
        raise FleetsimInputError("instance_gpus", setup.instance_gpus,
                                 f"{model_bytes / 1e9:.0f} GB of weights do not fit; use more")
    expert_bytes = cost.spec.expert_bytes * cost.spec.num_experts * cost.layers
    out: dict[str, list[SystemLayout]] = {
        "pd_colocated": [SystemLayout(kind="colocated",
                                      prefill_gpus=(setup.instance_gpus,) * n_inst)],
        "pd_instance": [SystemLayout(kind="pd", prefill_gpus=(setup.instance_gpus,) * p,
                                     decode_gpus=(setup.instance_gpus,) * (n_inst - p))
                        for p in range(1, n_inst)],
        "expertplex": []}
    bad = [p for p in setup.pool_sizes if cost.spec.num_experts % p]
    if bad:
        raise FleetsimInputError("pool_sizes", list(setup.pool_sizes),
                                 f"pool sizes must divide the {cost.spec.num_experts} experts")
    for pool in setup.pool_sizes:
        if expert_bytes > hbm * pool:
            continue  # the shared pool must hold one full copy of the experts
        attn = setup.gpu_budget - pool
        for a_p in range(setup.attention_step, attn, setup.attention_step):
            out["expertplex"].append(SystemLayout(kind="expertplex", prefill_gpus=(a_p,),
                                                  decode_gpus=(attn - a_p,), pool=pool))
    if not out["expertplex"]:
        raise FleetsimInputError("pool_sizes", setup.pool_sizes,
                                 f"no pool holds the {expert_bytes / 1e9:.0f} GB of experts "
                                 f"within the budget; use larger pools")
    return out


def workload(setup: ExpertPlexSetup, num_requests: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit-rate Poisson arrival times, prompts, outputs): the same requests for every system,
    arrivals divided by the rate (a lower rate runs a prefix of the same sequence)."""
    prompts = read_column("embedded:sharegpt_lengths", "num_prefill_tokens")
    outputs = read_column("embedded:sharegpt_lengths", "num_decode_tokens")
    keep = (prompts <= 1024) & (prompts + outputs <= 2048) & (prompts >= 1) & (outputs >= 1)
    prompts, outputs = prompts[keep], outputs[keep]
    rng = np.random.default_rng(setup.seed)
    rows = rng.integers(0, len(prompts), size=num_requests)
    gaps = rng.exponential(1.0, size=num_requests)
    return np.cumsum(gaps), prompts[rows], outputs[rows]


class _Sweep:
    def __init__(self, setup: ExpertPlexSetup, cost: CostModel, rates: tuple[float, ...]):
        self.setup, self.cost, self.rates = setup, cost, rates
        most = int(np.ceil(max(rates) * setup.gpu_budget * setup.duration_s))
        self.unit, self.prompts, self.outputs = workload(setup, most)
        # A decoding request's mean context: its prompt plus half its output.
        self.mean_context = float(np.mean(self.prompts + self.outputs / 2))
        self.limits = Limits(token_budget_per_gpu=setup.token_budget_per_gpu,
                             max_decode_per_gpu=setup.max_decode_per_gpu)

    def scores(self, layout: SystemLayout, *, adaptive: bool = True
               ) -> Runs:
        """(SLO attainment, summary) per rate; after two failing rates the sweep stops (NaN:
        not run, nothing claimed). ``adaptive=False``: ExpertPlex without its SM
        re-allocation."""
        out: Runs = []
        setup = self.setup
        policy = sm_policy(self.cost, layout, self.mean_context,
                           max_decode_per_gpu=setup.max_decode_per_gpu,
                           tpot_slo_s=setup.tpot_slo_s, sm_cluster=setup.sm_cluster,
                           adaptive=adaptive)
        fails = 0
        for rate in self.rates:
            if fails >= 2:
                out.append((float("nan"), {"skipped": "two lower rates already missed the "
                                                      "SLO target"}))
                continue
            total = rate * self.setup.gpu_budget
            n = max(1, int(np.ceil(total * self.setup.duration_s)))
            arrivals = self.unit[:n] / total
            res = simulate(layout, self.cost, self.limits, policy, arrivals, self.prompts[:n],
                           self.outputs[:n], overlap=self.setup.overlap)
            score = attainment(res.ttft, res.tpot, self.setup.ttft_slo_s,
                               self.setup.tpot_slo_s)
            fails += score < self.setup.target
            out.append((score, {
                "slo_attainment": score, "requests": n, "rate_req_s": total,
                "ttft_p50_s": float(np.nanpercentile(res.ttft, 50)),
                "ttft_p90_s": float(np.nanpercentile(res.ttft, 90)),
                "tpot_p50_s": float(np.nanpercentile(res.tpot, 50)),
                "tpot_p90_s": float(np.nanpercentile(res.tpot, 90)),
                **{f"busy_share_{pool}": share
                   for pool, share in res.busy_share_by_pool.items()}}))
        return out


_SWEEPS: dict[str, _Sweep] = {}
"""The last sweep this process built (``_sweep_for``), by its setup and rates."""


def _sweep_for(setup: ExpertPlexSetup, rates: tuple[float, ...]) -> _Sweep:
    """The sweep of ``setup`` over ``rates``, built once per process: the entry and each
    helper process running its layouts share one cost model, whose memos (exact: pure
    functions of their keys) then carry from one layout to the next."""
    key = repr((setup, rates))
    sweep = _SWEEPS.get(key)
    if sweep is None:
        model = get_model(setup.model)
        if not model.is_moe:
            raise FleetsimInputError("model", setup.model,
                                     "must be an MoE model (fleetsim models)")
        cost = CostModel(model, get_gpu("H200"), setup.tile_m,
                         nvlink_domain=setup.nvlink_domain)
        _SWEEPS.clear()
        sweep = _SWEEPS[key] = _Sweep(setup, cost, rates)
    return sweep


def layout_scores(item: tuple[ExpertPlexSetup, tuple[float, ...], SystemLayout, bool]
                  ) -> Runs:
    """One layout's rate sweep, ``(setup, rates, layout, adaptive)``: a whole set of
    simulations of its own, so the layouts spread over the free cores
    (``ReproContext.subruns``)."""
    setup, rates, layout, adaptive = item
    return _sweep_for(setup, rates).scores(layout, adaptive=adaptive)


def compare(ctx: ReproContext) -> Comparison:
    setup = setup_from(ctx, ExpertPlexSetup, QUICK, "expertplex")
    rates = QUICK_RATES_PER_GPU if ctx.quick else RATES_PER_GPU
    cost = _sweep_for(setup, rates).cost
    results: dict[str, dict[str, float | None]] = {}
    headline: dict[str, float | None] = {}
    notes: list[str] = []

    def record(system: str, layout: SystemLayout, gp: float,
               runs: Runs) -> None:
        headline[system] = gp * setup.gpu_budget
        results[system] = {}
        for rate, (score, summary) in zip(rates, runs, strict=True):
            label = f"{rate:g}"
            results[system][label] = None if np.isnan(score) else score
            ctx.keep(
                system, label, {"layout": layout.label, **summary},
                {"system": system, "rate_req_s_per_gpu": rate,
                 "prefill_gpus": list(layout.prefill_gpus),
                 "decode_gpus": list(layout.decode_gpus), "pool": layout.pool,
                 **asdict(setup)})

    def goodput(runs: Runs) -> float:
        """The highest rate meeting the target (0 when even the lowest misses)."""
        return crossing_rate(rates, [score for score, _ in runs], setup.target,
                             rising=False) or 0.0

    # Every system's candidate splits at once (independent sweeps, in helper processes when
    # cores are free); the ablation after them, on ExpertPlex's best split.
    candidates_by_system = layouts(setup, cost)
    items = [(setup, rates, layout, True)
             for candidates in candidates_by_system.values() for layout in candidates]
    all_runs = iter(ctx.subruns.map(layout_scores, items))
    best_layouts: dict[str, SystemLayout] = {}
    for system, candidates in candidates_by_system.items():
        best: tuple[float, SystemLayout, Runs] | None = None
        tried = []
        for layout in candidates:
            if ctx.progress is not None:
                ctx.progress(f"{system} {layout.label}")
            runs = next(all_runs)
            gp = goodput(runs)
            tried.append(f"{layout.label} {gp:.2f}")
            if best is None or gp > best[0]:
                best = (gp, layout, runs)
        assert best is not None
        gp, layout, runs = best
        best_layouts[system] = layout
        record(system, layout, gp, runs)
        top = " (at least: the sweep's top rate met the SLOs)" if gp >= rates[-1] else ""
        notes.append(f"{system}: best split {layout.label} ({layout.total_gpus} GPUs), goodput "
                     f"{gp * setup.gpu_budget:.1f} req/s{top}; req/s per GPU of every split "
                     f"tried: {'; '.join(tried)}")
        if system == "expertplex":
            notes.append(_busy_note(rates, runs, setup.target))
    # Attribution: ExpertPlex's best split again, its SM re-allocation removed.
    layout = best_layouts["expertplex"]
    if ctx.progress is not None:
        ctx.progress(f"{ABLATION} {layout.label}")
    runs = layout_scores((setup, rates, layout, False))
    gp = goodput(runs)
    record(ABLATION, layout, gp, runs)
    notes.append(f"{ABLATION} (expertplex's best split {layout.label}, decode keeping its "
                 f"reference share of the pool's SMs): goodput {gp * setup.gpu_budget:.1f} "
                 f"req/s")
    attribution = {ABLATION: better_ratio(headline[ABLATION], headline["pd_instance"],
                                          "higher")}
    ratio = better_ratio(headline["expertplex"], headline["pd_instance"], "higher")
    for base, paper in PAPER_VS.items():
        r = better_ratio(headline["expertplex"], headline[base], "higher")
        notes.insert(0, f"goodput expertplex / {base}: "
                        f"{'n/a' if r is None else f'{r:.2f}x'} (paper {paper:.2f}x)")
    for pool in setup.pool_sizes:
        lat = cost.tile_latency(pool)
        notes.append(f"tile model on a pool of {pool}: {lat.fixed_s * 1e6:.0f} us + "
                     f"{lat.per_tile_s * 1e6:.2f} us per tile, largest error on the measured "
                     f"table's calibration points {lat.fit_error:.1%}")
    top_goodput = rates[-1] * setup.gpu_budget  # goodput at the top rate is "at least"
    return Comparison(results=results, ratio=ratio, headline=headline, notes=notes,
                      attribution=attribution,
                      ratio_is_bound=is_bound(top_goodput, headline["expertplex"],
                                              headline["pd_instance"]))


def _busy_note(rates: tuple[float, ...], runs: Runs,
               target: float) -> str:
    """What binds ExpertPlex's best split: its attention groups' busy shares at the first rate
    that misses the SLO target (a group busy all the time is the bottleneck)."""
    for rate, (score, summary) in zip(rates, runs, strict=True):
        if not np.isnan(score) and score < target:
            return (f"expertplex's best split at {rate:g} req/s per GPU (the first rate "
                    f"missing the target, attainment {score:.0%}): attention busy "
                    f"{summary['busy_share_prefill']:.0%} of the run in its prefill group, "
                    f"{summary['busy_share_decode']:.0%} in its decode group")
    return "expertplex's best split met the target at every rate swept"


EXPERTPLEX = add(Reproduction(
    key="expertplex",
    paper=Paper(title="ExpertPlex: MoE serving with prefill and decode sharing one expert pool "
                      "through adaptive persistent kernels", id="arXiv:2607.18002"),
    claim="Goodput up to 2.01x over instance-level PD disaggregation and 1.66x over PD "
          "colocation; APK costs decode +8% and prefill 1.12x vs exclusive runs.",
    setup="Qwen3-235B-A22B bf16 on HGX H200 (8 GPUs per NVLink node), 32 GPUs per system "
          "(--quick: 16); ShareGPT rows, Poisson arrivals, 0.5-10 req/s per GPU (--quick: "
          "1-10); SLOs TTFT 2 s and TPOT 100 ms for 90% of requests; each system at its "
          "best split of the budget",
    system="expertplex",
    baselines=("pd_instance", "pd_colocated", ABLATION),
    baseline="pd_instance",
    metric=Metric(name="SLO attainment", unit="fraction", direction="higher"),
    ratio_definition="expertplex / pd_instance goodput (req/s at 90% SLO attainment)",
    paper_ratio=None,
    paper_ratio_source="not recoverable: only a summary of the paper could be read "
                       "(a secondary summary), giving its best goodput ratios, not the "
                       "panel of this model, GPU and rate range",
    paper_best=2.01,
    loads=Loads(name="request rate", unit="req/s per GPU", values=RATES_PER_GPU,
                quick_values=QUICK_RATES_PER_GPU),
    compare=compare,
    headline_metric=Metric(name="goodput", unit="req/s", direction="higher"),
))
