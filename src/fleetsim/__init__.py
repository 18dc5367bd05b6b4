"""fleetsim: a discrete-event simulator of GPU clusters serving LLM workloads."""

from __future__ import annotations

from fleetsim import native as _native

__version__ = "0.1.0"

# Subpackages load from the mypyc-compiled copy of these sources when one is fresh.
_native.activate(__path__)
