"""The process kernel moved to ``fleetsim.core.process`` (it knows nothing about RL); these
names stay importable from here."""

from fleetsim.core.process import PROCESS_RESUME, Event, Kernel, Process, Timeout

__all__ = ["PROCESS_RESUME", "Event", "Kernel", "Process", "Timeout"]
