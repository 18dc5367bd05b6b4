"""The step model's piecewise-linear curves: a lookup searches only the grid points of x's
octave, and must give exactly what a search of the whole grid gives (``bisect_right``), on
the engine's real grids and on any x, integral or not, on a point, at an octave's edge,
below the first point or past the last."""

from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsim.perf.step_model import _attn_grid, _Piecewise, _token_grid


def whole_grid(curve: _Piecewise, x: float) -> float:
    """y(x) from a search of every grid point (the lookup before octaves)."""
    if 0 <= x < curve.num_dense and int(x) == x:
        return curve.ys[int(x)]
    i = max(bisect_right(curve.xs, x + 0.0) - 1, 0)
    return curve.ys[i] + curve.slopes[i] * (x - curve.xs[i])


def curve_on(xs: np.ndarray) -> _Piecewise:
    # Increasing ys with random steps: at a grid point, the segment before it extended to
    # the point rarely gives the point's own y exactly, so the segment found matters.
    ys = np.cumsum(np.random.default_rng(0).random(xs.size)) * 1e-3
    return _Piecewise.from_arrays(xs, ys)


CURVES = {"tokens": curve_on(_token_grid()), "attention": curve_on(_attn_grid()),
          "sparse": curve_on(np.array([0.0, 0.5, 3.0, 3.25, 100.0, 4096.0, 4097.0]))}


def edges(curve: _Piecewise) -> list[float]:
    """Every grid point, its neighbours, every power of two and its neighbours."""
    out: list[float] = []
    for x in curve.xs + [2.0 ** k for k in range(-2, 24)]:
        out += [x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf), x - 0.5, x + 0.5]
    return out


@pytest.mark.parametrize("name", sorted(CURVES))
def test_lookup_equals_a_search_of_the_whole_grid_at_every_edge(name):
    curve = CURVES[name]
    for x in edges(curve):
        assert curve.at(x) == whole_grid(curve, x), x


@pytest.mark.parametrize("name", sorted(CURVES))
def test_lookup_takes_ints_as_the_floats_they_equal(name):
    curve = CURVES[name]
    for x in (0, 1, 2, 7, 1023, 1024, 1025, 4095, 4096, 4097, 9000, 16384, 10**6, 3 * 10**6):
        assert curve.at(x) == curve.at(float(x)) == whole_grid(curve, float(x)), x


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(CURVES)),
       x=st.floats(min_value=-10.0, max_value=5e6, allow_nan=False))
def test_lookup_equals_a_search_of_the_whole_grid(name, x):
    curve = CURVES[name]
    assert curve.at(x) == whole_grid(curve, x)


def test_lookup_past_the_grid_and_nan_extrapolate_from_the_last_segment():
    curve = CURVES["tokens"]
    assert curve.at(math.inf) == math.inf
    assert math.isnan(curve.at(math.nan))
    far = curve.xs[-1] * 4
    assert curve.at(far) == whole_grid(curve, far) > curve.ys[-1]


@pytest.mark.parametrize("op_class", ["moe", "gemm"])
def test_an_op_curve_gives_its_lookup_functions_floats(op_class):
    """``TableStepModel.op_time_curve(c).at`` (what compiled cost models call) equals
    ``op_time_lookup(c)`` (the function form), for int token counts (ExpertPlex passes
    those) and floats, on a measured MoE model's tables, with a kernel scale too."""
    from fleetsim.hardware import get_gpu
    from fleetsim.models import get_model
    from fleetsim.perf import build_step_model

    for scale in (1.0, 1.1):
        model = build_step_model(get_model("qwen3-235b"), get_gpu("H200"), 1)
        model.kernel_time_scale = scale
        curve, fn = model.op_time_curve(op_class), model.op_time_lookup(op_class)
        xs = [*range(0, 300), *range(300, 70000, 97), 131072, 10**6]
        for x in xs:
            assert curve.at(x) == fn(x), x
            assert curve.at(x + 0.25) == fn(x + 0.25), x
