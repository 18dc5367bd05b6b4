"""Parameter sweeps: a grid of configs run in local processes or on Ray, merged into one table."""

from fleetsim.sweep.driver import run_sweep
from fleetsim.sweep.runner import BACKENDS, PointResult, run_point, run_points
from fleetsim.sweep.spec import Point, SweepSpec, expand, load_spec, make_spec, parse_grid_arg
from fleetsim.sweep.table import METRICS, row_of

__all__ = ["BACKENDS", "METRICS", "Point", "PointResult", "SweepSpec", "expand", "load_spec",
           "make_spec", "parse_grid_arg", "row_of", "run_point", "run_points", "run_sweep"]
