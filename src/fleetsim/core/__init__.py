"""Event kernel (knows nothing about LLMs)."""

from fleetsim.core.simulator import Simulator

__all__ = ["Simulator"]
