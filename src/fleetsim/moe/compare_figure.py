"""The figure of ``fleetsim moe compare --plot``: per scenario, imbalance over microbatches next
to throughput against the force-balanced ideal, under a title that states the setup.

One colour per algorithm (none, eplb, eplb_hier, quota, two_timescale); a planner that plans
from history is drawn dashed in its algorithm's colour, so "exact load vs stale load" reads
at a glance. Draws only what ``run_compare`` measured: the numbers are the table's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure

from fleetsim.moe.compare import CompareRow, CompareSetup
from fleetsim.moe.compute import EpHardware, MoeLayerSpec


def algorithm(label: str) -> str:
    """``eplb_hier_stale k=1`` -> ``eplb_hier``: the balancer label without its history."""
    return label.split(" ", 1)[0].removesuffix("_stale")


def setup_line(setup: CompareSetup, spec: MoeLayerSpec, hardware: EpHardware) -> str:
    """The setup in one line: layer shape, EP group, links, load trace."""
    num_nodes = setup.num_gpus // setup.gpus_per_node
    return (
        f"MoE layer: {spec.num_experts} experts, top-{spec.top_k}, hidden {spec.hidden_size}, "
        f"expert FFN {spec.moe_inter_size}, {spec.weight_bytes_per_param:g} B/param · "
        f"EP over {setup.num_gpus} GPUs ({num_nodes} nodes of {setup.gpus_per_node}), "
        f"{setup.num_spare_slots_per_gpu} spare slot(s)/GPU · "
        f"{hardware.peak_flops / 1e12:,.0f} TFLOP/s, HBM {hardware.hbm_bytes_per_s / 1e12:g} TB/s, "
        f"NVLink {hardware.intra_node_bytes_per_s / 1e9:g} GB/s, "
        f"network {hardware.inter_node_bytes_per_s / 1e9:g} GB/s per GPU\n"
        f"loads: {setup.num_microbatches} microbatches (batches of "
        f"{setup.microbatches_per_batch}) × {setup.num_layers} layers, seed {setup.seed}; "
        f"microbatch 0 is warm-up and left out of the means"
    )


def compare_figure(
    rows: Sequence[CompareRow],
    setups: Sequence[CompareSetup],
    spec: MoeLayerSpec | None = None,
    hardware: EpHardware | None = None,
) -> Figure:
    """One row per scenario: imbalance (max/mean GPU load, log scale) per microbatch, and
    throughput relative to force-balanced per balancer (bars, labelled with the value and
    the mean imbalance). ``spec``/``hardware`` default to what ``run_compare`` uses."""
    import matplotlib
    import matplotlib.ticker

    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    setup_of = {s.scenario: s for s in setups}
    algorithms = list(dict.fromkeys(algorithm(r.balancer) for r in rows))
    hue: dict[str, Any] = {a: matplotlib.colormaps["tab10"](i % 10)
                           for i, a in enumerate(algorithms)}
    fig = Figure(figsize=(14, 0.9 + 4.2 * len(scenarios)), layout="constrained")
    grid = fig.subplots(len(scenarios), 2, squeeze=False, width_ratios=(3, 2))
    for (ax_line, ax_bar), scenario in zip(grid, scenarios, strict=True):
        mine = [r for r in rows if r.scenario == scenario]
        for row in mine:
            history = algorithm(row.balancer) != row.balancer.split(" ", 1)[0]
            ax_line.plot(row.imbalance_by_microbatch, label=row.balancer, marker=".",
                         color=hue[algorithm(row.balancer)], linestyle="--" if history else "-",
                         linewidth=1.2)
        ax_line.set_yscale("log")
        ax_line.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        ax_line.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%.2g"))
        setup = setup_of.get(scenario)
        tokens = f" ({setup.tokens_per_gpu} tokens/GPU per microbatch)" if setup else ""
        ax_line.set_title(f"{scenario}{tokens}: imbalance per microbatch", fontsize=10)
        ax_line.set_xlabel("microbatch")
        ax_line.set_ylabel("max / mean GPU load (mean over layers)")
        ax_line.grid(alpha=0.3, which="both")
        ax_line.legend(fontsize=7, ncols=2, title="solid: exact load, dashed: from history",
                       title_fontsize=7)
        _throughput_bars(ax_bar, mine, hue, scenario)
    first = setup_of.get(scenarios[0]) if scenarios else None
    if first is not None:
        fig.suptitle("fleetsim moe compare: expert balancers on one load trace each\n"
                     + setup_line(first, spec or MoeLayerSpec(num_experts=first.num_experts),
                                  hardware or EpHardware()), fontsize=9)
    return fig


def _throughput_bars(ax: Any, rows: Sequence[CompareRow], hue: dict[str, Any],
                     scenario: str) -> None:
    names = [r.balancer for r in rows]
    values = [100 * r.relative_throughput for r in rows]
    y = list(range(len(rows)))
    ax.barh(y, values, color=[hue[algorithm(n)] for n in names],
            hatch=["//" if algorithm(n) != n.split(" ", 1)[0] else "" for n in names])
    for yi, r in zip(y, rows, strict=True):
        ax.text(100 * r.relative_throughput + 1, yi,
                f"{r.relative_throughput:.0%}  (max/mean {r.imbalance:.2f})",
                va="center", fontsize=7)
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 135)
    ax.axvline(100, color="black", linestyle="--", linewidth=0.8)
    ax.set_xlabel("MoE throughput vs force-balanced ideal (%)")
    ax.set_title(f"{scenario}: throughput (label: value, mean imbalance)",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="x")

