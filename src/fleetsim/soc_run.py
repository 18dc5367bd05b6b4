"""Agent.xpu's traffic (reactive Poisson requests plus closed-loop proactive flows,
``serving/agent_flows.py``) on the engine, with the pools ``config`` builds (``cluster.soc``
for an SoC): what the Agent.xpu reproduction runs its engine-side systems with."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fleetsim.config import SimConfig
from fleetsim.models import get_model
from fleetsim.policies import make_batch_policy, make_ordering
from fleetsim.policies.eviction import make_eviction
from fleetsim.policies.routing import make_router
from fleetsim.run import build_pools, engine_settings, seed_streams
from fleetsim.serving.agent_flows import AgentTrafficSource, agent_frame
from fleetsim.serving.cluster import simulate
from fleetsim.serving.recorder import Records
from fleetsim.serving.settings import PlugIns
from fleetsim.workloads.agent_traffic import AgentTraffic


@dataclass(frozen=True, slots=True)
class AgentRun:
    """Every request of one run (finished or not: the flows stop issuing at the window's end,
    and every request issued runs to its end), and which were reactive."""

    records: Records
    reactive_ids: frozenset[int]
    end_s: float
    busy_s_by_pool: dict[str, float]


def run_agent_traffic(config: SimConfig, traffic: AgentTraffic) -> AgentRun:
    """Serve ``traffic`` on the cluster ``config`` describes, to its last request's end."""
    model = get_model(config.model)
    pools, _ = build_pools(config, model)
    frame = agent_frame(traffic)  # the window's ends (the source makes the requests)
    settings = replace(engine_settings(config, model), until_s=math.inf,
                       timeline=(0.0, traffic.duration_s))
    rng = seed_streams(config.seed, ("workload", "routing"))["routing"]
    plugins = PlugIns(
        make_batch_policy=lambda: make_batch_policy(config.policy.batching),
        order_key=make_ordering(config.policy.ordering),
        router=make_router(config.cluster.router),
        decode_router=make_router(config.cluster.decode_router, "cluster.decode_router"),
        eviction_key=make_eviction(config.policy.eviction), rng=rng)
    source = AgentTrafficSource(traffic)
    records, cluster = simulate(frame, pools, settings, plugins, source=source)
    busy = {pool: records.busy_s_by_replica.get(rid, 0.0)
            for rid, pool in enumerate(cluster.pool_of)}
    return AgentRun(records, frozenset(source.reactive_ids), cluster.sim.now_s, busy)
