"""MoE balancing benchmark: the targets of the MoE issue, printed (never asserted).

1. Imbalance, throughput vs a force-balanced ideal, copied bytes (intra / inter node) and
   planning time for every balancer, with what it plans from, on the five load scenarios
   (64 GPUs in 8 nodes, 256 experts, 1 spare slot/GPU).
2. The quota planner's masters under slow drift: fixed, or re-placed every 16 microbatches.
3. Planning time of the real-time planners per layer: all layers in one call and one layer
   per call; the first call of a run and a batch start separately.
4. ``rebalance_experts`` (numpy, vectorized over layers) against two references on
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
    BalanceView,
    CompareSetup,
    LoadSpec,
    make_balancer,
    make_loads,
    plan_quotas,
    rebalance_experts,
    run_compare,
)
from fleetsim.moe.eplb import _rebalance_hierarchical
from fleetsim.moe.loads import RL_SWITCH_EVERY
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
        f"{'scenario':9} {'balancer':20} {'sees':32} {'max/mean':>8} {'worst':>6} "
        f"{'vs ideal':>8} {'intra MB':>8} {'inter MB':>8} {'prefetch':>10} {'plan ms':>8}"
    )
    for scenario in ("zipf", "drift", "rl", "rl_switch", "decode"):
        num_microbatches = 60 if scenario == "rl_switch" else 32
        setup = CompareSetup(
            scenario=scenario,
            num_microbatches=num_microbatches // 2 if quick else num_microbatches,
            num_layers=8 if quick else 16,
        )
        rows = run_compare(setup, clock=time.perf_counter)
        for r in rows:
            sees = r.sees.replace(" (oracle)", "") + (" [1 group/node]" if r.note else "")
            print(
                f"{r.scenario:9} {r.balancer:20} {sees:32} {r.imbalance:8.3f} "
                f"{r.worst_imbalance:6.2f} {r.relative_throughput:8.1%} "
                f"{r.intra_bytes_per_layer / 1e6:8.0f} {r.inter_bytes_per_layer / 1e6:8.0f} "
                f"{r.prefetchable[:10]:>10} {r.plan_ms_per_layer:8.3f}"
            )
        by_name = {r.balancer: r for r in rows}
        oracle, quota = by_name["eplb"], by_name["quota"]
        print(
            f"  {scenario}: eplb (exact load) copies "
            f"{oracle.moved_bytes_per_layer / quota.moved_bytes_per_layer:.1f}x the bytes of quota"
        )
        if scenario == "rl_switch":
            switch = set(range(RL_SWITCH_EVERY, setup.num_microbatches, RL_SWITCH_EVERY))
            for name in ("eplb_stale k=1", "quota_stale k=1"):
                per_mb = by_name[name].imbalance_by_microbatch
                on = [per_mb[t] for t in sorted(switch)]
                off = [x for t, x in enumerate(per_mb) if t and t not in switch]
                print(
                    f"  rl_switch {name}: mean {np.mean(off):.3f} between switches (max "
                    f"{max(off):.3f}), {np.mean(on):.3f} on the {len(on)} switch steps"
                )
    print("  (MB and plan ms are per layer and microbatch; plan ms is wall time here)")


def bench_remaster(quick: bool) -> None:
    print("\n== quota masters under slow drift: fixed, or re-placed from the last 16 loads ==")
    setup = CompareSetup(
        scenario="drift", num_microbatches=100 if quick else 400, num_layers=8 if quick else 16
    )
    balancers = (
        ("fixed masters", "quota", {}),
        ("2 swaps every 16", "quota", {"remaster_every": 16, "max_master_swaps": 2}),
        ("4 swaps every 8", "quota", {"remaster_every": 8, "max_master_swaps": 4}),
    )
    for r in run_compare(setup, balancers=balancers):
        late = r.imbalance_by_microbatch[len(r.imbalance_by_microbatch) // 2 :]
        print(
            f"  {r.balancer:22} max/mean {r.imbalance:.4f}, worst layer {r.worst_imbalance:.4f}, "
            f"second half {np.mean(late):.4f}; copies intra {r.intra_bytes_per_layer / 1e6:.0f} "
            f"+ inter {r.inter_bytes_per_layer / 1e6:.0f} MB per layer and microbatch"
        )


def _median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def bench_quota_time(quick: bool) -> None:
    print("\n== real-time planners' wall time, RL loads, 64 GPUs x (4 masters + 1 spare) ==")
    num_layers = 58
    spec = LoadSpec(
        num_microbatches=6 if quick else 12,
        num_layers=num_layers,
        num_experts=256,
        num_tokens=64 * 4096,
    )
    loads = make_loads("rl", spec, seed=0)
    phy2log = packed_phy2log(loads[0], 64, 5)
    plan_quotas(loads[0], phy2log, 64)  # warm-up: first-call costs are reported below
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
        f"  quota, all {num_layers} layers in one call: "
        f"{np.median(batched) * 1e3:.3f} ms per layer (median)"
    )
    print(
        f"  quota, one layer per call: median {np.median(single) * 1e3:.3f} ms, "
        f"p90 {np.percentile(single, 90) * 1e3:.3f} ms, max {np.max(single) * 1e3:.3f} ms"
    )
    repeats = 3 if quick else 7
    batch = loads.sum(0)
    for name in ("quota", "two_timescale"):
        for layers in (num_layers, 1):
            def view(t, previous, in_batch, layers=layers):
                return BalanceView(
                    expert_load=loads[t, :layers],
                    num_gpus=64,
                    gpus_per_node=8,
                    slots_per_gpu=5,
                    batch_load=batch[:layers],
                    microbatch_index=t,
                    microbatch_in_batch=in_batch,
                    previous=previous,
                    expert_bytes=44e6,
                )

            planner = make_balancer(name)
            cold = view(0, None, 0)
            first = _median_ms(lambda p=planner, v=cold: p.plan(v), repeats)
            warm = planner.plan(cold)
            at_start, inside = view(1, warm, 0), view(1, warm, 1)
            start_ms = _median_ms(lambda p=planner, v=at_start: p.plan(v), repeats)
            inside_ms = _median_ms(lambda p=planner, v=inside: p.plan(v), repeats)
            print(
                f"  {name}, {layers:2d} layer(s) per call, ms per layer: first call of a run "
                f"{first / layers:.3f}, batch start {start_ms / layers:.3f}, "
                f"inside a batch {inside_ms / layers:.3f}"
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
            f"same output as the stable-sort reference: {same}"
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
    bench_remaster(args.quick)
    bench_quota_time(args.quick)
    bench_eplb(args.quick)


if __name__ == "__main__":
    main()
