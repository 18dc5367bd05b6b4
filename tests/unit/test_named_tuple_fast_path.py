"""The compiled engine builds ``StepPlan`` and ``MemberState`` with ``tuple.__new__`` from a
full tuple of their fields (the named tuples' own ``__new__`` runs as Python): the result
must be the very value the constructor gives, whatever fields the contract grows."""

from fleetsim.serving.contract import PLAN_DEFAULTS, MemberState, StepPlan, new_named_tuple


def test_a_plan_from_all_its_fields_is_the_constructors():
    tokens, preempt = {7: 1, 9: 16}, (3, 4)
    fast = new_named_tuple(StepPlan, (tokens, preempt, *PLAN_DEFAULTS))
    assert type(fast) is StepPlan
    assert fast == StepPlan(tokens, preempt)
    assert fast._asdict() == StepPlan(tokens, preempt)._asdict()
    assert len(PLAN_DEFAULTS) == len(StepPlan._fields) - 2


def test_a_member_state_from_its_fields_is_the_constructors():
    fast = new_named_tuple(MemberState, ([], [], 5))
    assert type(fast) is MemberState and fast == MemberState([], [], 5)
    assert fast.num_steps_ahead == 5
