"""ReqX SLO scale (HexAGenT): the smallest s such that X% of requests finish within s times
their standalone latency (alone on an idle replica, see ``fleetsim.serving.standalone``).

s = 1 means the cluster adds nothing over serving each request alone; Req90 = 3 means one
request in ten takes over three times its standalone latency. Requests that never finish
count as taking forever, so Req99 is infinite when more than 1% are left unfinished.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from fleetsim.config import PoolConfig, SimConfig
from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.models.quantization import quantize
from fleetsim.perf import StepTimeModel
from fleetsim.run import pool_step_model
from fleetsim.serving.standalone import standalone_latency_s

DEFAULT_PCTS = (90.0, 95.0, 99.0)


def req_slo_scale(latency_s: NDArray[np.float64], standalone_s: NDArray[np.float64],
                  pct: float, num_unfinished: int = 0) -> float:
    """Smallest s with at least ``pct``% of requests at latency <= s x standalone.

    ``latency_s`` and ``standalone_s`` pair up per finished request; ``num_unfinished``
    more requests count as infinitely slow. Returns ``inf`` when the percentile falls on
    them and ``nan`` when there is no request at all.
    """
    if not 0.0 < pct <= 100.0:
        raise ValueError(f"pct must be in (0, 100], got {pct}")
    latency_s = np.asarray(latency_s, dtype=np.float64)
    standalone_s = np.asarray(standalone_s, dtype=np.float64)
    if latency_s.shape != standalone_s.shape:
        raise ValueError("latency_s and standalone_s must have one entry per request each")
    if np.any(standalone_s <= 0):
        raise ValueError("standalone latencies must be > 0 seconds")
    ratios = np.sort(latency_s / standalone_s)
    n = ratios.size + num_unfinished
    if n == 0:
        return float("nan")
    # The k-th smallest ratio with k = ceil(pct% of n): the smallest s covering pct% (the
    # inverted-CDF percentile, never interpolated). The epsilon absorbs float noise in pct*n.
    k = max(int(np.ceil(pct / 100.0 * n - 1e-9)), 1)
    return float(ratios[k - 1]) if k <= ratios.size else float("inf")


def _step_model(config: SimConfig, pool: PoolConfig) -> StepTimeModel:
    model = get_model(config.model)
    gpu = get_gpu(pool.gpu, config.hardware.catalog)
    return pool_step_model(config, model, gpu, pool.tp, pool.pp)


def _pool_of_replica(replica_ids: NDArray[np.int64],
                     pools: tuple[PoolConfig, ...]) -> NDArray[np.int64]:
    """Index into ``pools`` of each replica id; ``run()`` numbers replicas pool after pool."""
    bounds = np.cumsum([p.num_replicas for p in pools])
    return np.minimum(np.searchsorted(bounds, replica_ids, side="right"), len(pools) - 1)


def idle_transfer_s(config: SimConfig, prefill: PoolConfig, decode: PoolConfig,
                    num_prompt_tokens: NDArray[np.int64]) -> NDArray[np.float64]:
    """KV handoff time over an idle link: latency + bytes / the slower end's bandwidth.

    The records' ``kv_transfer_s`` is not used: it also holds the wait for KV space on the
    decode replica and for a busy link, which is queueing, not standalone latency.
    """
    link = config.cluster.link
    # the cache as served: an FP8 cache moves half the bytes
    model = quantize(get_model(config.model), config.quantization, config.engine.kv_cache_dtype)

    def bw(pool: PoolConfig) -> float:
        gpu = get_gpu(pool.gpu, config.hardware.catalog)
        per_gpu = link.bw_bytes_per_s or (
            gpu.nvlink_bw_bytes_per_s if link.placement == "intra_node"
            else gpu.network_bw_bytes_per_s)
        return per_gpu * pool.tp * pool.pp

    num_bytes = float(model.kv_bytes_per_token()) * num_prompt_tokens
    return link.latency_s + num_bytes / min(bw(prefill), bw(decode))


def standalone_for_run(config: SimConfig, requests: dict[str, NDArray]) -> NDArray[np.float64]:
    """Standalone latency (s) of each finished request of a run of ``config``.

    Each request is measured against the pools that served it (``prefill_replica_id`` for
    prefill, ``replica_id`` for decode; the same replica on mixed pools): prefill on the
    prefill pool's step model, decode on the decode pool's, plus the KV handoff over an
    idle link when the two differ (see ``idle_transfer_s``).
    """
    pools = config.pools
    prompt = requests["num_prompt_tokens"].astype(np.int64)
    output = requests["num_output_tokens"].astype(np.int64)
    budget = config.engine.max_batched_tokens
    dec_ids = _pool_of_replica(requests["replica_id"].astype(np.int64), pools)
    pre_col = requests.get("prefill_replica_id", requests["replica_id"])
    pre_ids = _pool_of_replica(pre_col.astype(np.int64), pools)
    out = np.empty(prompt.size, dtype=np.float64)
    models: dict[int, StepTimeModel] = {}
    for i, j in sorted({(int(a), int(b)) for a, b in zip(pre_ids, dec_ids, strict=True)}):
        mask = (pre_ids == i) & (dec_ids == j)
        for k in (i, j):
            if k not in models:
                models[k] = _step_model(config, pools[k])
        transfer = None if i == j else idle_transfer_s(config, pools[i], pools[j], prompt[mask])
        out[mask] = standalone_latency_s(models[i], prompt[mask], output[mask], budget,
                                         decode_step_model=models[j], transfer_s=transfer)
    return out


def slo_scales(config: SimConfig, pcts: tuple[float, ...] = DEFAULT_PCTS) -> dict[str, Any]:
    """Run ``config`` and report its ReqX SLO scales (keys ``req90`` ...) as a dict: over
    requests, or over programs when ``config.programs`` is set."""
    from fleetsim.run import run

    if config.programs is not None:
        return program_slo_scales(config, pcts)
    result = run(config)
    req = result.records.requests
    latency = req["finish_s"] - req["arrival_s"]
    standalone = standalone_for_run(config, req)
    num_unfinished = int(result.summary["num_unfinished"])
    ratio = latency / standalone
    scales = {}
    for pct in pcts:
        s = req_slo_scale(latency, standalone, pct, num_unfinished)
        scales[f"req{pct:g}"] = s if np.isfinite(s) else None
    return {
        "slo_scale": scales,
        "num_requests": int(result.summary["num_requests"]),
        "num_finished": int(latency.size),
        "num_unfinished": num_unfinished,
        "ratio_min": float(ratio.min()) if ratio.size else None,
        "ratio_mean": float(ratio.mean()) if ratio.size else None,
        "standalone_e2e_p50_s": float(np.median(standalone)) if standalone.size else None,
        "e2e_p50_s": float(np.median(latency)) if latency.size else None,
        "model": result.summary.get("model"),
        "workload": result.summary.get("workload"),
        "pools": [{"name": p.name, "gpu": p.gpu, "tp": p.tp, "num_replicas": p.num_replicas,
                   "role": p.role} for p in config.pools],
    }


# ---- programs (HexAGenT: a program meets its SLO at scale s when JCT <= s x T_w) ---------
DEADLINE_ARG = "slo_scale"
"""A batching policy with this parameter (``workflow_llf``) schedules against deadlines of
s x its horizon: its ReqX is searched over s, one simulation per s (HexAGenT's method)."""


def _program_scale(config: SimConfig, pct: float) -> float:
    from fleetsim.programs.metrics import slo_scale
    from fleetsim.run import run

    rows = run(config).programs
    assert rows is not None
    done = ~np.isnan(rows["finish_s"])
    return slo_scale(rows["jct_s"][done], rows["standalone_s"][done], pct,
                     int((~done).sum()))


def deadline_slo_scale(config: SimConfig, pct: float, *, hi: float = 64.0,
                       rel_tol: float = 0.02) -> float:
    """ReqX of a deadline-driven policy: the smallest s such that, run with deadline scale s,
    X% of programs finish within s x T_w (geometric bisection on [1, ``hi``]; inf if even
    ``hi`` misses)."""
    import dataclasses

    from fleetsim.registry import PolicySpec

    def met(s: float) -> bool:
        spec = config.policy.batching
        batching = PolicySpec(name=spec.name, args={**spec.args, DEADLINE_ARG: s})
        cfg = dataclasses.replace(config, policy=dataclasses.replace(config.policy,
                                                                    batching=batching))
        return _program_scale(cfg, pct) <= s

    if not met(hi):
        return float("inf")
    lo = 1.0
    if met(lo):
        return lo
    while hi / lo > 1.0 + rel_tol:
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if met(mid) else (mid, hi)
    return hi


def program_slo_scales(config: SimConfig, pcts: tuple[float, ...] = DEFAULT_PCTS
                       ) -> dict[str, Any]:
    """ReqX over programs (keys ``req90`` ...), with the run's program figures; a policy that
    takes a deadline scale (``slo_scale``) is searched over it per percentile."""
    from fleetsim.policies import make_batch_policy
    from fleetsim.run import run

    result = run(config)
    summary = result.summary
    prog = summary["programs"]
    rows = result.programs
    assert rows is not None
    done = ~np.isnan(rows["finish_s"])
    searched = hasattr(make_batch_policy(config.policy.batching), DEADLINE_ARG)
    scales: dict[str, float | None] = {}
    for pct in pcts:
        if searched:
            s = deadline_slo_scale(config, pct)
        else:
            from fleetsim.programs.metrics import slo_scale
            s = slo_scale(rows["jct_s"][done], rows["standalone_s"][done], pct,
                          prog["num_unfinished"])
        scales[f"req{pct:g}"] = s if np.isfinite(s) else None
    ratio = rows["jct_s"][done] / rows["standalone_s"][done]
    return {
        "slo_scale": scales,
        "over": "programs",
        "deadline_searched": searched,
        "num_requests": prog["num_programs"],
        "num_finished": prog["num_finished"],
        "num_unfinished": prog["num_unfinished"],
        "ratio_min": float(ratio.min()) if ratio.size else None,
        "ratio_mean": float(ratio.mean()) if ratio.size else None,
        "standalone_e2e_p50_s": prog["standalone_s"]["p50"],
        "e2e_p50_s": prog["jct_s"]["p50"],
        "model": summary.get("model"),
        "workload": summary.get("workload"),
        "pools": [{"name": p.name, "gpu": p.gpu, "tp": p.tp, "num_replicas": p.num_replicas,
                   "role": p.role} for p in config.pools],
    }
