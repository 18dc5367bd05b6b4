"""ReLibra's two timescales on hand-made cases (cross-node reorder, in-node replication), the
training transfer costs of ``moe/reshuffle.py`` by hand, determinism, and ``fleetsim repro
relibra``'s bad input."""

from __future__ import annotations

import numpy as np
import pytest

from fleetsim.cli import main
from fleetsim.errors import FleetsimInputError
from fleetsim.moe.balancers import NoBalancing
from fleetsim.moe.overheads import OverheadModel
from fleetsim.moe.placement import BalanceView, reorder_across_nodes
from fleetsim.moe.reshuffle import (
    BatchTransfers,
    TrainingStateBytes,
    batch_exposed_s,
    batch_transfers,
    choose_owners,
    new_replicas,
    pipelined_exposed_s,
    replica_sync_s,
    static_owners,
)
from fleetsim.moe.two_timescale import TwoTimescalePlanner

STATE = TrainingStateBytes()  # 2 + 12 bytes move with an owner, 4 bytes of gradient back
PARAMS = 1e6  # parameters per expert
INTRA, INTER = 400e9, 50e9


def _transfers(phy2log, owner, spg, *, params=PARAMS, gpn=2):
    return batch_transfers(np.array(phy2log), np.array(owner), slots_per_gpu=spg,
                           gpus_per_node=gpn, params_per_expert=params, state=STATE,
                           intra_bytes_per_s=INTRA, inter_bytes_per_s=INTER, link_latency_s=0.0)


def _node_loads(masters, load, per_node):
    """Routed tokens per node when the masters (columns in GPU order, ``per_node`` per node)
    serve everything."""
    tokens = np.take_along_axis(load, np.asarray(masters), 1)
    return tokens.reshape(load.shape[0], -1, per_node).sum(-1)


# ---- inter-batch timescale: reorder across nodes -------------------------------------------

def test_reorder_swaps_the_pair_that_levels_two_nodes():
    # node 0 holds 10 + 6 + 5 = 21, node 1 1.5 + 2.5 + 4 = 8: the gap is 13. The swap whose
    # difference is closest to half of it (6.5) trades 10 for 4 (difference 6): 15 vs 14.
    load = np.array([[10.0, 6.0, 5.0, 1.5, 2.5, 4.0]])
    start = np.array([[0, 0, 0, 1, 1, 1]])
    node = reorder_across_nodes(load, start, 2, max_swaps=1)
    assert node.tolist() == [[1, 0, 0, 1, 1, 0]]
    assert np.bincount(node[0], weights=load[0]).tolist() == [15.0, 14.0]
    assert reorder_across_nodes(load, start, 2, max_swaps=0).tolist() == start.tolist()


MASTERS = [0, 1, 3, 4, 6, 7, 9, 10]  # 4 GPUs x (2 masters + 1 spare slot)


def test_batch_start_reorder_lowers_the_cross_node_max_load():
    # 4 GPUs in 2 nodes, 2 masters + 1 spare slot each; Megatron's order puts the 4 hot
    # experts (0-3) on node 0.
    load = np.array([[40.0, 30.0, 20.0, 10.0, 1.0, 1.0, 1.0, 1.0]])
    view = BalanceView(expert_load=load, num_gpus=4, gpus_per_node=2, slots_per_gpu=3)
    static = NoBalancing().plan(view)
    before = _node_loads(static.phy2log[:, MASTERS], load, 4)
    assert before.max() == 100.0
    planner = TwoTimescalePlanner(max_swaps_per_batch=4)
    start = BalanceView(expert_load=load, num_gpus=4, gpus_per_node=2, slots_per_gpu=3,
                        batch_load=load, microbatch_in_batch=0, previous=static)
    placed = planner.plan(start)
    after = _node_loads(placed.phy2log[:, MASTERS], load, 4)
    assert after.max() < before.max() and after.max() <= 53.0  # best split is 52 / 52
    # masters still cover every expert once
    assert sorted(placed.phy2log[0, MASTERS].tolist()) == list(range(8))
    # without the batch start (inside a batch) masters do not cross nodes
    inside = planner.plan(BalanceView(expert_load=load, num_gpus=4, gpus_per_node=2,
                                      slots_per_gpu=3, batch_load=load, microbatch_in_batch=1,
                                      previous=static))
    assert (inside.phy2log[:, MASTERS] == static.phy2log[:, MASTERS]).all()


# ---- intra-batch timescale: replicate inside the node --------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_in_node_replication_respects_slots_nodes_and_token_conservation(seed):
    rng = np.random.default_rng(seed)
    num_gpus, gpn, spg, num_experts = 8, 4, 4, 16  # 2 masters + 2 spare slots per GPU
    load = rng.multinomial(4000, rng.dirichlet(np.full(num_experts, 0.3), size=3)
                           .mean(0), size=3).astype(float)
    view = BalanceView(expert_load=load, num_gpus=num_gpus, gpus_per_node=gpn,
                       slots_per_gpu=spg)
    static = NoBalancing().plan(view)
    planner = TwoTimescalePlanner()
    placement = planner.plan(BalanceView(expert_load=load, num_gpus=num_gpus,
                                         gpus_per_node=gpn, slots_per_gpu=spg,
                                         microbatch_in_batch=1, previous=static))
    assert placement.phy2log.shape == (3, num_gpus * spg)  # never more slots than it has
    master_cols = np.flatnonzero(np.arange(num_gpus * spg) % spg < 2)
    assert (placement.phy2log[:, master_cols] == static.phy2log[:, master_cols]).all()
    tokens = placement.tokens_by_slot(load)
    assert (tokens >= 0).all()
    for layer in range(3):
        per_expert = np.bincount(placement.phy2log[layer], weights=tokens[layer],
                                 minlength=num_experts)
        np.testing.assert_allclose(per_expert, load[layer])  # every token served once
        home = {int(e): col // spg // gpn
                for col, e in zip(master_cols, placement.phy2log[layer, master_cols],
                                  strict=True)}
        for col in np.flatnonzero(tokens[layer] > 0):
            assert col // spg // gpn == home[int(placement.phy2log[layer, col])]
    # node loads are those of the masters: replication inside a node cannot move them
    node = placement.gpu_load(load).reshape(3, 2, gpn).sum(-1)
    np.testing.assert_allclose(node, static.gpu_load(load).reshape(3, 2, gpn).sum(-1))
    assert placement.gpu_load(load).max() <= static.gpu_load(load).max()


# ---- training transfer costs ----------------------------------------------------------------

def test_swapping_two_masters_across_nodes_moves_weights_and_optimizer_state():
    # 4 GPUs, 2 per node, one master each; experts 0 and 2 swap nodes.
    owner0 = static_owners(1, 4, 4)
    owner, moves = _transfers([[2, 1, 0, 3]], owner0, 1)
    assert owner.tolist() == [[2, 1, 0, 3]]
    weights, state = 2 * PARAMS, 12 * PARAMS
    assert moves.weights_s[0] == pytest.approx(weights / INTER)  # GPUs 0 and 2 in parallel
    assert moves.optimizer_s[0] == pytest.approx(state / INTER)
    assert moves.grads_s[0] == 0.0  # no replicas
    assert moves.inter_bytes == pytest.approx(2 * (weights + state)) and moves.intra_bytes == 0


def test_a_batch_replica_is_refreshed_and_reduces_its_gradient():
    # 4 GPUs x 2 slots; expert 0's owner (GPU 0) keeps it, GPU 1 (same node) holds a replica.
    # Slot 1 of GPUs 0, 2, 3 hold their own masters again: no copies there.
    owner0 = np.array([[0, 1, 2, 3]])
    owner, moves = _transfers([[0, 0, 1, 0, 2, 2, 3, 3]], owner0, 2)
    assert owner.tolist() == owner0.tolist()  # the previous owners still hold theirs
    assert moves.weights_s[0] == pytest.approx(2 * PARAMS / INTRA)
    assert moves.grads_s[0] == pytest.approx(4 * PARAMS / INTRA)
    assert moves.optimizer_s[0] == 0.0
    assert moves.intra_bytes == pytest.approx(6 * PARAMS) and moves.inter_bytes == 0


def test_costs_grow_with_bytes_moved():
    owner0 = static_owners(1, 8, 4)  # 2 experts per GPU
    one = _transfers([[2, 1, 0, 3, 4, 5, 6, 7]], owner0, 2, gpn=4)[1]  # a swap on one node
    cross = _transfers([[4, 1, 2, 3, 0, 5, 6, 7]], owner0, 2, gpn=2)[1]  # across nodes
    two = _transfers([[4, 5, 2, 3, 0, 1, 6, 7]], owner0, 2, gpn=2)[1]  # two pairs across
    big = _transfers([[4, 5, 2, 3, 0, 1, 6, 7]], owner0, 2, gpn=2, params=2 * PARAMS)[1]
    assert one.weights_s[0] < cross.weights_s[0] < two.weights_s[0] < big.weights_s[0]
    assert two.inter_bytes == pytest.approx(2 * cross.inter_bytes)
    assert big.inter_bytes == pytest.approx(2 * two.inter_bytes)
    window = {"forward_compute_s": 1e-4, "backward_compute_s": 2e-4, "batch_compute_s": 1e-3}
    exposed = [sum(batch_exposed_s(m, **window).values()) for m in (cross, two, big)]
    assert 0 < exposed[0] < exposed[1] < exposed[2]


def test_owner_stays_where_the_state_is():
    # expert 1's previous owner (GPU 0) still holds it in slot 1 although slot 2 comes first
    # for no one; expert 0 moved to GPU 1 and gets a new owner there.
    owners = choose_owners(np.array([[1, 1, 0, 2]]), np.array([[0, 0, 1]]), 2)
    assert owners.tolist() == [[1, 0, 1]]


def test_pipelined_exposure_by_hand():
    # copies of 3, 3, 1 s land at 3, 6, 7; layers need them at 1, 2, 10 s of compute. Layer 0
    # waits 2 s, which moves layer 1's need to 4: it waits 2 s more; layer 2 then has room.
    assert pipelined_exposed_s(np.array([3.0, 3.0, 1.0]), np.array([1.0, 2.0, 10.0])) == 4.0
    assert pipelined_exposed_s(np.array([0.5, 0.5]), np.array([1.0, 2.0])) == 0.0


def test_gradients_queue_behind_the_last_backward():
    # 2 layers of 1 s backward; reduces 0.5 s (layer 1) and 3 s (layer 0): layer 1's gradient
    # is ready at 1 s and done at 1.5; layer 0's ready at 2, done at 5: 3 s past the compute.
    moves = BatchTransfers(np.zeros(2), np.zeros(2), np.array([3.0, 0.5]), 0.0, 0.0)
    exposed = batch_exposed_s(moves, forward_compute_s=1.0, backward_compute_s=2.0,
                              batch_compute_s=10.0)
    assert exposed == {"weights": 0.0, "optimizer": 0.0, "grads": pytest.approx(3.0)}


def test_replicas_are_copied_once_per_batch_and_synced_over_nvlink():
    # 2 GPUs x (1 master + 1 spare); GPU 1's spare slot replicates expert 0.
    phy2log = np.array([[0, 0, 1, 0]])
    used = np.array([[True, False, True, True]])
    first = new_replicas(phy2log, None, used, 2, 1)
    assert first.tolist() == [[False, False, False, True]]  # a batch start copies it
    again = new_replicas(phy2log, np.array([[0, -1, 1, 0]]), used, 2, 1)
    assert not again.any()  # the same replica next micro-batch: weights unchanged
    model = OverheadModel(link_latency_s=0.0)
    sync = replica_sync_s(phy2log, first, num_gpus=2, num_masters=1, expert_bytes=1e9,
                          link_bytes_per_s=1e11, overheads=model)
    assert sync.tolist() == [pytest.approx(0.01)]
    assert replica_sync_s(phy2log, again, num_gpus=2, num_masters=1, expert_bytes=1e9,
                          link_bytes_per_s=1e11, overheads=model).tolist() == [0.0]


def test_training_state_bytes_reject_bad_values():
    with pytest.raises(FleetsimInputError, match="optimizer_bytes_per_param"):
        TrainingStateBytes(optimizer_bytes_per_param=-1.0)


# ---- the reproduction ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_runs():
    from fleetsim.repro.relibra import RelibraSetup, run_workload
    setup = RelibraSetup(num_batches=1, microbatches_per_batch=3, num_layers=4)
    return setup, run_workload(setup, "ultraep-qwen3-235b-prefill-stem")


def test_every_policy_pays_what_it_moves_and_none_beats_the_ideal(tiny_runs):
    _, runs = tiny_runs
    ideal = sum(r.total_s for r in runs["force_balanced"])
    totals = {p: sum(r.total_s for r in rows) for p, rows in runs.items()}
    assert all(t >= ideal * (1 - 1e-12) for t in totals.values())
    assert totals["relibra"] < totals["megatron"]
    megatron = runs["megatron"][0]
    assert megatron.exposed_by_kind == {} and megatron.inter_bytes == 0
    relibra = runs["relibra"][0]
    assert set(relibra.exposed_by_kind) == {"batch_weights", "batch_optimizer", "batch_grads",
                                            "replica_fwd", "replica_bwd"}
    assert relibra.intra_bytes > 0  # in-node replicas were copied
    assert relibra.total_s == pytest.approx(sum(p.total_s for p in relibra.passes)
                                            + sum(relibra.exposed_by_kind.values()))
    imb = {p: np.mean([x.imbalance for r in rows for x in r.passes]) for p, rows in runs.items()}
    assert imb["force_balanced"] == 1.0 <= imb["relibra"] < imb["megatron"]


def test_same_setup_gives_identical_results(tiny_runs):
    from fleetsim.repro.relibra import run_workload
    setup, runs = tiny_runs
    again = run_workload(setup, "ultraep-qwen3-235b-prefill-stem")
    for policy, rows in runs.items():
        assert [r.total_s for r in again[policy]] == [r.total_s for r in rows]


@pytest.mark.parametrize(("setting", "needle"), [
    ("ep=48", "ep: got 48"),
    ("gpus_per_node=32", "gpus_per_node: got 32"),
    ("num_spare_slots_per_gpu=0", "num_spare_slots_per_gpu: got 0"),
    ("autocorr=1", "autocorr: got 1"),
    ("gpu=nosuch", "gpu: got 'nosuch'"),
    ("nosuchkey=1", "nosuchkey"),
])
def test_bad_input_is_one_line_and_exit_2(setting, needle, capsys, tmp_path):
    assert main(["repro", "relibra", "--quick", "--set", setting,
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_fixed_owners_make_every_other_holder_a_replica_and_current_copies_are_free():
    # Expert 0 (owner GPU 0) is placed on GPU 2 only (the other node): with owners fixed its
    # optimizer state stays; GPU 2 gets the weights and sends the gradient back.
    owner0 = static_owners(1, 4, 4)
    phy2log = np.array([[1, 1, 0, 3]])  # GPU 0 now holds expert 1, GPU 2 expert 0
    kwargs = {"slots_per_gpu": 1, "gpus_per_node": 2, "params_per_expert": PARAMS,
              "state": STATE, "intra_bytes_per_s": INTRA, "inter_bytes_per_s": INTER,
              "link_latency_s": 0.0}
    owner, moves = batch_transfers(phy2log, owner0, fixed_owners=True, **kwargs)
    assert owner.tolist() == owner0.tolist()
    assert moves.optimizer_s[0] == 0.0
    assert moves.weights_s[0] == pytest.approx(2 * PARAMS / INTER)  # expert 0 to GPU 2
    assert moves.grads_s[0] == pytest.approx(4 * PARAMS / INTER)  # and its gradient back
    assert moves.intra_bytes == pytest.approx(6 * PARAMS)  # expert 1 to GPU 0, in-node
    # the same placement again inside the batch: its copies are current, nothing moves
    _, again = batch_transfers(phy2log, owner0, fixed_owners=True, held=phy2log, **kwargs)
    assert again.weights_s[0] == again.grads_s[0] == 0.0
    assert again.intra_bytes == again.inter_bytes == 0.0
