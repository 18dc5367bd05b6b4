"""Program-level policies: their keys on tagged calls and on plain requests, the routers'
choices, and whole runs through ``run()`` by name."""

from __future__ import annotations

import pytest

from fleetsim.config import config_from_dict
from fleetsim.policies import make_batch_policy
from fleetsim.policies.programs import AutellixLocality, HexAGenTPlacement, SpeedAware
from fleetsim.programs import Call, Program
from fleetsim.programs.source import ProgramCall, ProgramState
from fleetsim.registry import PolicySpec
from fleetsim.run import run
from fleetsim.serving.request import Request

PROGRAM_POLICIES = ("workflow_fcfs", "plas", "atlas", "workflow_llf", "hexagent")


def tagged(rid, *, arrival_s, program_arrival_s, service_s=0.0, path_service_s=0.0,
           horizon_s=10.0, est_s=1.0, path_s=1.0, pid=0):
    state = ProgramState(pid, Program(program_arrival_s, (Call(1, 1),)), horizon_s)
    state.service_s, state.horizon_s = service_s, horizon_s
    tag = ProgramCall(state, 0, est_s, path_s, path_service_s)
    return Request(id=rid, arrival_s=arrival_s, num_prompt_tokens=10, max_output_tokens=5,
                   program=tag)


def key(name, req, now_s=100.0, **args):
    return make_batch_policy(PolicySpec(name=name, args=args)).order_key(req, now_s)


def test_workflow_fcfs_puts_older_programs_first():
    old = tagged(1, arrival_s=50.0, program_arrival_s=0.0)
    new = tagged(2, arrival_s=10.0, program_arrival_s=5.0)
    assert key("workflow_fcfs", old) < key("workflow_fcfs", new)


def test_plas_serves_least_attained_program_first_and_atlas_uses_the_path():
    hog = tagged(1, arrival_s=90.0, program_arrival_s=80.0, service_s=9.0, path_service_s=0.0)
    light = tagged(2, arrival_s=95.0, program_arrival_s=90.0, service_s=0.0, path_service_s=9.0)
    assert key("plas", light) < key("plas", hog)
    assert key("atlas", hog) < key("atlas", light)


def test_plas_anti_starvation_promotes_a_long_waiting_program():
    starved = tagged(1, arrival_s=99.0, program_arrival_s=0.0, service_s=9.0)
    fresh = tagged(2, arrival_s=99.0, program_arrival_s=98.0, service_s=0.5)
    assert key("plas", starved)[0] == 0 and key("plas", fresh)[0] == 0
    assert key("plas", starved, starvation_ratio=100.0)[0] > 0


def test_llf_and_hexagent_prefer_the_program_closest_to_its_deadline():
    tight = tagged(1, arrival_s=99.0, program_arrival_s=90.0, horizon_s=5.0, path_s=5.0)
    loose = tagged(2, arrival_s=99.0, program_arrival_s=90.0, horizon_s=50.0, path_s=5.0)
    for name in ("workflow_llf", "hexagent"):
        assert key(name, tight) < key(name, loose), name


@pytest.mark.parametrize("name", PROGRAM_POLICIES)
def test_program_policies_order_plain_requests_by_arrival(name):
    a = Request(id=1, arrival_s=1.0, num_prompt_tokens=5, max_output_tokens=5)
    b = Request(id=2, arrival_s=2.0, num_prompt_tokens=5, max_output_tokens=5)
    assert key(name, a) < key(name, b)


class _KV:
    def __init__(self, free_blocks):
        self.num_available_blocks = free_blocks

    def num_blocks_for(self, num_tokens):
        return -(-num_tokens // 16)


class _Replica:
    """A replica as routers read it: prefill at ``per_token_s`` a token, decode steps of
    ``decode_step_s``, ``free_blocks`` of KV free."""

    def __init__(self, rid, load, per_token_s, *, role="mixed", decode_step_s=0.01,
                 free_blocks=10**6, link_bw=1e11):
        self.replica_id, self.load_tokens, self._per = rid, load, per_token_s
        self.role, self._decode_step_s, self.kv = role, decode_step_s, _KV(free_blocks)
        self.running = self.waiting = ()
        self.num_incoming, self.max_running, self.hash_block_tokens = 0, 256, None
        self.link_bw_bytes_per_s, self.kv_bytes_per_token = link_bw, 1e5
        self.block_size = 16

    def decode_load(self):
        return (len(self.running), sum(r.num_tokens for r in self.running), len(self.waiting),
                self.kv.num_available_blocks)

    def step_time_s(self, chunks, num_decode, kv):
        return sum(n for n, _ in chunks) * self._per + (self._decode_step_s if num_decode
                                                        else 0.0)

    def num_matched_entries(self, req):
        return 0


class _View:
    def __init__(self, replicas, next_stage=()):
        self.replicas, self.next_stage = replicas, next_stage


def test_hexagent_placement_weighs_backlog_by_each_replica_speed():
    slow_idle, fast_busy = _Replica(0, 0, 3e-4), _Replica(1, 1000, 1e-4)
    req = Request(id=1, arrival_s=0.0, num_prompt_tokens=1000, max_output_tokens=5)
    assert HexAGenTPlacement().route(_View([slow_idle, fast_busy]), req, 0.0) == 1
    assert HexAGenTPlacement().route(_View([slow_idle, _Replica(1, 9000, 1e-4)]), req, 0.0) == 0


def test_hexagent_plans_prefill_and_decode_jointly_with_transfer_and_decode_waits():
    """Two prefill replicas (one faster) and two decode replicas: the plan is the pair with
    the earliest projected completion, the decode replica without KV room loses even when
    faster, a slow link counts, and the plan's Delta is what the priority then reads."""
    prefill = [_Replica(0, 0, 2e-4, role="prefill"), _Replica(1, 0, 1e-4, role="prefill")]
    fast_full = _Replica(2, 0, 1e-4, role="decode", decode_step_s=0.005, free_blocks=0)
    slow_free = _Replica(3, 0, 1e-4, role="decode", decode_step_s=0.008)
    req = tagged(1, arrival_s=0.0, program_arrival_s=0.0)
    req.num_prompt_tokens, req.max_output_tokens = 1000, 100
    router = HexAGenTPlacement()
    assert router.route(_View(prefill, [fast_full, slow_free]), req, 0.0) == 1
    plan = req.program.policy
    transfer_s = 1e5 * 1000 / 1e11
    assert plan.decode_replica_id == 3
    assert plan.delta_s == pytest.approx(1000 * 1e-4 + transfer_s + 100 * 0.008)
    # the decode router takes the planned replica while it can hold the call
    assert HexAGenTPlacement().route(_View([fast_full, slow_free]), req, 0.1) == 1
    # a slow link to the fast prefill replica moves the plan to the other one
    prefill[1].link_bw_bytes_per_s = 1e8
    router.route(_View(prefill, [fast_full, slow_free]), req, 0.0)
    assert req.program.policy.delta_s == pytest.approx(
        1000 * 2e-4 + transfer_s + 100 * 0.008)
    # the batching policy's risk uses the plan's Delta
    assert key("hexagent", req, now_s=1.0)[0] == pytest.approx(
        -(1.0 + req.program.policy.delta_s) / 10.0)


def test_autellix_locality_pins_long_programs_to_their_replica():
    router = AutellixLocality(long_program_s=1.0)
    reps = [_Replica(0, 0, 1.0), _Replica(1, 50, 1.0)]
    first = tagged(1, arrival_s=0.0, program_arrival_s=0.0, pid=7)
    assert router.route(_View(reps), first, 0.0) == 0
    reps[0].load_tokens = 500
    later = tagged(2, arrival_s=1.0, program_arrival_s=0.0, pid=7, service_s=2.0)
    later.program.program = first.program.program
    first.program.program.service_s = 2.0
    assert router.route(_View(reps), later, 1.0) == 0 and router.num_pinned_routes == 1
    short = tagged(3, arrival_s=1.0, program_arrival_s=1.0, pid=8)
    assert router.route(_View(reps), short, 1.0) == 1


@pytest.mark.parametrize("name", PROGRAM_POLICIES)
def test_every_program_policy_runs_by_name_and_finishes_everything(name):
    cfg = config_from_dict({"hardware": {"num_replicas": 2},
                            "cluster": {"router": {"name": "autellix_locality"}},
                            "policy": {"batching": {"name": name}},
                            "programs": {"generator": "mixed", "num_programs": 15,
                                         "rate_per_s": 4.0}})
    prog = run(cfg).summary["programs"]
    assert prog["num_finished"] == 15 and prog["slo_scale"]["req95"] >= 1.0


def test_a_policy_keeping_its_own_state_leaves_the_program_tag_alone():
    """FastServe keeps its queue levels in ``Request.policy_state``; programs tag their calls
    in ``Request.program``, so the two can run together and programs keep their metrics."""
    from fleetsim.config import config_from_dict
    from fleetsim.run import run

    cfg = {"programs": {"generator": "lats", "num_programs": 6},
           "policy": {"batching": {"name": "fastserve"}},
           "engine": {"swap_space_gib": 4.0, "debug": True}}
    s = run(config_from_dict(cfg)).summary
    assert s["programs"]["num_programs"] == 6
    assert s["num_unfinished"] == 0


@pytest.mark.parametrize("name", ["plas", "atlas"])
def test_waiting_calls_are_rekeyed_as_their_program_attains_service(tmp_path, name):
    """One running slot. Program A runs a long call a1 while its sibling a2 and program B's
    b1 wait, a2 ahead (older program, both without service). When a1 finishes, A has
    attained ~2.5 s: PLAS re-keys a2 below b1, so b1 runs first. (ATLAS keys a2 by its own
    path's service, none: a2 stays first.)"""
    a1, a2, b1 = _first_scheduled_on_one_slot(
        tmp_path, name, [Program(0.0, (Call(100, 400), Call(100, 5)), kind="a"),
                         Program(0.1, (Call(100, 5),), kind="b")],
        {"preemptive": False})  # the order of waiting calls alone (no preemption)
    assert a1 == 0.0
    if name == "plas":
        assert b1 < a2
    else:
        assert a2 < b1


def test_hexagent_reevaluates_risk_as_time_passes(tmp_path):
    """One running slot, held by program A's long call. Program P's long call x (horizon
    ~2 s) queues just before program Q's 5-token call y (horizon ~0.05 s): when y queues,
    x's risk 1 + 0.05/H_P is the higher, but y's grows at 1/H_Q, 40x faster, so by the time
    A's call ends y is far riskier and runs first. Keys fixed at queueing would run x
    first."""
    a, x, y = _first_scheduled_on_one_slot(
        tmp_path, "hexagent", [Program(0.0, (Call(100, 400),), kind="a"),
                               Program(0.05, (Call(100, 300),), kind="p"),
                               Program(0.1, (Call(100, 5),), kind="q")])
    assert a == 0.0
    assert y < x


def _first_scheduled_on_one_slot(tmp_path, policy, programs, args=None):
    """When each call (in id order) was first scheduled, with one running slot."""
    from fleetsim.programs import dump_jsonl

    path = tmp_path / "p.jsonl"
    path.write_text(dump_jsonl(programs))
    cfg = config_from_dict({
        "engine": {"max_running": 1, "debug": True},
        "policy": {"batching": {"name": policy, "args": args or {}}},
        "programs": {"generator": "jsonl", "path": str(path), "arrival": "trace"}})
    req = run(cfg).records.requests
    first = dict(zip(req["request_id"].tolist(), req["first_scheduled_s"].tolist(),
                     strict=True))
    return [first[i] for i in sorted(first)]


@pytest.mark.parametrize("name", ["plas", "atlas"])
def test_autellix_preempts_a_demoted_call_for_a_new_program(tmp_path, name):
    """One running slot. Program A's one long call (400 output tokens, about 3 s) runs past
    the top queues' quanta (1 s, 2 s), so it is demoted; program B's short call arrives at
    1.5 s in the top queue and preempts it: B runs at once, and A's call runs again after.
    Without preemption B waits for A's call to finish."""
    programs = [Program(0.0, (Call(100, 400),), kind="a"),
                Program(1.5, (Call(100, 5),), kind="b")]
    a, b = _first_scheduled_on_one_slot(tmp_path, name, programs)
    a_np, b_np = _first_scheduled_on_one_slot(tmp_path, name, programs,
                                              {"preemptive": False})
    assert a == a_np == 0.0
    assert b == pytest.approx(1.5, abs=0.05)
    assert b_np > 2.5  # after A's whole call


def test_speed_aware_router_sends_each_stage_where_it_ends_first():
    """Prefill: the faster replica unless its backlog makes it finish later; decode: the
    faster step unless it has no KV room for the call (then it waits about one decode)."""
    slow_idle, fast_busy = (_Replica(0, 0, 3e-4, role="prefill"),
                            _Replica(1, 1000, 1e-4, role="prefill"))
    req = Request(id=1, arrival_s=0.0, num_prompt_tokens=1000, max_output_tokens=100)
    assert SpeedAware().route(_View([slow_idle, fast_busy]), req, 0.0) == 1
    fast_busy.load_tokens = 9000
    assert SpeedAware().route(_View([slow_idle, fast_busy]), req, 0.0) == 0
    slow = _Replica(2, 0, 1e-4, role="decode", decode_step_s=0.008)
    fast = _Replica(3, 0, 1e-4, role="decode", decode_step_s=0.005)
    assert SpeedAware().route(_View([slow, fast]), req, 0.0) == 1
    fast.kv = _KV(0)
    assert SpeedAware().route(_View([slow, fast]), req, 0.0) == 0
    # it plans nothing for the batching policy (HexAGenT's Delta is its own)
    call = tagged(2, arrival_s=0.0, program_arrival_s=0.0)
    SpeedAware().route(_View([slow_idle, fast_busy]), call, 0.0)
    assert call.program.policy is None


class _BatchReplica(_Replica):
    """A decode replica whose step time grows with its batch."""

    def step_time_s(self, chunks, num_decode, kv):
        return self._decode_step_s * num_decode


def test_decode_estimates_count_the_calls_waiting_on_a_decode_replica():
    """Two equal decode replicas, three calls already waiting on the first: the call goes
    to the second (a batch of one, not four)."""
    busy = _BatchReplica(0, 0, 1e-4, role="decode", decode_step_s=0.01)
    idle = _BatchReplica(1, 0, 1e-4, role="decode", decode_step_s=0.01)
    busy.waiting = tuple(Request(id=10 + i, arrival_s=0.0, num_prompt_tokens=10,
                                 max_output_tokens=5) for i in range(3))
    req = Request(id=1, arrival_s=0.0, num_prompt_tokens=100, max_output_tokens=50)
    for router in (SpeedAware(), HexAGenTPlacement()):
        assert router.route(_View([busy, idle]), req, 0.0) == 1


def test_hexagent_replans_the_decode_stage_at_the_handoff():
    """The plan chose the slower decode replica (made at prefill routing); at the handoff a
    faster one would finish the call sooner: with ``replan_decode`` the call goes there,
    without it the planned replica keeps it while it can hold the call."""
    slow = _Replica(0, 0, 1e-4, role="decode", decode_step_s=0.008)
    fast = _Replica(1, 0, 1e-4, role="decode", decode_step_s=0.005)
    req = tagged(1, arrival_s=0.0, program_arrival_s=0.0)
    req.num_prompt_tokens, req.max_output_tokens = 1000, 100
    from fleetsim.policies.programs import Plan

    req.program.policy = Plan(decode_replica_id=0, delta_s=1.0)
    assert HexAGenTPlacement().route(_View([slow, fast]), req, 0.0) == 1
    assert HexAGenTPlacement(replan_decode=False).route(_View([slow, fast]), req, 0.0) == 0
    fast._decode_step_s = 0.008  # equal now: the planned replica first among equals
    assert HexAGenTPlacement().route(_View([slow, fast]), req, 0.0) == 0


def test_decode_load_reads_what_the_queues_and_the_kv_cache_show(monkeypatch):
    """``ReplicaView.decode_load`` (the decode estimates' one read of a decode replica),
    read first, equals the running calls, their tokens, the waiting calls and the free KV the
    view then shows, windows in flight included (a read that left a window running would
    lag by the steps it has done)."""
    from fleetsim.repro import hexagent

    route = SpeedAware.route
    seen = {"reads": 0, "in_window": 0}

    def checking_route(self, view, req, now_s):
        for d in view.replicas:
            if d.role == "decode":
                step = d._replica.current_step
                seen["in_window"] += step is not None and step.window is not None
                load = d.decode_load()
                assert load == (len(d.running), sum(r.num_tokens for r in d.running),
                                len(d.waiting), d.kv.num_available_blocks)
                seen["reads"] += 1
        return route(self, view, req, now_s)

    monkeypatch.setattr(SpeedAware, "route", checking_route)
    cfg = hexagent.config({"name": "workflow_fcfs"}, hexagent.SPEED, hexagent.SPEED,
                          "llama-3.1-70b", "lats", 8.0, 20)
    assert run(config_from_dict(cfg)).summary["programs"]["num_finished"] == 20
    assert seen["in_window"] > 20 and seen["reads"] > seen["in_window"]
