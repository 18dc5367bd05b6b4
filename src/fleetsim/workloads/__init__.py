"""Workloads: trace loaders, synthetic generators, transformations and the ``[workload]`` config."""

from __future__ import annotations

from fleetsim.workloads.config import (
    LengthConfig,
    WorkloadConfig,
    build_workload,
)
from fleetsim.workloads.distributions import (
    Empirical,
    Fixed,
    LengthDistribution,
    LogNormal,
    Uniform,
)
from fleetsim.workloads.info import trace_info, workload_info
from fleetsim.workloads.loaders import (
    EMBEDDED_TRACES,
    load_azure_csv,
    load_generic,
    load_mooncake_jsonl,
    load_trace,
    save_generic_csv,
)
from fleetsim.workloads.synthetic import (
    ArrivalProcess,
    Constant,
    Gamma,
    Poisson,
    arrival_times_s,
    synthesize,
)
from fleetsim.workloads.transforms import head, scale_rate, time_slice
from fleetsim.workloads.workload import Workload

__all__ = [
    "EMBEDDED_TRACES",
    "ArrivalProcess",
    "Constant",
    "Empirical",
    "Fixed",
    "Gamma",
    "LengthConfig",
    "LengthDistribution",
    "LogNormal",
    "Poisson",
    "Uniform",
    "Workload",
    "WorkloadConfig",
    "arrival_times_s",
    "build_workload",
    "head",
    "load_azure_csv",
    "load_generic",
    "load_mooncake_jsonl",
    "load_trace",
    "save_generic_csv",
    "scale_rate",
    "synthesize",
    "time_slice",
    "trace_info",
    "workload_info",
]
