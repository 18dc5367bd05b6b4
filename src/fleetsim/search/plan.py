"""Capacity planning: goodput and cost of many cluster shapes, and their Pareto front.

A shape is a set of pools: mixed replicas of one GPU type (replicas x TP), or, for
prefill/decode disaggregation, a prefill pool and a decode pool (possibly of different GPU
types) in a ratio such as 1P2D. Each shape gets a coarse goodput search; to share work, a
shape's search starts from the goodput already found for a smaller shape of the same kind
scaled by its replica count, so most searches bracket in two or three runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fleetsim.config import PoolConfig, SimConfig
from fleetsim.errors import FleetsimInputError
from fleetsim.hardware import get_gpu
from fleetsim.models.speculative import SpeculativeConfig
from fleetsim.search.deploy import deployment_row, per_user_front, vllm_serve_commands
from fleetsim.search.goodput import (
    GoodputResult,
    base_rate_per_s,
    config_at_scale,
    goodput_search,
    goodput_to_dict,
    probe_config,
)

UNQUANTIZED = "bf16"
"""``Shape.quantization`` of the checkpoint's own 16-bit weights (``quantization = None``)."""

DEFAULT_PD_RATIOS = ((1, 1), (1, 2), (2, 1))
"""(prefill replicas, decode replicas) tried with ``--pd``."""


@dataclass(frozen=True, slots=True)
class Shape:
    """One cluster layout: its pools (a single mixed pool, or a prefill and a decode pool)."""

    pools: tuple[PoolConfig, ...]
    speculative: SpeculativeConfig | None = None
    """Speculative decoding of every replica (``engine.speculative``; None: off)."""
    quantization: str | None = None
    """Weight/activation mode of every replica, set per mode tried by ``search/quant_axis.py``:
    a ``quantization`` mode, ``bf16`` for none (the checkpoint's own dtype), or None to keep
    the config's own setting."""

    @property
    def name(self) -> str:
        """Short label, e.g. ``2x H100-SXM tp1``, ``1x H100-SXM tp8pp2``,
        ``1x H100-SXM dp16 tp1`` (wide EP), ``1P(H200 tp1)+2D(A100 tp1)``,
        ``1x H100-SXM tp4 fp8`` or ``1x H100-SXM tp1 eagle3 k3``."""
        spec = self.speculative
        tail = "" if self.quantization is None else f" {self.quantization}"
        tail += "" if spec is None else f" {spec.method} k{spec.num_speculative_tokens}"
        if len(self.pools) == 1:
            p = self.pools[0]
            return f"{p.num_replicas}x {p.gpu} {_layout(p)}{tail}"
        pre, dec = self.pools
        return (f"{pre.num_replicas}P({pre.gpu} {_layout(pre)})+"
                f"{dec.num_replicas}D({dec.gpu} {_layout(dec)}){tail}")

    @property
    def num_gpus(self) -> int:
        return sum(p.tp * p.pp * p.dp_attention * p.num_replicas for p in self.pools)

    @property
    def is_pd(self) -> bool:
        return len(self.pools) > 1

    def family(self) -> tuple[Any, ...]:
        """Shapes that differ only in replica counts (scaled versions of each other)."""
        if not self.is_pd:
            p = self.pools[0]
            return ("mixed", p.gpu, p.tp, p.pp, p.dp_attention, self.quantization,
                    self.speculative)
        pre, dec = self.pools
        return ("pd", pre.gpu, pre.tp, pre.pp, dec.gpu, dec.tp, dec.pp,
                pre.num_replicas / dec.num_replicas, self.quantization, self.speculative)

    def apply(self, config: SimConfig) -> SimConfig:
        """``config`` served by this shape (single mixed pools use the ``hardware`` shorthand)."""
        if self.speculative != config.engine.speculative:
            config = dataclasses.replace(config, engine=dataclasses.replace(
                config.engine, speculative=self.speculative))
        if self.quantization is not None:
            mode = None if self.quantization == UNQUANTIZED else self.quantization
            if mode != config.quantization:
                config = dataclasses.replace(config, quantization=mode)
        if not self.is_pd:
            p = self.pools[0]
            # the shape's dp_attention replaces the config's (1: off), so no layout is kept
            hw = dataclasses.replace(config.hardware, gpu=p.gpu, tp=p.tp, pp=p.pp,
                                     dp_attention=p.dp_attention, num_replicas=p.num_replicas)
            return dataclasses.replace(
                config, hardware=hw, cluster=dataclasses.replace(config.cluster, pools=()))
        return dataclasses.replace(
            config, cluster=dataclasses.replace(config.cluster, pools=self.pools))


def _layout(p: PoolConfig) -> str:
    dp = f"dp{p.dp_attention} " if p.dp_attention > 1 else ""
    return dp + f"tp{p.tp}" + (f"pp{p.pp}" if p.pp > 1 else "")


def _powers_of_two(limit: int) -> list[int]:
    out, n = [], 1
    while n <= limit:
        out.append(n)
        n *= 2
    return out


def enumerate_shapes(
    gpus: Sequence[str], tps: Sequence[int], max_gpus: int, *, pd: bool = False,
    pd_ratios: Iterable[tuple[int, int]] = DEFAULT_PD_RATIOS, catalog: str | None = None,
    pps: Sequence[int] = (1,),
    speculative: Sequence[SpeculativeConfig | None] = (None,),
    dp_attention: Sequence[int] = (1,),
) -> list[Shape]:
    """Mixed shapes (each GPU x TP x PP x power-of-two replicas within ``max_gpus``) and,
    with ``pd``, prefill/decode shapes for each ratio, each (prefill GPU, decode GPU) pair,
    TP and PP, scaled by powers of two while they fit ``max_gpus``; each once per
    ``speculative`` setting (the speculative on/off axis, pipeline shapes included: every
    stage verifies, the last drafts; docs/parallelism.md). GPU names are canonicalized.

    ``dp_attention`` (the wide-EP axis, ``search/dp_axis.py``): each value > 1 adds mixed
    shapes of replicas of that many attention ranks of ``tp`` GPUs (dp x tp GPUs a replica),
    with pp = 1 and no speculation, the two the wide-EP model does not price; 1 keeps the
    plain shapes (leave it out of the axis to search wide EP only)."""
    shapes = _layouts(gpus, tps, max_gpus, pd, pd_ratios, catalog, pps) if 1 in dp_attention \
        else []
    shapes += _wide_ep_layouts(gpus, tps, max_gpus, catalog, [d for d in dp_attention if d > 1])
    return [dataclasses.replace(shape, speculative=spec)
            for spec in speculative for shape in shapes
            if spec is None or all(p.dp_attention == 1 for p in shape.pools)]


def _wide_ep_layouts(gpus: Sequence[str], tps: Sequence[int], max_gpus: int,
                     catalog: str | None, dps: Sequence[int]) -> list[Shape]:
    names = list(dict.fromkeys(get_gpu(g, catalog).name for g in gpus))
    return [Shape((PoolConfig(name="mixed", gpu=gpu, tp=tp, dp_attention=dp, num_replicas=n),))
            for gpu in names for dp in dps for tp in tps
            for n in _powers_of_two(max_gpus // (dp * tp))]


def _layouts(gpus: Sequence[str], tps: Sequence[int], max_gpus: int, pd: bool,
             pd_ratios: Iterable[tuple[int, int]], catalog: str | None,
             pps: Sequence[int]) -> list[Shape]:
    names = [get_gpu(g, catalog).name for g in gpus]
    names = list(dict.fromkeys(names))
    shapes: list[Shape] = []
    for gpu in names:
        shapes.extend(Shape((PoolConfig(name="mixed", gpu=gpu, tp=tp, pp=pp, num_replicas=n),))
                      for tp in tps for pp in pps
                      for n in _powers_of_two(max_gpus // (tp * pp)))
    if not pd:
        return shapes
    for num_pre, num_dec in pd_ratios:
        for pre_gpu in names:
            for dec_gpu in names:
                for tp in tps:
                    for pp in pps:
                        shapes.extend(_pd_shapes(pre_gpu, dec_gpu, tp, pp, num_pre, num_dec,
                                                 max_gpus))
    return shapes


def _pd_shapes(pre_gpu: str, dec_gpu: str, tp: int, pp: int, num_pre: int, num_dec: int,
               max_gpus: int) -> list[Shape]:
    shapes: list[Shape] = []
    for k in _powers_of_two(max_gpus):
        pre = PoolConfig(name="prefill", gpu=pre_gpu, tp=tp, pp=pp, num_replicas=num_pre * k,
                         role="prefill")
        dec = PoolConfig(name="decode", gpu=dec_gpu, tp=tp, pp=pp, num_replicas=num_dec * k,
                         role="decode")
        shape = Shape((pre, dec))
        if shape.num_gpus > max_gpus:
            break
        shapes.append(shape)
    return shapes


@dataclass(frozen=True, slots=True)
class PlanPoint:
    """A shape's outcome: goodput and cost, or why it could not run."""

    shape: Shape
    goodput: GoodputResult | None
    infeasible: str | None = None
    """The one-line error ``run()`` gave (weights do not fit, for example)."""

    @property
    def goodput_rate_per_s(self) -> float | None:
        return None if self.goodput is None else self.goodput.goodput_rate_per_s

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.goodput is None else self.goodput.usd_per_hour


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, goodput) points no other point beats: nothing cheaper-or-equal
    has goodput higher-or-equal with one of the two strict. Sorted by cost.

    Points with goodput <= 0 are never on the front (serving nothing at any price).
    Among exact duplicates the first index is kept.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    front: list[int] = []
    best = 0.0
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def plan(
    config: SimConfig,
    shapes: Sequence[Shape],
    *,
    target: float = 0.9,
    rel_tol: float = 0.1,
    max_runs: int = 8,
    requests_per_gpu: int | None = None,
    on_point: Callable[[PlanPoint], None] | None = None,
) -> list[PlanPoint]:
    """Coarse goodput search for each shape, smallest first.

    A shape starts its search at the goodput of the best-known shape of its family (same
    GPUs and TP, same P:D ratio) times the replica-count ratio; the first shape of a family
    starts at the config's own rate. Shapes ``run()`` rejects come back ``infeasible``.

    ``requests_per_gpu`` cuts each shape's workload to that many requests per GPU (so every
    replica sees about the same history whatever the cluster size) when the config sets
    neither ``workload.max_requests`` nor ``workload.duration_s``.
    """
    if not shapes:
        raise FleetsimInputError("--gpus/--tp/--max-gpus", "no shape",
                                 "the shape space is empty: raise --max-gpus to at least "
                                 "the smallest --tp, or add GPUs")
    known: dict[tuple[Any, ...], tuple[int, float]] = {}  # family -> (num_gpus, goodput)
    points: list[PlanPoint] = []
    for shape in sorted(shapes, key=lambda s: (s.num_gpus, s.name)):
        start = None
        seen = known.get(shape.family())
        if seen is not None and seen[1] > 0:
            start = seen[1] * shape.num_gpus / seen[0]
        try:
            found = goodput_search(_cut(shape.apply(config), shape, requests_per_gpu),
                                   target=target, rel_tol=rel_tol, max_runs=max_runs,
                                   start_rate_per_s=start, growth=1.5 if start else 2.0,
                                   num_verify=0)
        except FleetsimInputError as err:
            point = PlanPoint(shape, None, str(err))
        else:
            point = PlanPoint(shape, found)
            if found.goodput_rate_per_s:
                known[shape.family()] = (shape.num_gpus, found.goodput_rate_per_s)
        points.append(point)
        if on_point is not None:
            on_point(point)
    return points


def verify_picks(config: SimConfig, points: Sequence[PlanPoint], result: dict[str, Any],
                 requests_per_gpu: int | None,
                 on_verified: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Check every shape on either front of ``result`` (``plan_to_dict``'s) at the goodput
    it reports, on the config's whole workload; adds ``verified`` to those rows (mutates).

    A goodput searched on ``requests_per_gpu`` requests per GPU is overstated when the queue
    has no time to build up in so short a slice (docs/search_and_plan.md: up to 1.9x on H100
    at 250 per GPU); one run at the reported rate on the uncut workload says whether the
    pick holds. Nothing runs when the searches were not cut (they already saw that workload).
    ``verified``: ``rate_per_s``, ``num_requests``, ``attainment``, ``met`` (attainment >=
    the target)."""
    if all(_cut(config, p.shape, requests_per_gpu) is config for p in points):
        return
    rows = result["points"]
    for i in sorted(set(result["front"]) | set(result["per_user_front"])):
        rate = rows[i].get("goodput_requests_per_s")
        if not rate:
            continue
        full = points[i].shape.apply(config)
        attainment, extra = probe_config(config_at_scale(full, rate / base_rate_per_s(full)))
        rows[i]["verified"] = {"rate_per_s": rate, "num_requests": extra["num_requests"],
                               "attainment": attainment,
                               "met": attainment >= result["target"]}
        if on_verified is not None:
            on_verified(rows[i])


def _cut(config: SimConfig, shape: Shape, requests_per_gpu: int | None) -> SimConfig:
    wl = config.workload
    if requests_per_gpu is None or wl.max_requests is not None or wl.duration_s is not None:
        return config
    return dataclasses.replace(config, workload=dataclasses.replace(
        wl, max_requests=requests_per_gpu * shape.num_gpus))


def plan_to_dict(points: Sequence[PlanPoint], *, target: float,
                 requests_per_gpu: int | None = None, config: SimConfig | None = None,
                 total_gpus: int | None = None,
                 target_rate_per_s: float | None = None) -> dict[str, Any]:
    """JSON-ready plan: every shape (feasible or not), the cost-vs-goodput Pareto front's
    indices, and AIConfigurator's view (``fleetsim.search.deploy``): tokens/s per GPU and per
    user at goodput, the front over those two, what ``total_gpus`` and ``target_rate_per_s``
    imply, and with ``config`` the ``vllm serve`` lines of each shape."""
    rows = []
    for p in points:
        row: dict[str, Any] = {
            "shape": p.shape.name,
            "num_gpus": p.shape.num_gpus,
            **({"quantization": p.shape.quantization} if p.shape.quantization else {}),
            "pools": [{"name": q.name, "gpu": q.gpu, "tp": q.tp,
                       **({"pp": q.pp} if q.pp > 1 else {}),
                       **({"dp_attention": q.dp_attention} if q.dp_attention > 1 else {}),
                       "num_replicas": q.num_replicas, "role": q.role} for q in p.shape.pools],
        }
        spec = p.shape.speculative
        if spec is not None:
            row["speculative"] = {"method": spec.method,
                                  "num_speculative_tokens": spec.num_speculative_tokens}
        if p.goodput is None:
            row["infeasible"] = p.infeasible
        else:
            g = goodput_to_dict(p.goodput)
            row.update({k: g[k] for k in (
                "goodput_requests_per_s", "usd_per_hour", "usd_per_million_tokens",
                "usd_per_million_output_tokens", "status", "monotone", "num_runs",
                "attainment_at_goodput")})
            row["usd_per_hour_per_request_per_s"] = (
                p.goodput.usd_per_hour / g["goodput_requests_per_s"]
                if g["goodput_requests_per_s"] else None)
            if g["goodput_requests_per_s"]:
                best = next(q for q in g["probes"]
                            if q["rate_per_s"] == g["goodput_requests_per_s"])
                row.update(deployment_row(row, best["output_tokens_per_request"],
                                          best.get("tpot_mean_s"), total_gpus,
                                          target_rate_per_s))
            if config is not None:
                row["vllm_serve"] = vllm_serve_commands(p.shape.apply(config), p.shape.pools)
        rows.append(row)
    feasible = [i for i, p in enumerate(points) if p.goodput is not None]
    front = pareto_front([(points[i].usd_per_hour or 0.0, points[i].goodput_rate_per_s or 0.0)
                          for i in feasible])
    served = [i for i, r in enumerate(rows) if r.get("tokens_per_s_per_user")]
    user_front = per_user_front([(rows[i]["tokens_per_s_per_user"],
                                  rows[i]["output_tokens_per_s_per_gpu"]) for i in served])
    return {
        "target": target,
        "requests_per_gpu": requests_per_gpu,
        "total_gpus": total_gpus,
        "target_rate_per_s": target_rate_per_s,
        "points": rows,
        "front": [feasible[i] for i in front],
        "per_user_front": [served[i] for i in user_front],
        "infeasible": [rows[i]["shape"] for i, p in enumerate(points) if p.goodput is None],
    }

