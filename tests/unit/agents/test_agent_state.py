"""The agent's named states: the transition table is the only way between them."""

from __future__ import annotations

import pytest

from stalwart.agents.agent_state import TRANSITIONS, AgentState, BadTransition, check_transition

S = AgentState
ALLOWED = {
    (S.IDLE, S.STANDBY),  # the job lists the node as a standby
    (S.IDLE, S.RUNNING),  # a slot's first generation
    (S.STANDBY, S.IDLE),  # no longer listed
    (S.STANDBY, S.RUNNING),  # promoted: it takes a slot's ranks
    (S.RUNNING, S.STOPPING),  # STOP, or the next generation
    (S.STOPPING, S.IDLE),  # stopped
    (S.STOPPING, S.RUNNING),  # the next generation starts
    *((state, S.FENCED) for state in S if state is not S.FENCED),  # the lease is gone
}


@pytest.mark.parametrize(("current", "new"), [(a, b) for a in S for b in S if a is not b], ids=lambda s: s.value)
def test_every_transition_is_allowed_or_refused_as_the_table_says(current: AgentState, new: AgentState) -> None:
    if (current, new) in ALLOWED:
        check_transition(current, new)
    else:
        with pytest.raises(BadTransition, match=f"from {current.value} to {new.value}"):
            check_transition(current, new)


def test_the_table_has_a_row_per_state_and_fenced_is_final() -> None:
    assert set(TRANSITIONS) == set(S) and TRANSITIONS[S.FENCED] == frozenset()
    assert {(a, b) for a, row in TRANSITIONS.items() for b in row} == ALLOWED
