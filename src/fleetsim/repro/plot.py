"""The key figure of a reproduction: the metric against load, one line per policy."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def key_figure(repro: Any, comparison: Any, doc: dict[str, Any], path: Path) -> None:
    metric = repro.metric
    series = comparison.results
    loads = doc["loads"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    for policy, by_load in series.items():
        xs = [x for x, v in zip(loads["values"], by_load.values(), strict=False) if v is not None]
        ys = [v for v in by_load.values() if v is not None]
        style = "-o" if policy == repro.system else "--s"
        ax.plot(xs, ys, style, label=policy, markersize=4)
    if getattr(comparison, "reference", None) is not None:
        label, level = comparison.reference
        ax.axhline(level, linestyle=":", color="gray", label=f"{label} ({level:g} {metric.unit})")
    if loads.get("labels"):
        # A quick slice may run the first levels only.
        ax.set_xticks(loads["values"], loads["labels"][:len(loads["values"])], fontsize=8)
        ax.set_xlabel(loads["name"])
    else:
        ax.set_xlabel(f"{loads['name']} ({loads['unit']})")
    ax.set_ylabel(f"{metric.name} ({metric.unit})")
    ratio = doc["ratio"]
    ours = f"{ratio:.2f}x" if ratio is not None else "n/a"
    title = textwrap.fill(f"{repro.paper.title} ({repro.paper.id})", 70)
    from fleetsim.repro.cli import paper_figure

    ax.set_title(f"{title}\n{repro.system} vs {repro.baseline}: fleetsim {ours}, paper "
                 f"{paper_figure(doc)}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
