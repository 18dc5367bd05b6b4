"""A group planner reads its members without cutting their fast-forward windows
(``GroupView.member_state``, ``member_used_blocks`` and its bounds): what it reads equals what
cutting the window shows, and the ``esp`` planner's plans leave the windows in flight
running."""

from __future__ import annotations

import pytest
from tests.unit.test_groups import model_for, run, same_requests, workload

from fleetsim.policies import make_group_planner
from fleetsim.registry import PolicySpec
from fleetsim.serving.contract import GroupPlan, GroupView
from fleetsim.serving.groups import GroupSetup


def _in_window(view: GroupView) -> list[bool]:
    return [m.current_step is not None and m.current_step.window is not None
            for m in view._group.members]  # type: ignore[attr-defined]


class CheckReads:
    """Before each plan, reads every member both ways and compares: ``member_state`` (window
    left running, counts lagging by ``num_steps_ahead``) against the replica view (window
    cut back to the step in progress, counts exact)."""

    def __init__(self, inner):
        self.inner = inner
        self.num_ahead = 0  # reads that found a window with steps done
        self.num_reads = 0
        self.num_bounded = 0  # reads whose KV use was only bounded, inside a window

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        for m in range(view.num_instances):
            s = view.member_state(m)
            peeked = ([(r.id, r.num_computed_tokens + s.num_steps_ahead,
                        r.num_output_tokens + s.num_steps_ahead) for r in s.running],
                      [r.id for r in s.waiting], view.member_used_blocks(m))
            fewest, most = view.member_used_blocks_range(m)  # before the cut below
            by_step_end = view.member_used_blocks_at_step_end(m)
            member = view.members[m]
            cut = ([(r.id, r.num_computed_tokens, r.num_output_tokens) for r in member.running],
                   [r.id for r in member.waiting], member.kv.num_used_blocks)
            assert peeked == cut, (now_s, m)
            assert fewest <= cut[2] <= most <= by_step_end, (now_s, m)
            self.num_bounded += fewest < most
            self.num_ahead += s.num_steps_ahead > 0
            self.num_reads += 1
        return self.inner.plan(view, now_s)


@pytest.mark.parametrize("planner", ["esp", "fixed"])
def test_member_state_equals_what_cutting_the_window_shows(planner):
    wl = workload(n=120, seed=3, rate=40.0, long_every=9)
    check = CheckReads(make_group_planner(PolicySpec(name=planner)))
    result, _ = run(wl, num_instances=3, blocks=2 * 300,
                    group=GroupSetup(planner=check, step_model_for=model_for))
    assert len(result.requests["request_id"]) == 120
    assert check.num_ahead > 10  # windows with steps done were read, not only boundaries
    assert check.num_ahead < check.num_reads
    assert check.num_bounded > 10


class CountCuts:
    """The ``esp`` planner, counting members whose window a plan cut."""

    def __init__(self):
        self.inner = make_group_planner(PolicySpec(name="esp"))
        self.num_cut = 0
        self.num_in_window = 0

    def plan(self, view: GroupView, now_s: float) -> GroupPlan:
        before = _in_window(view)
        plan = self.inner.plan(view, now_s)
        after = _in_window(view)
        self.num_in_window += sum(before)
        self.num_cut += sum(b and not a for b, a in zip(before, after, strict=True))
        return plan


def test_esp_plans_leave_windows_running_and_results_unchanged():
    wl = workload(n=120, seed=4, rate=40.0)
    counting = CountCuts()
    fast, _ = run(wl, num_instances=3, blocks=2 * 300,
                  group=GroupSetup(planner=counting, step_model_for=model_for))
    slow, _ = run(wl, num_instances=3, blocks=2 * 300, fast_forward=False,
                  group=GroupSetup(planner=make_group_planner(PolicySpec(name="esp")),
                                   step_model_for=model_for))
    assert counting.num_in_window > 10
    assert counting.num_cut == 0
    same_requests(fast, slow)
