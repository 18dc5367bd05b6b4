"""Number formatting shared by the command-line tables."""

from __future__ import annotations


def fmt_number(v: float | None) -> str:
    """A figure for a table: '-' for none, thousands separators from 100 up, else 4 digits."""
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.1f}"
    return f"{v:.4g}"
