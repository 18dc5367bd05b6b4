"""Shared fluid resources (``serving/resources.py``) and steps as jobs on them
(``serving/shared_steps.py``): hand-computed schedules, and the trivial form (no contention)
equal to a plain replica request by request."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.conftest import by_id, make_workload

from fleetsim.core.simulator import Simulator
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.policies.routing import LeastLoaded, RoundRobin
from fleetsim.serving.cluster import PoolSetup, simulate_cluster
from fleetsim.serving.resources import SharedResources, max_min_rates
from fleetsim.serving.shared_steps import SharedStepModel, StepDemand


def _finish_times(jobs_spec, capacity):
    sim = Simulator()
    svc = SharedResources(sim)
    for r, c in capacity.items():
        svc.add(r, c)
    done = {}
    for name, (at_s, work, uses, kw) in jobs_spec.items():
        sim.schedule(at_s, 1, (name, work, uses, kw))

    def submit(payload):
        name, work, uses, kw = payload
        svc.start(work, uses, lambda job, name=name: done.__setitem__(name, sim.now_s), **kw)

    sim.on(1, submit, "submit")
    sim.run()
    return done, svc


def test_two_equal_jobs_share_a_link_then_the_survivor_speeds_up():
    # 10 units/s; a: 10 units at 0, b: 5 units at 0 -> 5/s each; b done at 1, a has 5 left
    # at 10/s -> done at 1.5.
    done, svc = _finish_times({"a": (0.0, 10.0, {"bus": 1.0}, {}),
                               "b": (0.0, 5.0, {"bus": 1.0}, {})}, {"bus": 10.0})
    assert done == {"b": pytest.approx(1.0), "a": pytest.approx(1.5)}
    assert svc.used_by_resource["bus"] == pytest.approx(15.0)


def test_weights_split_capacity_and_caps_hand_the_rest_to_others():
    # Weights 3:1 on 8 units/s -> 6 and 2; a capped job at 1/s leaves 7 to the other.
    assert max_min_rates_of([(3.0, math.inf), (1.0, math.inf)], 8.0) == [6.0, 2.0]
    assert max_min_rates_of([(1.0, 1.0), (1.0, math.inf)], 8.0) == [1.0, 7.0]


def max_min_rates_of(weight_caps, capacity):
    from fleetsim.serving.resources import Job
    jobs = [Job(1.0, {"r": 1.0}, w, cap, lambda j: None, None, "") for w, cap in weight_caps]
    return max_min_rates(jobs, {"r": capacity})


def test_a_job_on_two_resources_is_held_by_the_tighter():
    # A DDR-like bus of 10 and a link of 4: a job on both moves at 4; another on the bus
    # alone then gets the 6 left (max-min, not an equal split of the bus).
    from fleetsim.serving.resources import Job
    jobs = [Job(1.0, {"bus": 1.0, "link": 1.0}, 1.0, math.inf, lambda j: None, None, ""),
            Job(1.0, {"bus": 1.0}, 1.0, math.inf, lambda j: None, None, "")]
    assert max_min_rates(jobs, {"bus": 10.0, "link": 4.0}) == [4.0, 6.0]


def test_delay_then_work_and_bad_jobs_are_refused():
    done, _ = _finish_times({"a": (0.0, 2.0, {"r": 1.0}, {"delay_s": 0.5})}, {"r": 4.0})
    assert done["a"] == pytest.approx(1.0)
    sim = Simulator()
    svc = SharedResources(sim)
    svc.add("r", 1.0)
    with pytest.raises(ValueError, match="undeclared"):
        svc.start(1.0, {"x": 1.0}, lambda j: None)
    with pytest.raises(ValueError, match="weight"):
        svc.start(1.0, {"r": 1.0}, lambda j: None, weight=0.0)
    with pytest.raises(ValueError, match="capacity"):
        svc.add("z", 0.0)


# ---- steps as jobs -----------------------------------------------------------------------
class FixedSplit:
    """Every step: ``private_s`` then ``work`` units (``weight`` in the share)."""

    def __init__(self, private_s: float, work: float, weight: float = 1.0) -> None:
        self.d = StepDemand(private_s, work, weight)

    def split(self, chunks, num_decode, kv_tokens):
        return self.d


class TokenSplit:
    """Private and shared parts that grow with the step's tokens and KV."""

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def split(self, chunks, num_decode, kv_tokens):
        tokens = sum(n for n, _ in chunks) + num_decode
        return StepDemand(0.002 + 2e-5 * tokens + 1e-7 * kv_tokens, 0.003 + 4e-5 * tokens,
                          self.weight)


class Plain:
    """The same step times as a ``SharedStepModel`` alone, but not one (a plain model)."""

    def __init__(self, model: SharedStepModel) -> None:
        self.model = model

    def step_time_s(self, chunks, num_decode, kv_tokens):
        return self.model.step_time_s(chunks, num_decode, kv_tokens)

    def decode_step_times_s(self, num_decode, kv_tokens):
        return self.model.decode_step_times_s(num_decode, kv_tokens)


def pool(name, role, model, n=1):
    return PoolSetup(name=name, role=role, num_replicas=n, step_model=model,
                     num_kv_blocks=4000, link_bw_bytes_per_s=math.inf)


def run(workload, pools, fast_forward=True, router=None):
    return simulate_cluster(
        workload, pools, router=router or RoundRobin(), decode_router=LeastLoaded(),
        make_batch_policy=TokenBudgetPlanner, order_key=make_ordering("fcfs"),
        rng=np.random.default_rng(0), kv_bytes_per_token=0.0, link_latency_s=0.0,
        block_size=16, max_batched_tokens=2048, max_running=64, fast_forward=fast_forward,
        debug=True)


def test_two_replicas_prefilling_at_once_share_the_pool_by_weight():
    """Alone a step takes 0.5 s private + 1 unit at 1/s = 1.5 s. Both start at 0: A holds,
    B's work starts at 0.5 and turns A's rest into a job; weights 3:1 -> A at 0.75/s ends at
    0.5 + 1/0.75, B has 2/3 left at the whole pool -> ends at 2.5 (work conserved)."""
    a = SharedStepModel(FixedSplit(0.5, 1.0, 3.0), "sms", 1.0)
    b = SharedStepModel(FixedSplit(0.5, 1.0, 1.0), "sms", 1.0)
    w = make_workload([0.0, 0.0], [100, 100], [1, 1])
    rec, cluster = run(w, [pool("a", "mixed", a), pool("b", "mixed", b)])
    first = by_id(rec, "first_token_s")
    assert first[0] == pytest.approx(0.5 + 1 / 0.75)
    assert first[1] == pytest.approx(2.5)
    assert cluster.resources is not None
    # A's held part (0 to 0.5) was private: both steps' whole work ran as jobs.
    assert cluster.resources.used_by_resource["sms"] == pytest.approx(2.0)


def test_overlap_hides_the_private_part_behind_the_shared_one():
    m = SharedStepModel(FixedSplit(0.5, 1.0), "sms", 1.0, overlap=True)
    w = make_workload([0.0], [100], [1])
    rec, _ = run(w, [pool("a", "mixed", m)])
    assert by_id(rec, "first_token_s")[0] == pytest.approx(1.0)


def _workload(n=80, seed=1, rate=30.0):
    rng = np.random.default_rng(seed)
    return make_workload(np.cumsum(rng.exponential(1 / rate, n)), rng.integers(1, 900, n),
                         rng.integers(1, 200, n))


@pytest.mark.parametrize("fast_forward", [True, False])
def test_alone_on_its_resource_a_replica_equals_a_plain_one(fast_forward):
    """The trivial form: each pool on its own resource (no contention) gives exactly the
    plain engine's results, request by request, colocated and P/D."""
    w = _workload()
    p = SharedStepModel(TokenSplit(), "pool_p", 2.0)
    d = SharedStepModel(TokenSplit(), "pool_d", 2.0)
    cols = ("first_token_s", "finish_s", "replica_id")
    for layout in ([("m", "mixed", p)], [("p", "prefill", p), ("d", "decode", d)]):
        shared, _ = run(w, [pool(n, r, m) for n, r, m in layout], fast_forward)
        plain, _ = run(w, [pool(n, r, Plain(m)) for n, r, m in layout], fast_forward)
        for c in cols:
            assert by_id(shared, c) == by_id(plain, c), (layout, c)


def test_sharing_slows_both_phases_and_conserves_work():
    """P/D sharing one pool: every step's work is done once, and sharing costs time."""
    w = _workload(60)
    split = TokenSplit()
    one = [pool("p", "prefill", SharedStepModel(split, "sms", 2.0)),
           pool("d", "decode", SharedStepModel(split, "sms", 2.0))]
    own = [pool("p", "prefill", SharedStepModel(split, "sms_p", 2.0)),
           pool("d", "decode", SharedStepModel(split, "sms_d", 2.0))]
    rec_one, cluster = run(w, one)
    rec_own, _ = run(w, own)
    assert len(rec_one.requests["request_id"]) == 60
    e2e_one = rec_one.requests["finish_s"].sum()
    e2e_own = rec_own.requests["finish_s"].sum()
    assert e2e_one > e2e_own
    svc = cluster.resources
    assert svc is not None and svc.num_jobs > 0
    assert not svc.active


def _claim_then_start(claim: bool):
    """Job a (1 unit at 1/s) from 0; at 1.0, exactly when a is done, a client starts job b
    (1 unit): directly, or by claiming to run beside a (``claim_beside``) and starting b only
    when the service tells it (as a window opened at that instant does: its first step's
    job starts then). Returns the finish times and the service."""
    sim = Simulator()
    svc = SharedResources(sim)
    svc.add("ddr", 1.0)
    done = {}

    def start(name):
        svc.start(1.0, {"ddr": 1.0}, lambda job: done.__setitem__(name, sim.now_s),
                  client=name)

    def at_one(_):
        assert svc.job_beside({"ddr": 1.0}, "b") is not None
        if claim:
            svc.claim_beside(lambda: start("b"))
        else:
            start("b")

    start("a")
    sim.schedule(1.0, 31, None)  # (before a's check at 1.0: RESOURCE_CHECK is 33)
    sim.on(31, at_one, "at_one")
    sim.run()
    return done, svc


def test_a_check_during_a_claim_follows_the_claimants_start_as_stepping_orders_them():
    """A check that comes while a client claims to run beside the job it checks
    (``claim_beside``) tells the client first and is not lost: it follows the job the client
    starts then, and the run is the one where the job started at once (finish times,
    allocations and work, bit for bit)."""
    direct, svc_direct = _claim_then_start(False)
    claimed, svc_claimed = _claim_then_start(True)
    assert claimed == direct == {"a": 1.0, "b": 2.0}
    assert svc_claimed.num_changes == svc_direct.num_changes
    assert svc_claimed.work_by_client == svc_direct.work_by_client
    assert svc_claimed.used_by_resource == svc_direct.used_by_resource
    assert svc_claimed.job_beside({"ddr": 1.0}, "b") is None  # (nothing active at the end)


class _OneLink:
    """A window's chain (``BesideChain``) as a stub: job a's end at 1.0 is a link whose
    successor, a job of 2 units from client "a", is priced to start at 1.5."""

    def __init__(self, svc: SharedResources) -> None:
        self.svc = svc
        self.cuts: list[float] = []
        self.successor = None

    def takes_done(self, now_s):
        return 1.5 if now_s == 1.0 else -1.0

    def expects(self, work, uses, weight, max_rate, delay_s, client, now_s):
        return work == 2.0 and client == "a" and now_s == 1.5

    def adopt(self, job, now_s):
        if job.work == 2.0 and now_s == 1.5:
            self.successor = job
            return 3.5  # (its end, at the whole resource: the window ends there)
        return -1.0

    def started(self, index):
        return self.successor is not None

    def on_change(self):
        """The window ends now: the service as stepping leaves it (the successor, if
        started, at the whole resource since)."""
        now_s = self.svc.sim.now_s
        self.cuts.append(now_s)
        b = self.successor
        left = 2.0 - (now_s - 1.5) if b is not None else 0.0
        self.svc.resume_beside(now_s, b, left, 1.0, {}, 0.0, "ddr", 0, 0, None,
                               now_s + left if b is not None else math.inf, True)


def _chained(at_1_5):
    """Job a (1 unit at 1/s) from 0; at 0.5 a client claims to run beside it with the stub
    chain (its check at a's end, 1.0); ``at_1_5(svc, done)`` runs at 1.5, after step ends,
    as a's replica would plan its next step."""
    sim = Simulator()
    svc = SharedResources(sim)
    svc.add("ddr", 1.0)
    done: dict[str, float] = {}
    chain = _OneLink(svc)

    def claim(_):
        assert svc.job_beside({"ddr": 1.0}, "b") is not None
        svc.claim_beside(chain.on_change, chain)
        svc.check_at(1.0)

    svc.start(1.0, {"ddr": 1.0}, lambda job: done.__setitem__("a", sim.now_s), client="a")
    sim.schedule(0.5, 1, None)
    sim.on(1, claim, "claim")
    sim.schedule(1.5, 40, None)  # (a STEP_END's kind: before the chain's check, 41)
    sim.on(40, lambda _: at_1_5(svc, done), "at_1_5")
    sim.run()
    return done, chain, svc


def test_a_chain_link_ends_the_job_and_its_window_waits_for_the_successor():
    """A window's chain (``claim_beside`` with a ``BesideChain``): at the job's end the
    service asks the chain, which takes it as a link: the job is done then (its replica
    hears at once) and the window runs on. Its successor, started as priced, is adopted
    (active, the window not ended); another job, or none by the successor's start, ends the
    window there, before anything else reads the service."""

    def start_successor(svc, done):
        svc.start(2.0, {"ddr": 1.0}, lambda job: done.__setitem__("succ", svc.sim.now_s),
                  client="a")

    done, chain, svc = _chained(start_successor)
    assert done == {"a": 1.0, "succ": 3.5} and chain.successor is not None
    assert chain.cuts == [3.5]  # (not at its start: at its end, no link)

    done, chain, svc = _chained(lambda svc, done: None)  # the replica starts nothing
    assert done == {"a": 1.0} and chain.cuts == [1.5]
    assert not svc.active

    def start_another(svc, done):
        svc.start(3.0, {"ddr": 1.0}, lambda job: done.__setitem__("other", svc.sim.now_s),
                  client="a")

    done, chain, svc = _chained(start_another)
    assert chain.cuts == [1.5] and chain.successor is None
    assert done == {"a": 1.0, "other": 4.5}
