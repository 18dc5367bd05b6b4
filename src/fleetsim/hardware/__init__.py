"""Hardware specs: GPUs (and, later, interconnects and clusters)."""

from __future__ import annotations

from fleetsim.hardware.gpu import GPUSpec, get_gpu, list_gpus, load_gpu_catalog

__all__ = ["GPUSpec", "get_gpu", "list_gpus", "load_gpu_catalog"]
