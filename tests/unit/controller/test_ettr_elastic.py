"""ETTR counts the time a shrunk role ran at the capacity it had, beside (not on top of) downtime."""

from __future__ import annotations

import pytest

from stalwart.controller.core.ettr import compute_ettr
from stalwart.spec.model import FailureEvent
from stalwart.store.records import Incident, JobState, Resize, Suspension


def resize(at: float, capacity: float) -> Resize:
    to = round(3 * capacity)
    return Resize(
        role="trainer", from_replicas=3 if to < 3 else 2, to_replicas=to, replicas=3, capacity=capacity, at=at
    )


def incident(failed_at: float, first_step_at: float, event: FailureEvent) -> Incident:
    return Incident(
        id=f"inc-{failed_at:g}",
        job="j",
        failure_class=event,
        generation=1,
        failed_at=failed_at,
        detected_at=failed_at,
        first_step_at=first_step_at,
    )


def test_time_at_two_of_three_nodes_counts_two_thirds() -> None:
    # Steps from 0 to 1000; a node lost at 100 (down until 110, where the shrink took effect at 105);
    # capacity back at 700 (the grow's restart down until 710).
    state = JobState(
        job="j",
        created_at=0,
        updated_at=0,
        first_step_at=0,
        finished_at=1000,
        resizes=[resize(105, 2 / 3), resize(700, 1.0)],
    )
    incidents = [
        incident(100, 110, FailureEvent.LOST_NODE),
        incident(700, 710, FailureEvent.ELASTIC_GROW),
    ]
    report = compute_ettr(state, incidents, now=1000)
    assert report.downtime_seconds == pytest.approx(20)
    assert report.reduced_capacity_seconds == pytest.approx((700 - 110) / 3)  # outside the downtime
    assert report.productive_seconds == pytest.approx(1000 - 20 - (700 - 110) / 3)


def test_a_suspension_while_shrunk_is_not_counted_as_reduced() -> None:
    state = JobState(
        job="j",
        created_at=0,
        updated_at=0,
        first_step_at=0,
        finished_at=1000,
        resizes=[resize(100, 0.5)],
        suspensions=[Suspension(started_at=500, ended_at=600)],
    )
    report = compute_ettr(state, [], now=1000)
    assert report.reduced_capacity_seconds == pytest.approx(0.5 * (900 - 100))
    assert report.window_seconds == pytest.approx(900)
