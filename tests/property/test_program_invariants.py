"""Program invariants over random DAGs, routers, orderings and pools: a call never starts
before its parents and their tool calls end, every revealed call finishes, KV blocks all come
back (checked after every step with debug on), and a program alone on an idle cluster never
beats its standalone time T_w."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleetsim.hardware import get_gpu
from fleetsim.models import get_model
from fleetsim.perf import build_step_model
from fleetsim.policies import BATCH_POLICIES, ORDERING_POLICIES, make_batch_policy, make_ordering
from fleetsim.policies.routing import ROUTERS, LeastLoaded, make_router
from fleetsim.programs import Call, Program, ProgramSource, program_call
from fleetsim.programs.runtime import call_timer, calls_workload
from fleetsim.registry import PolicySpec
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.kv_keep import KVRetention

MODEL = get_model("llama-3.1-8b")
STEP = build_step_model(MODEL, get_gpu("h100-sxm"), 1)
BLOCK = 64
BUDGET = 8192  # covers every prompt drawn (planners that never split prompts need it)
HORIZON_S = 1e15  # as run() gives program runs: windows stop at finishes


@st.composite
def programs(draw, max_programs=4, max_calls=7):
    out = []
    t = 0.0
    for _ in range(draw(st.integers(1, max_programs))):
        calls: list[Call] = []
        for i in range(draw(st.integers(1, max_calls))):
            parents = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
            base = 0
            if parents and draw(st.booleans()):  # extend the first parent's context
                p = calls[parents[0]]
                base = p.num_prompt_tokens + p.num_output_tokens
            calls.append(Call(base + draw(st.integers(1, 700)), draw(st.integers(1, 60)),
                              parents, draw(st.sampled_from([0.0, 0.01, 0.3, 2.0]))))
        out.append(Program(t, tuple(calls)))
        t += draw(st.sampled_from([0.0, 0.05, 1.0]))
    return out


def every_call_fits(progs, blocks: int) -> bool:
    """A call larger than a replica is an input error (cluster.route), not an invariant:
    chains that extend their parents' context can outgrow 120 blocks of 16 tokens (e.g.
    641 -> 1212 -> 1921 tokens; 600 -> 1185 -> 1861 + 60), which hypothesis found."""
    return all(-(-(c.num_prompt_tokens + c.num_output_tokens) // 16) <= blocks
               for p in progs for c in p.calls)


class Spy:
    """Wraps a source; keeps each call's tag at arrival (before a policy may replace it)."""

    def __init__(self, inner):
        self.inner, self.wants_finishes, self.tags = inner, True, {}

    num_requests = property(lambda self: self.inner.num_requests)

    def start(self, ctx):
        self.inner.start(ctx)

    def on_arrival(self, req, ctx):
        self.tags[req.id] = program_call(req)
        self.inner.on_arrival(req, ctx)

    def on_finish(self, req, ctx):
        self.inner.on_finish(req, ctx)


def simulate(progs, *, shape="mixed", replicas=1, router="round_robin", batching="token_budget",
             ordering="fcfs", blocks=3000, fast_forward=True, tool_kv="drop", ttl_s=2.0,
             host_blocks=0, controllers=()):
    if shape == "mixed":
        setup = [PoolSetup(name="m", role="mixed", num_replicas=replicas, step_model=STEP,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=1e11,
                           num_host_kv_blocks=host_blocks, host_bw_bytes_per_s=5e10,
                           host_latency_s=1e-5)]
    else:
        setup = [PoolSetup(name="p", role="prefill", num_replicas=replicas, step_model=STEP,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=1e11),
                 PoolSetup(name="d", role="decode", num_replicas=replicas, step_model=STEP,
                           num_kv_blocks=blocks, link_bw_bytes_per_s=1e11)]
    source = ProgramSource(progs, call_timer(setup, MODEL, BUDGET, 0.0), BLOCK,
                           keep_kv=tool_kv != "drop")
    retention = None if tool_kv == "drop" else KVRetention(mode=tool_kv, ttl_s=ttl_s)
    spy = Spy(source)
    records, cluster = simulate_cluster(
        calls_workload(progs, BLOCK, "t"), setup, router=make_router(PolicySpec(name=router)),
        decode_router=LeastLoaded(), make_batch_policy=lambda: make_batch_policy(
            PolicySpec(name=batching)), order_key=make_ordering(ordering),
        rng=np.random.default_rng(0), kv_bytes_per_token=float(MODEL.kv_bytes_per_token_per_gpu(1)),
        link_latency_s=0.0, block_size=16, max_batched_tokens=BUDGET, max_running=16,
        fast_forward=fast_forward, debug=True, until_s=HORIZON_S, source=spy,
        kv_retention=retention, controllers=controllers)
    return records, cluster, source, spy.tags


def check_dependencies(progs, records, source, tags):
    req = records.requests
    finish = {}
    n = sum(p.num_calls for p in progs)
    assert len(req["request_id"]) == n  # every revealed call finished, and all were revealed
    for rid, f in zip(req["request_id"].tolist(), req["finish_s"].tolist(), strict=True):
        tag = tags[rid]
        finish[(tag.program.id, tag.index)] = f
    rows = dict(zip(req["request_id"].tolist(), range(n), strict=True))
    for rid, tag in tags.items():
        prog = source.programs[tag.program.id]
        call = prog.calls[tag.index]
        ready = max((finish[(tag.program.id, p)] + prog.calls[p].tool_s for p in call.parents),
                    default=prog.arrival_s)
        i = rows[rid]
        assert req["arrival_s"][i] == ready
        assert req["first_scheduled_s"][i] >= ready
        assert req["first_token_s"][i] > ready
    return finish


@settings(max_examples=40, deadline=None)
@given(progs=programs(), shape=st.sampled_from(["mixed", "pd"]), replicas=st.integers(1, 3),
       router=st.sampled_from(sorted(ROUTERS)), ordering=st.sampled_from(sorted(ORDERING_POLICIES)),
       blocks=st.sampled_from([120, 3000]))
def test_calls_wait_for_parents_and_tools_everyone_finishes_kv_returns(
        progs, shape, replicas, router, ordering, blocks):
    assume(every_call_fits(progs, blocks))
    records, cluster, source, tags = simulate(progs, shape=shape, replicas=replicas,
                                              router=router, ordering=ordering, blocks=blocks)
    check_dependencies(progs, records, source, tags)
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
    rows = source.records()
    assert np.all(rows["num_finished_calls"] == rows["num_calls"])


@settings(max_examples=40, deadline=None)
@given(progs=programs(max_programs=1), shape=st.sampled_from(["mixed", "pd"]),
       replicas=st.integers(1, 2), router=st.sampled_from(sorted(ROUTERS)),
       batching=st.sampled_from(sorted(BATCH_POLICIES)),
       ordering=st.sampled_from(sorted(ORDERING_POLICIES)))
def test_a_program_alone_never_beats_its_standalone_time(progs, shape, replicas, router,
                                                         batching, ordering):
    _, _, source, _ = simulate(progs, shape=shape, replicas=replicas, router=router,
                               batching=batching, ordering=ordering)
    rows = source.records()
    assert rows["jct_s"][0] >= rows["standalone_s"][0] * (1 - 1e-9)


@settings(max_examples=15, deadline=None)
@given(progs=programs())
def test_fast_forward_equals_stepping(progs):
    fast = simulate(progs, replicas=2)[0].requests
    slow = simulate(progs, replicas=2, fast_forward=False)[0].requests
    for col, values in slow.items():
        assert np.array_equal(values, fast[col], equal_nan=True), col


def test_kv_kept_across_a_tool_wait_is_a_prefix_hit():
    """A follow-up call on the same replica reuses its parent's prompt blocks from the prefix
    cache after the tool wait (the default: cached blocks outlive their request until
    evicted); with room for nothing else they are evicted and recomputed."""
    parent = Call(1000, 10, (), 5.0)
    child = Call(1010 + 200, 10, (0,))
    records, _, _, _ = simulate([Program(0.0, (parent, child))])
    hits = records.requests["num_prefix_hit_tokens"].tolist()
    assert hits == [0, (1000 // BLOCK) * BLOCK]
    assert math.isfinite(records.requests["finish_s"][1])


# ---- KV across tool waits: kept (pinned, time-to-live), offloaded, dropped --------------

def check_nothing_held(cluster):
    """After the run: every GPU block free or evictable, the host tier empty, no record."""
    for replica in cluster.replicas:
        assert replica.kv.num_used_blocks == 0
        kept = replica.kept
        if kept is not None:
            assert not kept.held and not kept.hosted and not kept.loading
            c = kept.counts
            # every record ended at its use or its time-to-live
            assert c["num_kept"] == c["num_used"] + c["num_expired"]
            assert c["num_offloaded"] == (c["num_reloads"] + c["num_reload_unneeded"]
                                          + c["num_reload_skipped"] + c["num_host_expired"])
        if replica.host is not None:
            assert replica.host.num_free_blocks == replica.host.num_blocks


@settings(max_examples=40, deadline=None)
@given(progs=programs(), tool_kv=st.sampled_from(["keep", "offload"]),
       ttl_s=st.sampled_from([0.0, 0.2, 5.0]), replicas=st.integers(1, 2),
       router=st.sampled_from(["round_robin", "prefix_affinity", "autellix_locality"]),
       blocks=st.sampled_from([120, 200, 400, 3000]), host_blocks=st.sampled_from([40, 4000]))
def test_kept_kv_conserves_blocks_ends_at_ttl_or_use_and_never_leaks(
        progs, tool_kv, ttl_s, replicas, router, blocks, host_blocks):
    """Blocks are conserved on the GPU and the host tier after every step (debug), calls
    still wait for parents and tools, everyone finishes, and nothing is held at the end."""
    assume(every_call_fits(progs, blocks))
    records, cluster, source, tags = simulate(
        progs, replicas=replicas, router=router, blocks=blocks, tool_kv=tool_kv, ttl_s=ttl_s,
        host_blocks=host_blocks)
    check_dependencies(progs, records, source, tags)
    check_nothing_held(cluster)


@settings(max_examples=15, deadline=None)
@given(progs=programs(), tool_kv=st.sampled_from(["keep", "offload"]),
       blocks=st.sampled_from([150, 3000]))
def test_fast_forward_equals_stepping_with_kept_kv(progs, tool_kv, blocks):
    assume(every_call_fits(progs, blocks))
    kw = {"replicas": 2, "tool_kv": tool_kv, "ttl_s": 0.5, "blocks": blocks,
          "host_blocks": 4000, "router": "prefix_affinity"}
    fast = simulate(progs, **kw)[0].requests
    slow = simulate(progs, fast_forward=False, **kw)[0].requests
    for col, values in slow.items():
        assert np.array_equal(values, fast[col], equal_nan=True), col


def _hits_and_counts(progs, **kw):
    records, cluster, _, _ = simulate(progs, **kw)
    check_nothing_held(cluster)
    req = records.requests
    order = np.argsort(req["request_id"])
    counts = cluster.replicas[0].kept.counts if cluster.replicas[0].kept else {}
    return req["num_prefix_hit_tokens"][order].tolist(), counts, req, cluster


PARENT = Call(1000, 100, (), 1.0)  # context 1,100 tokens: 17 full blocks, 15 of them prompt
CHILD = Call(1100 + 200, 10, (0,))


def test_kept_kv_gives_the_child_its_parents_whole_context():
    """keep: the child skips the parent's prompt *and* output blocks; drop: only the prompt
    blocks the prefix cache still has."""
    drop, _, _, _ = _hits_and_counts([Program(0.0, (PARENT, CHILD))])
    keep, counts, _, _ = _hits_and_counts([Program(0.0, (PARENT, CHILD))], tool_kv="keep")
    assert drop == [0, (1000 // BLOCK) * BLOCK]
    assert keep == [0, (1100 // BLOCK) * BLOCK]
    assert counts["num_kept"] == counts["num_used"] == 1 and counts["num_expired"] == 0


def test_kept_kv_is_released_at_its_time_to_live():
    """A tool longer than the time-to-live: the pin ends unused (the blocks stay only as
    evictable cache entries, which the child still hits here: nothing needed the room)."""
    slow = Call(1000, 100, (), 3.0)
    hits, counts, _, _ = _hits_and_counts([Program(0.0, (slow, CHILD))], tool_kv="keep",
                                          ttl_s=0.5)
    assert counts["num_kept"] == counts["num_expired"] == 1 and counts["num_used"] == 0
    assert hits[1] == (1100 // BLOCK) * BLOCK


def test_pinned_kv_holds_its_blocks_until_the_time_to_live():
    """With room for one context only, another program's call waits for the pin to end
    (keep), or takes the room at once (drop: the cached blocks are evicted)."""
    other = Program(1.5, (Call(1800, 10, ()),))  # arrives during the 3 s tool wait
    progs = [Program(0.0, (Call(1000, 100, (), 3.0), CHILD)), other]
    kw = {"blocks": 120, "ttl_s": 2.5}
    _, _, keep, _ = _hits_and_counts(progs, tool_kv="keep", **kw)
    _, _, drop, _ = _hits_and_counts(progs, **kw)
    first_end = float(np.min(keep["finish_s"]))
    other_row = int(np.argmax(keep["num_prompt_tokens"] == 1800))
    assert keep["first_scheduled_s"][other_row] >= first_end + 2.5  # waited for the TTL
    assert drop["first_scheduled_s"][other_row] == 1.5


def test_offloaded_kv_is_reloaded_over_the_host_link_and_reused():
    """offload: another call evicts the GPU copy during the tool wait; the child's arrival
    reloads the context from the host tier (bytes over PCIe, time before it is queued) and
    then skips its whole context; drop recomputes what was evicted."""
    other = Program(1.2, (Call(1800, 10, ()),))
    progs = [Program(0.0, (Call(1000, 100, (), 1.0), CHILD)), other]
    hits, counts, req, cluster = _hits_and_counts(progs, tool_kv="offload", blocks=140,
                                                  host_blocks=4000)
    assert counts["num_offloaded"] == counts["num_reloads"] == 1
    # the GPU lost the tail (LRU evicts a released chain tail first): only that comes back
    assert 0 < counts["num_reloaded_tokens"] < (1100 // BLOCK) * BLOCK
    reload_bytes = cluster.transfers.num_bytes_by_client["kv_reload"]
    assert reload_bytes == counts["num_reloaded_tokens"] * MODEL.kv_bytes_per_token_per_gpu(1)
    child = int(np.argmax(req["num_prompt_tokens"] == 1300))
    assert hits[child] == (1100 // BLOCK) * BLOCK
    assert req["first_scheduled_s"][child] > req["arrival_s"][child]  # the reload took time
    drop_hits, _, _, _ = _hits_and_counts(progs, blocks=140)
    assert drop_hits[child] < (1000 // BLOCK) * BLOCK  # drop: the evicted tail recomputed


def test_offload_without_host_room_leaves_only_evictable_entries():
    """No host room: nothing is held or copied; the context's blocks (outputs included) stay
    as evictable entries, which the child hits here (nothing needed the room)."""
    hits, counts, _, cluster = _hits_and_counts([Program(0.0, (PARENT, CHILD))],
                                                tool_kv="offload", host_blocks=8)
    assert counts["num_offload_skipped"] == 1 and counts["num_offloaded"] == 0
    assert "kv_offload" not in cluster.transfers.num_bytes_by_client
    assert hits == [0, (1100 // BLOCK) * BLOCK]
