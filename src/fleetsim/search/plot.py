"""Cost-vs-goodput scatter of a plan, Pareto front highlighted (matplotlib, Agg backend)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from fleetsim.errors import FleetsimInputError
from fleetsim.results import write_file


def plot_plan(plan: dict[str, Any], path: str | Path) -> None:
    """Write a PNG of ``plan_to_dict`` output: $/hour against goodput, front as a line."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise FleetsimInputError("--plot", str(path), "needs matplotlib: pip install "
                                 "'fleetsim[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = plan["points"]
    ok = [i for i, r in enumerate(rows) if r.get("goodput_requests_per_s")]
    front = plan["front"]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    mixed = [i for i in ok if len(rows[i]["pools"]) == 1]
    pd = [i for i in ok if len(rows[i]["pools"]) > 1]
    for idx, marker, label in ((mixed, "o", "mixed"), (pd, "s", "prefill/decode")):
        if idx:
            ax.scatter([rows[i]["usd_per_hour"] for i in idx],
                       [rows[i]["goodput_requests_per_s"] for i in idx],
                       marker=marker, color="0.6", label=label, zorder=2)
    fx = [rows[i]["usd_per_hour"] for i in front]
    fy = [rows[i]["goodput_requests_per_s"] for i in front]
    ax.step(fx, fy, where="post", color="tab:red", zorder=3)
    ax.scatter(fx, fy, color="tab:red", zorder=4, label="Pareto front")
    for i in front:
        ax.annotate(rows[i]["shape"], (rows[i]["usd_per_hour"], rows[i]["goodput_requests_per_s"]),
                    textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.set_xlabel("cluster cost ($/hour)")
    ax.set_ylabel(f"goodput (req/s at {100 * plan['target']:g}% SLO attainment)")
    ax.set_title("capacity plan: cost vs goodput")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    write_file(Path(path), buf.getvalue(), "--plot")
