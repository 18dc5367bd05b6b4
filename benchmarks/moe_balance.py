"""MoE balancing benchmark: the targets of the MoE issue, printed (never asserted).

1. Imbalance, throughput vs a force-balanced ideal, moved bytes and planning time for every
   balancer on the four load scenarios (64 GPUs in 8 nodes, 256 experts, 1 spare slot/GPU).
2. Planning time of the quota planner per layer: all layers at once and one layer alone.
3. ``rebalance_experts`` (numpy, vectorized over layers) against two references on
   DeepSeek-V3 shapes (58 layers, 256 experts): the pure-Python transcription used by the
   tests, and an "EPLB-structured" one that, like EPLB, vectorizes replication over rows but
   packs each row in a Python loop (EPLB itself does that loop over torch scalars, which
   are slower than the numpy scalars used here, so the speed-up against it is larger).

Run: ``.venv/bin/python benchmarks/moe_balance.py [--quick]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from fleetsim.errors import FleetsimInputError
from fleetsim.moe import (
    CompareSetup,
    LoadSpec,
    make_loads,
    plan_quotas,
    rebalance_experts,
    run_compare,
)
from fleetsim.moe.eplb import _rebalance_hierarchical
from fleetsim.moe.placement import packed_phy2log

ROOT = Path(__file__).resolve().parents[1]


def _reference_module():
    spec = importlib.util.spec_from_file_location("eplb_ref", ROOT / "tests/unit/test_moe_eplb.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["eplb_ref"] = module
    spec.loader.exec_module(module)
    return module


def eplb_structured(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """EPLB's own structure: replication vectorized over rows, packing in a Python loop."""
    import fleetsim.moe.eplb as eplb

    def loop_packing(w, num_packs):
        rows, n = w.shape
        per_pack = n // num_packs
        if per_pack == 1:
            return np.broadcast_to(np.arange(n), w.shape).copy(), np.zeros(w.shape, dtype=np.int64)
        order = np.argsort(-w, axis=1, kind="stable")
        pack_index = np.full(w.shape, -1)
        rank = np.full(w.shape, -1)
        for i in range(rows):
            weights, items = [0] * num_packs, [0] * num_packs
            for group in order[i]:
                pack = min(
                    (p for p in range(num_packs) if items[p] < per_pack), key=weights.__getitem__
                )
                pack_index[i, group] = pack
                rank[i, group] = items[pack]
                weights[pack] += w[i, group]
                items[pack] += 1
        return pack_index, rank

    original = eplb.balanced_packing
    eplb.balanced_packing = loop_packing
    try:
        w32 = np.asarray(weight, dtype=np.float32)
        if num_groups % num_nodes:
            num_groups = num_nodes = 1
        return _rebalance_hierarchical(w32, num_replicas, num_groups, num_nodes, num_gpus)
    finally:
        eplb.balanced_packing = original


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_compare(quick: bool) -> None:
    print("== balancers on 64 GPUs (8 nodes), 256 experts, 1 spare slot per GPU ==")
    print(
        f"{'scenario':8} {'balancer':14} {'max/mean':>8} {'worst':>6} {'vs ideal':>8} "
        f"{'MB moved':>9} {'plan ms':>8}"
    )
    for scenario in ("zipf", "drift", "rl", "decode"):
        setup = CompareSetup(
            scenario=scenario, num_microbatches=12 if quick else 24, num_layers=8 if quick else 16
        )
        for r in run_compare(setup, clock=time.perf_counter):
            print(
                f"{r.scenario:8} {r.balancer:14} {r.imbalance:8.3f} {r.worst_imbalance:6.2f} "
                f"{r.relative_throughput:8.1%} {r.moved_bytes_per_layer / 1e6:9.0f} "
                f"{r.plan_ms_per_layer:8.3f}"
            )
    print("  (MB moved and plan ms are per layer and microbatch; plan ms is wall time here)")


def bench_quota_time(quick: bool) -> None:
    print("\n== quota planner wall time, RL loads, 64 GPUs x (4 masters + 1 spare) ==")
    num_layers = 58
    spec = LoadSpec(
        num_microbatches=6 if quick else 12,
        num_layers=num_layers,
        num_experts=256,
        num_tokens=64 * 4096,
    )
    loads = make_loads("rl", spec, seed=0)
    phy2log = packed_phy2log(loads[0], 64, 5)
    batched, single = [], []
    for load in loads[1:]:
        start = time.perf_counter()
        new, _ = plan_quotas(load, phy2log, 64)
        batched.append((time.perf_counter() - start) / num_layers)
        for layer in range(0, num_layers, 4):
            start = time.perf_counter()
            plan_quotas(load[layer : layer + 1], phy2log[layer : layer + 1], 64)
            single.append(time.perf_counter() - start)
        phy2log = new
    print(
        f"  all {num_layers} layers in one call: "
        f"{np.median(batched) * 1e3:.3f} ms per layer (median)"
    )
    print(
        f"  one layer per call: median {np.median(single) * 1e3:.3f} ms, "
        f"p90 {np.percentile(single, 90) * 1e3:.3f} ms, max {np.max(single) * 1e3:.3f} ms"
    )


def bench_eplb(quick: bool) -> None:
    print("\n== rebalance_experts on DeepSeek-V3 shapes (58 layers, 256 experts) ==")
    ref = _reference_module()
    weight = np.random.default_rng(0).integers(0, 10_000, size=(58, 256))
    cases = [
        ("64 GPUs / 8 nodes / 320 slots, hierarchical (8 groups)", (320, 8, 8, 64)),
        ("64 GPUs / 320 slots, global", (320, 1, 8, 64)),
        ("32 GPUs / 4 nodes / 288 slots, hierarchical (DeepSeek prefill)", (288, 8, 4, 32)),
    ]
    repeats = 1 if quick else 3
    for label, args in cases:
        fast = best_of(lambda a=args: rebalance_experts(weight, *a), 5)
        loop = best_of(lambda a=args: eplb_structured(weight, *a), repeats)
        pure = best_of(lambda a=args: ref.ref_rebalance_experts(weight, *a), repeats)
        same = all(
            (x == y).all()
            for x, y in zip(
                rebalance_experts(weight, *args),
                ref.ref_rebalance_experts(weight, *args),
                strict=True,
            )
        )
        print(
            f"  {label}: numpy {fast * 1e3:.1f} ms; EPLB-structured {loop * 1e3:.1f} ms "
            f"({loop / fast:.1f}x); pure Python {pure * 1e3:.0f} ms ({pure / fast:.0f}x); "
            f"identical output: {same}"
        )
    try:
        rebalance_experts(weight, 288, 8, 8, 64)
    except FleetsimInputError as err:
        print(f"  64 GPUs with 288 slots is rejected: {err}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer microbatches and repeats")
    args = parser.parse_args()
    bench_compare(args.quick)
    bench_quota_time(args.quick)
    bench_eplb(args.quick)


if __name__ == "__main__":
    main()
