"""Number formatting shared by the command-line tables."""

from __future__ import annotations


def fmt_number(v: float | None) -> str:
    """A figure for a table: '-' for none, thousands separators from 100 up, else 4 digits."""
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.4g}"


def hardware_label(summary: dict) -> str:
    """What a run ran on, from its summary: replicas x GPU and TP per pool, with the pools'
    roles when there is more than one pool ("prefill 1x H200, TP 1 + decode 2x A100, TP 1");
    a replica of TP x PP (x DP-attention) > 1 spans that many GPUs, so their total is given
    too."""
    pools = [p for p in summary.get("pools") or [] if isinstance(p, dict)]
    if not pools:  # a summary written before pools were recorded
        pools = [{"gpu": summary.get("gpu", "?"), "num_replicas": summary.get("num_replicas"),
                  "tp": summary.get("tp")}]
    parts = []
    for p in pools:
        n, tp, pp = p.get("num_replicas"), p.get("tp"), p.get("pp", 1)
        dp = p.get("dp_attention", 1)
        tp_text = f"TP {tp}" if tp is not None else "TP ?"
        if isinstance(pp, int) and pp > 1:
            tp_text += f" x PP {pp}"
        if isinstance(dp, int) and dp > 1:  # attention ranks, experts over all their GPUs
            tp_text = f"DP-attention {dp} x {tp_text}, EP {dp * tp if tp else '?'}"
        if (isinstance(n, int) and isinstance(tp, int) and isinstance(pp, int)
                and isinstance(dp, int) and tp * pp * dp > 1):
            tp_text += f" ({n * tp * pp * dp} GPUs)"
        role = f"{p['role']} " if len(pools) > 1 and p.get("role") else ""
        parts.append(f"{role}{n if n is not None else '?'}x {p.get('gpu', '?')}, {tp_text}")
    return " + ".join(parts)
