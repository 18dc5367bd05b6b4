"""An entry's independent sub-simulations over free cores (``fleetsim.repro.pool``): results
in item order whatever the slots, borrowed cores given back, ``repro all``'s start order and
idle-core count, and a pooled entry's results equal to its runs one after another."""

from __future__ import annotations

import json
import os
import threading

import pytest

from fleetsim.repro.cli import longest_first, recorded_wall_s
from fleetsim.repro.frame import ReproContext, RunFiles
from fleetsim.repro.pool import CoreTokens, SubRuns, idle_workers
from fleetsim.rl.runs import balance_split, pick_split, probe_summary, split_probes


def _square_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("two")
    return x


def test_map_keeps_item_order_and_uses_helper_processes():
    items = list(range(7))
    out = SubRuns(3).map(_square_pid, items)
    assert [v for v, _ in out] == [x * x for x in items]
    assert all(pid != os.getpid() for _, pid in out)
    # one slot, no tokens: here, one after another
    assert [pid for _, pid in SubRuns(1).map(_square_pid, items)] == [os.getpid()] * 7


def test_map_raises_a_helpers_exception():
    with pytest.raises(ValueError, match="two"):
        SubRuns(2).map(_fail_on_two, [1, 2, 3])


def test_helper_processes_last_across_maps_until_closed():
    """An entry's rounds reuse the processes of its earlier rounds (a fresh pool per round
    paid a fresh fleetsim import per process), and a failed round leaves a working pool."""
    with SubRuns(2) as subruns:
        first = {pid for _, pid in subruns.map(_square_pid, list(range(4)))}
        second = {pid for _, pid in subruns.map(_square_pid, list(range(4)))}
        assert second <= first and os.getpid() not in first
        with pytest.raises(ValueError, match="two"):
            subruns.map(_fail_on_two, [1, 2, 3])
        assert [v for v, _ in subruns.map(_square_pid, [5, 6])] == [25, 36]
    assert subruns._pool is None  # closed: its processes are gone


def test_borrowed_cores_are_given_back():
    semaphore = threading.Semaphore(0)
    tokens = CoreTokens(semaphore)
    tokens.give(2)
    out = SubRuns(1, tokens).map(_square_pid, list(range(5)))
    assert [v for v, _ in out] == [x * x for x in range(5)]
    # both tokens came back: two can be taken, a third cannot
    assert tokens.take() and tokens.take() and not tokens.take()


def test_idle_workers_counts_workers_without_an_entry():
    assert idle_workers(2, 13, 0) == 0
    assert idle_workers(2, 13, 11) == 0
    assert idle_workers(2, 13, 12) == 1
    assert idle_workers(4, 2, 0) == 2


def test_longest_first_puts_unrecorded_entries_first(tmp_path):
    record = tmp_path / "board.json"
    record.write_text(json.dumps({"entries": [
        {"name": "a", "wall_s": 5.0}, {"name": "b", "wall_s": 50.0}, {"name": "c"}]}))
    wall = recorded_wall_s(record)
    assert wall == {"a": 5.0, "b": 50.0}
    assert longest_first(["a", "b", "c", "d"], wall) == ["c", "d", "b", "a"]
    assert recorded_wall_s(tmp_path / "missing.json") == {}
    assert longest_first(["b", "a"], {}) == ["b", "a"]


def test_run_many_in_helpers_equals_runs_here():
    """The same serving runs given at once to two helper processes: the same summaries and
    request rows as ``ctx.run`` one after another, kept under the same keys in order."""
    import numpy as np

    from fleetsim.repro import fastserve

    runs = [(policy, f"{rate:g}", fastserve.config(policy, rate, 40))
            for policy in ("fastserve", "vllm") for rate in (2.0, 6.0)]
    here = ReproContext(quick=True, overrides=("seed=3",))
    there = ReproContext(quick=True, overrides=("seed=3",), subruns=SubRuns(2))
    inline, pooled = here.run_many(runs), there.run_many(runs)
    assert all(isinstance(r, RunFiles) for r in pooled)
    assert list(there.runs) == list(here.runs) == [(p, load) for p, load, _ in runs]
    for a, b in zip(inline, pooled, strict=True):
        assert a.summary == b.summary and a.config == b.config and a.config["seed"] == 3
        for col, values in a.records.requests.items():
            other = b.records.requests[col]
            assert np.array_equal(values, other, equal_nan=values.dtype.kind == "f"), col


def test_stage_balancing_probes_in_helpers_equal_balance_split():
    from fleetsim.repro import streamrl

    data = streamrl.streamrl(5000, 2, 16, 16, 1, staleness=0)
    candidates = [2, 8, 14]
    probes = split_probes(data, 16, candidates)
    pooled = pick_split(candidates, SubRuns(2).map(probe_summary, probes))
    assert pooled == balance_split(data, 16, candidates)
    assert all(p["num_steps"] == 1 and not p["system"]["streaming"] for p in probes)


def test_run_many_checks_every_config_before_running():
    from fleetsim.errors import FleetsimInputError

    ctx = ReproContext(quick=True, overrides=(), subruns=SubRuns(2))
    with pytest.raises(FleetsimInputError):
        ctx.run_many([("a", "1", {"model": "no-such-model"})])
    assert ctx.runs == {}


def _entry_with_tokens(tokens: CoreTokens) -> tuple[list[int], int]:
    """What an entry of ``repro all`` does in its worker: its simulations over its own slot
    and the borrowed cores, its helpers stopped at its end (as ``run_entry`` does: a worker
    exiting with its helpers alive can wait on them forever); then how many tokens it can
    take back (all it borrowed)."""
    with SubRuns(1, tokens) as subruns:
        out = subruns.map(_square_pid, list(range(6)))
    num = 0
    while tokens.take():
        num += 1
    return [v for v, _ in out], num


def test_tokens_travel_to_an_entry_worker_and_come_back():
    """``repro all``'s path: a manager's semaphore inside the task, an entry pool worker that
    starts its own helpers, borrowed cores given back to the shared count."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    with context.Manager() as manager:
        tokens = CoreTokens(manager.Semaphore(0))
        tokens.give(2)
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            values, num_back = pool.submit(_entry_with_tokens, tokens).result()
    assert values == [x * x for x in range(6)]
    assert num_back == 2


def test_a_kept_run_is_written_like_a_serving_run(tmp_path):
    """``ctx.keep``: the one way a run that did not go through ``ctx.run`` (an RL rollout,
    an MoE pass model, a SoC run) is kept; request columns, when given, become
    ``requests.csv``, and without them only the summary and config are written."""
    from fleetsim.repro import fastserve
    from fleetsim.repro.cli import write_runs

    served = ReproContext(quick=True, overrides=()).run("vllm", "2", fastserve.config(
        "vllm", 2.0, 5))
    ctx = ReproContext(quick=True, overrides=())
    ctx.keep("a", "1", {"x": 1}, {"policy": "a"})
    ctx.keep("b", "1", served.summary, served.config, served.records.requests)
    assert isinstance(ctx.runs[("a", "1")], RunFiles) and ctx.runs[("a", "1")].records is None
    assert ctx.runs[("b", "1")].records.requests is served.records.requests
    runs = tmp_path / "runs"
    write_runs(runs, ctx.runs)
    assert sorted(p.name for p in (runs / "a" / "1").iterdir()) == ["config.json",
                                                                   "summary.json"]
    assert (runs / "b" / "1" / "requests.csv").read_text().count("\n") == 6
