"""Dual-phase replay: over many (PP, DP, bad machine) triples the plan singles out exactly the bad one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stalwart.diagnosis.replay import ReplayInconclusive, ReplayPlan, locate, plan_replay


def machines(pp: int, dp: int) -> list[str]:
    return [f"m{i}" for i in range(pp * dp)]


def spares(pp: int, dp: int) -> list[str]:
    return [f"spare{i}" for i in range(max(0, pp - dp))]


def replay(plan: ReplayPlan, bad: str) -> tuple[list[int], list[int]]:
    """What running every group would show: a group fails when the bad machine is in it."""
    h = [i for i, g in enumerate(plan.horizontal) if bad in g.machines]
    v = [i for i, g in enumerate(plan.vertical) if bad in g.machines]
    return h, v


def check_structure(plan: ReplayPlan, pp: int, dp: int) -> None:
    job = set(plan.machines)
    for phase in ("horizontal", "vertical"):
        groups = plan.groups(phase)  # type: ignore[arg-type]
        seen: list[str] = [m for g in groups for m in g.machines if m not in g.spares]
        assert sorted(seen) == sorted(job), f"{phase} groups are not a partition of the machines"
        for g in groups:
            assert g.pipelines and all(len(p) == pp for p in g.pipelines), "every group runs whole pipelines"
            assert g.dp <= dp, "replays run at a data-parallel size no larger than the job's"
            assert len(set(g.machines)) == len(g.machines)
    for h in plan.horizontal:
        for v in plan.vertical:
            shared = (set(h.machines) & set(v.machines)) - set(v.spares) - set(h.spares)
            assert len(shared) <= 1, f"{h.id} and {v.id} share {sorted(shared)}"


@settings(max_examples=100, deadline=None)
@given(pp=st.integers(1, 12), dp=st.integers(1, 24), data=st.data())
def test_the_failing_groups_intersect_in_exactly_the_bad_machine(pp: int, dp: int, data: st.DataObject) -> None:
    plan = plan_replay(pp, dp, machines(pp, dp), spares(pp, dp))
    bad = data.draw(st.sampled_from(plan.machines), label="bad machine")
    h, v = replay(plan, bad)
    assert len(h) == 1 and len(v) == 1, "exactly one group of each phase fails"
    assert locate(plan, h, v) == bad
    assert locate(plan, [plan.horizontal[h[0]].id], [plan.vertical[v[0]].id]) == bad  # ids work too


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), dp=st.integers(1, 16))
def test_groups_are_runnable_partitions_meeting_at_most_once(pp: int, dp: int) -> None:
    check_structure(plan_replay(pp, dp, machines(pp, dp), spares(pp, dp)), pp, dp)


def test_wide_jobs_need_no_spares_and_replay_at_smaller_dp() -> None:
    plan = plan_replay(4, 16, machines(4, 16))
    assert plan.scheme == "diagonal"
    assert len(plan.horizontal) == 4 and all(g.dp == 4 for g in plan.horizontal)  # DP 16 -> 4 per replay
    assert len(plan.vertical) == 16 and all(not g.spares for g in plan.vertical)


def test_deep_pipelines_without_spares_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="needs 2 spare machine"):
        plan_replay(4, 2, machines(4, 2))


def test_inconsistent_results_are_inconclusive() -> None:
    plan = plan_replay(2, 4, machines(2, 4))
    with pytest.raises(ReplayInconclusive):
        locate(plan, [0, 1], [0])
    with pytest.raises(ReplayInconclusive):
        locate(plan, [], [0])
    with pytest.raises(ValueError, match="outside"):
        locate(plan, [9], [0])


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="expected PP x DP = 8"):
        plan_replay(2, 4, machines(2, 3))
    with pytest.raises(ValueError, match="unique"):
        plan_replay(1, 2, ["a", "a"])
