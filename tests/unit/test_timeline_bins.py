"""The summary's timeline splits a single step across bin edges by time: the vectorized split
adds the same floats in the same order as a loop over the steps."""

from __future__ import annotations

import numpy as np

from fleetsim.metrics.summary import _fine_sums, timeline_bins
from fleetsim.serving.recorder import Records


def _loop_split(records, width, num_fine):
    """The split as a loop: each step across an edge, bin by bin (the reference)."""
    tl = records.timeline
    edges = records.timeline_origin_s + np.arange(num_fine + 1, dtype=np.float64) * width
    busy_s, ends = tl["busy_s"], tl["end_s"]
    starts = ends - busy_s
    first = np.clip(np.searchsorted(edges, starts, side="right") - 1, 0, num_fine - 1)
    last = np.clip(np.searchsorted(edges, ends, side="left") - 1, 0, num_fine - 1)
    quantities = {"busy": busy_s, "kv": tl["kv_block_seconds"],
                  "running": tl["num_running"] * busy_s, "waiting": tl["num_waiting"] * busy_s}
    inside = first == last
    sums = {name: np.bincount(first[inside], weights=v[inside], minlength=num_fine)
            for name, v in quantities.items()}
    for j in np.flatnonzero(~inside).tolist():
        dur = float(busy_s[j])
        for b in range(int(first[j]), int(last[j]) + 1):
            overlap = min(float(ends[j]), edges[b + 1]) - max(float(starts[j]), edges[b])
            if overlap > 0 and dur > 0:
                for name, v in quantities.items():
                    sums[name][b] += float(v[j]) * overlap / dur
    return sums


def test_steps_across_bin_edges_are_split_as_a_loop_would_split_them():
    rng = np.random.default_rng(7)
    n, width = 400, 0.25
    busy = rng.choice([0.0, 0.01, 0.2, 0.3, 0.9], size=n)  # many cross one or more edges
    ends = np.sort(rng.uniform(1.0, 20.0, size=n))
    ends[:3] = [2.0, 2.25, 2.5]  # steps ending exactly on an edge
    records = Records(
        requests={}, num_steps=n, busy_s_by_replica={}, kv_block_seconds_by_replica={},
        timeline={"end_s": ends, "busy_s": busy, "kv_block_seconds": busy * rng.uniform(0, 90, n),
                  "num_running": rng.integers(0, 30, n), "num_waiting": rng.integers(0, 9, n)},
        timeline_origin_s=0.5, timeline_bin_s=width)
    end_s = float(ends[-1])
    num_fine = int(np.ceil((end_s - 0.5) / width))
    got = timeline_bins(records, 0.5, end_s, 100, 2, num_fine)  # one bin per fine bin
    want = _loop_split(records, width, num_fine)
    crossing = np.floor((ends - busy - 0.5) / width) != np.floor((ends - 0.5) / width)
    assert crossing.sum() > 100  # (the split is what is tested)
    assert got["busy_fraction"] == np.minimum(1.0, want["busy"] / (width * 2)).tolist()
    assert got["kv_used_fraction"] == (want["kv"] / (width * 100)).tolist()
    safe = np.where(want["busy"] > 0, want["busy"], 1.0)
    assert got["mean_running"] == (want["running"] / safe).tolist()
    assert got["mean_waiting"] == (want["waiting"] / safe).tolist()


def test_a_shared_cache_gives_the_same_bins_and_is_keyed_on_the_recorded_bins():
    """The run's summary (120 bins) and its one pool's (60) merge the same recorded bins:
    with a shared ``cache`` they are computed once, and each result equals its uncached one;
    a call whose recorded bins differ (a later end) computes its own."""
    rng = np.random.default_rng(3)
    n, width = 300, 0.5
    busy = rng.choice([0.0, 0.05, 0.7], size=n)
    ends = np.sort(rng.uniform(1.0, 90.0, size=n))
    records = Records(
        requests={}, num_steps=n, busy_s_by_replica={}, kv_block_seconds_by_replica={},
        timeline={"end_s": ends, "busy_s": busy, "kv_block_seconds": busy * 40.0,
                  "num_running": rng.integers(0, 30, n), "num_waiting": rng.integers(0, 9, n)},
        timeline_origin_s=0.0, timeline_bin_s=width)
    end_s = float(ends[-1])
    cache: dict = {}
    summary = timeline_bins(records, 1.0, end_s, 100, 4, 120, cache)
    assert list(cache) == [(0.0, width, int(np.ceil(end_s / width)))]
    pool = timeline_bins(records, 1.0, end_s, 100, 4, 60, cache)
    assert len(cache) == 1
    assert summary == timeline_bins(records, 1.0, end_s, 100, 4, 120)
    assert pool == timeline_bins(records, 1.0, end_s, 100, 4, 60)
    assert len(pool["bin_start_s"]) <= 60 < len(summary["bin_start_s"])
    # The cache is what the second call read: a changed entry changes its result.
    (key, sums), = cache.items()
    cache[key] = {name: v * 2.0 for name, v in sums.items()}
    assert timeline_bins(records, 1.0, end_s, 100, 4, 60, cache)["kv_used_fraction"] == [
        2.0 * x for x in pool["kv_used_fraction"]]
    later = timeline_bins(records, 1.0, end_s + 10.0, 100, 4, 60, cache)
    assert len(cache) == 2
    assert later == timeline_bins(records, 1.0, end_s + 10.0, 100, 4, 60)


def test_rows_binned_chunk_by_chunk_add_the_floats_of_one_pass():
    """``_fine_sums`` bins the timeline a chunk of rows at a time (its temporaries stay
    small): every chunk size gives the sums of one pass over all rows, bit for bit."""
    rng = np.random.default_rng(11)
    n, width = 5000, 2.0  # about 130 rows a bin: sums that a chunk boundary would reorder
    busy = rng.uniform(0.0, 0.9, size=n)
    ends = np.sort(rng.uniform(1.0, 80.0, size=n))
    tl = {"end_s": ends, "busy_s": busy, "kv_block_seconds": busy * rng.uniform(0, 90, n),
          "num_running": rng.integers(0, 30, n), "num_waiting": rng.integers(0, 9, n)}
    num_fine = int(np.ceil((float(ends[-1]) - 0.5) / width))
    one_pass = _fine_sums(tl, 0.5, width, num_fine, chunk_rows=n)
    for chunk_rows in (1, 7, 64, 4999):
        chunked = _fine_sums(tl, 0.5, width, num_fine, chunk_rows=chunk_rows)
        for name, sums in one_pass.items():
            assert chunked[name].tobytes() == sums.tobytes(), (name, chunk_rows)


def test_arrivals_closer_than_120_microseconds_give_no_fixed_bins():
    """Bins are the arrivals' span / 120 from the first arrival, but none finer than a
    microsecond: two requests 2e-311 s apart gave bins of a subnormal width, and the bin
    count overflowed (``OverflowError``, no summary)."""
    from tests.conftest import make_workload

    from fleetsim.config import config_from_dict
    from fleetsim.run import run
    from fleetsim.serving.cluster import MIN_DEFAULT_BIN_S, default_timeline

    config = config_from_dict({"model": "Llama-3.2-3B", "seed": 0,
                               "cluster": {"pools": [{"name": "a", "gpu": "H100"}]}})
    tiny = make_workload([0.0, 2.225073858507e-311], [16, 16], [4, 4])
    assert default_timeline(tiny, np.inf) == (0.0, np.inf)
    timeline = run(config, workload=tiny).summary["timeline"]
    assert len(timeline["busy_fraction"]) > 0
    assert np.isfinite(timeline["busy_fraction"]).all()
    for span_s, fixed in ((1e-4, False), (2e-4, True), (60.0, True)):
        workload = make_workload([5.0, 5.0 + span_s], [16, 16], [4, 4])
        origin, bin_s = default_timeline(workload, np.inf)
        assert origin == 5.0
        if fixed:
            assert bin_s == ((5.0 + span_s) - 5.0) / 120 >= MIN_DEFAULT_BIN_S
        else:
            assert bin_s == np.inf


def test_more_recorded_bins_than_the_summary_holds_split_the_makespan():
    """Bins recorded a microsecond wide over a day would be 86 billion: the summary splits
    the makespan in ``max_bins`` instead (as for a run without fixed bins)."""
    from fleetsim.metrics.summary import MAX_FINE_BINS

    tl = {"end_s": np.array([10.0, 86_400.0]), "busy_s": np.array([10.0, 86_390.0]),
          "kv_block_seconds": np.array([10.0, 86_390.0]), "num_running": np.array([1, 1]),
          "num_waiting": np.array([0, 0]), "num_steps": np.array([1, 1]),
          "num_tokens": np.array([1, 1]), "num_used_blocks": np.array([1, 1]),
          "replica_id": np.array([0, 0])}
    assert MAX_FINE_BINS < 86_400 / 1e-6
    records = Records({}, tl, 2, {0: 86_400.0}, {0: 86_400.0}, 0.0, 1e-6)
    out = timeline_bins(records, 0.0, 86_400.0, 1, 1, 60)
    assert len(out["bin_start_s"]) == 60
    assert out["busy_fraction"] == [1.0] * 60
