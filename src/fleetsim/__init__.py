"""fleetsim: a discrete-event simulator of GPU clusters serving LLM workloads."""

from __future__ import annotations

__version__ = "0.1.0"
