"""Instance groups over random loads, sizes and planners (every registered group planner on
a linear step model, and the test planners that widen, split and merge members at run time):
everyone finishes, all KV comes back, fast-forward equals stepping one at a time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_groups import BLOCKS, PackOntoOne, WidenForLongPrompts, model_for, run
from tests.unit.test_groups import workload as group_workload

from fleetsim.policies import GROUP_PLANNERS, make_group_planner
from fleetsim.registry import PolicySpec
from fleetsim.serving.groups import GroupSetup


def _planner(name: str, instances: int):
    if name == "widen":
        return WidenForLongPrompts(long_tokens=1500)
    if name == "pack":
        return PackOntoOne()
    if name == "fixed":
        return make_group_planner(PolicySpec(name="fixed", args={"degree": instances}))
    return make_group_planner(PolicySpec(name=name))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 50),
       rate=st.sampled_from([2.0, 10.0, 60.0]),
       planner=st.sampled_from(sorted(GROUP_PLANNERS) + ["widen", "pack"]),
       instances=st.integers(1, 3), long_every=st.sampled_from([0, 7]))
def test_group_runs_are_complete_conserving_and_exact(seed, n, rate, planner, instances,
                                                      long_every):
    if planner == "pack":
        instances = 2  # its plans name two members
    wl = group_workload(n=n, seed=seed, rate=rate, long_every=long_every)
    results = []
    for fast_forward in (True, False):
        setup = GroupSetup(planner=_planner(planner, instances), step_model_for=model_for)
        # 2x the blocks: room for a merged member's KV and the 3,000-token prompts
        results.append(run(wl, num_instances=instances, blocks=2 * BLOCKS, group=setup,
                           fast_forward=fast_forward))
    (fast, cluster), (slow, _) = results
    assert len(fast.requests["request_id"]) == n
    for member in cluster.replicas:
        assert member.kv.num_used_blocks == 0 and member.load_tokens == 0
        assert not member.running and not member.waiting
    assert not cluster.group.waiting
    for col, values in slow.requests.items():
        assert np.array_equal(values, fast.requests[col], equal_nan=True), col
