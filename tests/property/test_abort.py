"""``Cluster.abort``: a request ended early leaves its replica at once (out of the batch, KV
freed), is recorded once as aborted with its reason, and the rest of the run is exact: blocks
and tokens conserved, no request lost, and fast-forward equal to stepping one at a time even
when an abort cuts a decode window."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.unit.test_cluster import pools, random_workload, sim

from fleetsim.serving.request import ABORTED, Request


class Aborts:
    """A controller that aborts request ``rid`` at time ``t`` for each (t, rid), logging
    what ``Cluster.abort`` answered and each replica's used blocks right after."""

    def __init__(self, schedule):
        self.schedule = sorted(schedule)
        self.log = []

    def start(self, cluster):
        return self.schedule[0][0] if self.schedule else None

    def on_tick(self, cluster, now_s):
        while self.schedule and self.schedule[0][0] <= now_s:
            _, rid = self.schedule.pop(0)
            held = cluster.abort(rid, f"test {rid}")
            self.log.append((now_s, rid, held, tuple(r.view.kv.num_used_blocks
                                                     for r in cluster.replicas)))
        return self.schedule[0][0] if self.schedule else None


def run_with_aborts(w, setup, schedule, fast_forward):
    ctl = Aborts(schedule)
    rec, cluster = sim(w, setup, max_running=8, fast_forward=fast_forward,
                       controllers=[ctl])
    return rec, cluster, ctl


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 40),
       shape=st.sampled_from(["one", "mixed", "pd"]), blocks=st.sampled_from([60, 120, 2000]),
       picks=st.lists(st.tuples(st.floats(0.0, 1.2), st.integers(0, 39)), max_size=12))
# An abort just after a window in flight had finished the request: it was still listed on the
# replica until the window settled, so the abort said it held it (stepping: finished).
@example(seed=83, n=40, shape="mixed", blocks=120, picks=[(0.49609375, 31)])
def test_aborts_conserve_blocks_and_tokens_and_fast_forward_stays_exact(
        seed, n, shape, blocks, picks):
    w = random_workload(n, seed=seed, rate=50.0)
    span = float(w.arrival_s[-1]) + 0.5
    schedule = [(round(f * span, 4), rid % n) for f, rid in picks]
    setup = {"one": pools(mixed=1, blocks=blocks), "mixed": pools(mixed=3, blocks=blocks),
             "pd": pools(prefill=1, decode=2, blocks=blocks, bw=1e9)}[shape]
    fast, cluster, fast_ctl = run_with_aborts(w, setup, schedule, True)
    slow, _, slow_ctl = run_with_aborts(w, setup, schedule, False)

    # Fast-forward equals stepping one at a time, aborts included.
    assert fast_ctl.log == slow_ctl.log
    assert fast.aborted == slow.aborted
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
    for col in ("num_tokens", "num_steps"):  # (a window's row holds many steps)
        assert fast.timeline[col].sum() == slow.timeline[col].sum(), col

    # No request lost, none twice: each finished or was aborted, once.
    finished = fast.requests["request_id"].tolist()
    aborted = [a.request_id for a in fast.aborted]
    assert sorted(finished + aborted) == list(range(n))
    held_at = {}  # request -> when an abort first found it held
    for t, rid, held, _ in fast_ctl.log:
        if held:
            held_at.setdefault(rid, t)
    assert set(held_at) == set(aborted)  # held means aborted; not held, not aborted
    for a in fast.aborted:
        assert a.reason == f"test {a.request_id}"
        assert a.abort_s >= held_at[a.request_id]
        if shape != "pd":
            assert a.abort_s == held_at[a.request_id]  # no KV moves here: it left at once

    # Blocks conserved (debug checks every step; all free at the end) and every token
    # computed belongs to a request that finished or was aborted.
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0
        assert not replica.running and not replica.waiting
    computed = int(fast.requests["num_computed_tokens"].sum()) + sum(
        a.num_computed_tokens for a in fast.aborted)
    assert int(fast.timeline["num_tokens"].sum()) == computed


def test_an_abort_frees_the_kv_at_once_and_cuts_the_window():
    """Three replicas (no next-input hint, so windows are cut, not stopped): request 0
    decodes 400 tokens in a window; aborted mid-window it leaves at that instant with the
    tokens of the steps already done, and its blocks are free right then."""
    w = random_workload(3, seed=1, rate=1000.0)
    w = type(w)(arrival_s=np.array([0.0, 0.0, 0.0]), num_prompt_tokens=np.array([100, 50, 50]),
                num_output_tokens=np.array([400, 3, 3]))
    setup = pools(mixed=3, blocks=2000)
    plain, _, _ = run_with_aborts(w, setup, [], True)
    i = plain.requests["request_id"].tolist().index(0)
    at = round((plain.requests["first_token_s"][i] + plain.requests["finish_s"][i]) / 2, 6)
    rec, cluster, ctl = run_with_aborts(w, setup, [(at, 0)], True)
    [(t, rid, held, used)] = ctl.log
    assert (t, rid, held) == (at, 0, True)
    assert used[0] == 0  # replica 0 (request 0's) freed its blocks at once
    [a] = rec.aborted
    assert (a.request_id, a.abort_s, a.reason) == (0, at, "test 0")
    assert 1 < a.num_output_tokens < 400
    assert a.num_computed_tokens == 100 + a.num_output_tokens - 1
    assert sorted(rec.requests["request_id"].tolist()) == [1, 2]
    assert cluster.replicas[0].running == [] and cluster.abort(0, "again") is False


def test_state_aborted_is_what_sources_are_told():
    w = random_workload(2, seed=1)
    told = []

    class Source:
        wants_finishes = True
        num_requests = 2

        def start(self, ctx):
            for _ in range(2):
                ctx.submit_at(0.0, Request(id=ctx.new_request_id(), arrival_s=0.0,
                                           num_prompt_tokens=30, max_output_tokens=50))

        def on_arrival(self, req, ctx):
            return None

        def on_finish(self, req, ctx):
            told.append((req.id, req.state, req.abort_reason))

    sim(w, pools(mixed=1), max_running=8, source=Source(), controllers=[Aborts([(0.05, 1)])])
    assert sorted(told) == [(0, 8, None), (1, ABORTED, "test 1")]


def test_an_abort_while_the_kv_moves_ends_the_request_when_it_lands():
    """P/D over a slow link: aborted while its KV crosses (0.5 s for 500 tokens at 1 MB/s),
    the request ends when the KV lands at the decode replica, which frees it at once."""
    w = random_workload(1, seed=1)
    w = type(w)(arrival_s=np.array([0.0]), num_prompt_tokens=np.array([500]),
                num_output_tokens=np.array([50]))
    setup = pools(prefill=1, decode=1, blocks=2000, bw=1e6)
    plain, _, _ = run_with_aborts(w, setup, [], True)
    first_token_s = float(plain.requests["first_token_s"][0])
    at = round(first_token_s + 0.2, 6)  # the handoff is in flight then
    rec, cluster, ctl = run_with_aborts(w, setup, [(at, 0)], True)
    assert [entry[:3] for entry in ctl.log] == [(at, 0, True)]
    [a] = rec.aborted
    assert a.abort_s > at and a.replica_id == 1 and a.num_output_tokens == 1
    assert len(rec.requests["request_id"]) == 0
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0 and replica.load_tokens == 0


def test_an_abort_while_the_parents_kv_reloads_ends_the_call_when_it_is_back():
    """A program's follow-up call arrives and its parent's KV comes back from the host tier
    (state RELOADING); aborted meanwhile, it ends when the reload is done, never queued."""
    from tests.property.test_program_invariants import CHILD, check_nothing_held, simulate

    from fleetsim.programs import Call, Program

    progs = [Program(0.0, (Call(1000, 100, (), 1.0), CHILD)), Program(1.2, (Call(1800, 10, ()),))]
    kw = {"tool_kv": "offload", "blocks": 140, "host_blocks": 4000}
    plain, _, _, _ = simulate(progs, **kw)
    req = plain.requests
    child = int(np.argmax(req["num_prompt_tokens"] == 1300))
    assert req["first_scheduled_s"][child] > req["arrival_s"][child]  # the reload took time
    at = float(req["arrival_s"][child])
    ctl = Aborts([(at + 1e-6, int(req["request_id"][child]))])  # just after it arrived
    records, cluster, _, _ = simulate(progs, controllers=[ctl], **kw)
    [(_, rid, held, _)] = ctl.log
    assert held
    [a] = records.aborted
    assert a.request_id == rid and at + 1e-6 < a.abort_s <= float(req["first_scheduled_s"][child])
    assert a.num_computed_tokens == 0 and rid not in records.requests["request_id"].tolist()
    check_nothing_held(cluster)
