"""The KV moves and the kept KV reach their replica through narrow ports (``MovesPort``,
``KeptPort``), not the whole ``Replica``: the replica implements every member, and neither
module imports the replica (they imported each other)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from fleetsim.core.simulator import Simulator
from fleetsim.perf.base import ConstantStepModel
from fleetsim.policies import TokenBudgetPlanner, make_ordering
from fleetsim.serving.kv_cache import KVCache
from fleetsim.serving.kv_keep import KeptPort
from fleetsim.serving.kv_moves import MovesPort
from fleetsim.serving.prefix_cache import PrefixCache
from fleetsim.serving.recorder import Recorder
from fleetsim.serving.replica import Replica
from fleetsim.serving.request import Request

SERVING = Path(__file__).resolve().parents[2] / "src" / "fleetsim" / "serving"


def _members(port: type) -> set[str]:
    return {name for name in vars(port) if not name.startswith("_")}


@pytest.mark.parametrize("port", [MovesPort, KeptPort])
def test_the_replica_implements_the_port(port):
    sim = Simulator()
    replica = Replica(sim, step_model=ConstantStepModel(1.0),
                      kv=KVCache(10, 16, None, True, PrefixCache()),
                      batch_policy=TokenBudgetPlanner(), order_key=make_ordering("fcfs"),
                      recorder=Recorder(), max_batched_tokens=64, max_running=4)
    members = _members(port)
    assert members, "the port lists what it may use"
    for name in members:
        assert hasattr(replica, name), f"Replica lacks {port.__name__}.{name}"
        if inspect.isfunction(getattr(port, name)):
            assert callable(getattr(replica, name))


@pytest.mark.parametrize("module", ["kv_moves.py", "kv_keep.py"])
def test_kv_components_do_not_import_the_replica(module):
    tree = ast.parse((SERVING / module).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "fleetsim.serving.replica" not in imported


def test_a_handoff_outside_a_cluster_fails_loudly_through_the_port():
    from fleetsim.errors import PlanError

    sim = Simulator()
    replica = Replica(sim, step_model=ConstantStepModel(1.0),
                      kv=KVCache(10, 16, None, True, PrefixCache()),
                      batch_policy=TokenBudgetPlanner(), order_key=make_ordering("fcfs"),
                      recorder=Recorder(), max_batched_tokens=64, max_running=4, replica_id=3)
    req = Request(id=7, arrival_s=0.0, num_prompt_tokens=8, max_output_tokens=2)
    with pytest.raises(PlanError, match="replica 3 hands request 7 off"):
        replica.pass_on(req, None)
