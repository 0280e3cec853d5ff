from __future__ import annotations

import pytest

from stalwart.controller.core.ettr import compute_ettr, mttr_by_class
from stalwart.controller.core.ranks import assign
from stalwart.faults import FaultKind, parse_fault
from stalwart.spec import Role, TrainingJobSpec
from stalwart.store import keys
from stalwart.store.records import FailureClass, Incident, JobState


def test_keys_are_versioned_and_scoped() -> None:
    assert keys.job_state("j") == "/stalwart/v1/jobs/j/state"
    assert keys.node_heartbeat("j", "node-1") == "/stalwart/v1/jobs/j/nodes/node-1/heartbeat"
    assert keys.generation("j", 3) == "/stalwart/v1/jobs/j/generations/00000003"
    assert keys.parse_node_key("j", keys.node_command("j", "node-2")) == ("node-2", "command")
    assert keys.parse_node_key("j", keys.job_state("j")) is None


@pytest.mark.parametrize("bad", ["", "a/b", "..", "../x", "/abs"])
def test_keys_refuse_segments_that_escape(bad: str) -> None:
    with pytest.raises(ValueError):
        keys.job_state(bad)


def test_ranks_are_contiguous_and_a_replacement_inherits_its_slot() -> None:
    spec = TrainingJobSpec(
        roles=[
            Role(name="actor", replicas=2, processes_per_node=2, command=["x"]),
            Role(name="reward", replicas=1, processes_per_node=1, command=["y"]),
        ]
    )
    a = assign("j", spec, ["node-0", "node-1", "node-2"], 1, ("h", 1), created_at=0.0)
    assert a.world_size == 5
    assert [(n.node, n.node_rank, n.first_rank, n.role) for n in a.nodes] == [
        ("node-0", 0, 0, "actor"),
        ("node-1", 1, 2, "actor"),
        ("node-2", 2, 4, "reward"),
    ]
    b = assign("j", spec, ["node-0", "node-3", "node-2"], 2, ("h", 1), created_at=0.0)
    assert b.for_node("node-3").first_rank == a.for_node("node-1").first_rank  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        assign("j", spec, ["node-0"], 1, ("h", 1), created_at=0.0)


def test_ettr_counts_downtime_and_redone_work() -> None:
    state = JobState(job="j", created_at=0, updated_at=0, first_step_at=100.0, finished_at=200.0)
    inc = Incident(
        id="i",
        job="j",
        failure_class=FailureClass.WORKER_CRASH,
        generation=1,
        failed_at=150.0,
        detected_at=150.5,
        first_step_at=160.0,
        step_at_failure=50,
        resumed_step=41,
        mean_step_time=0.5,
    )
    report = compute_ettr(state, [inc], now=500.0)
    assert report.window_seconds == 100.0
    assert report.downtime_seconds == 10.0
    assert report.lost_work_seconds == 5.0  # steps 41..50 again at 0.5 s
    assert report.ettr == pytest.approx(0.85)


def test_ettr_of_an_unrecovered_incident_runs_to_the_end() -> None:
    state = JobState(job="j", created_at=0, updated_at=0, first_step_at=0.0, finished_at=100.0)
    inc = Incident(id="i", job="j", failure_class=FailureClass.LOST_NODE, generation=1, failed_at=90.0, detected_at=91)
    assert compute_ettr(state, [inc], now=100.0).ettr == pytest.approx(0.9)


def test_ettr_leaves_suspended_time_out_of_the_window_and_of_downtime() -> None:
    from stalwart.store.records import Suspension

    # Suspended 40..60 while an incident (failed at 30) was still open; recovered at 70.
    state = JobState(
        job="j",
        created_at=0,
        updated_at=0,
        first_step_at=0.0,
        finished_at=100.0,
        suspensions=[Suspension(started_at=40.0, ended_at=60.0)],
    )
    inc = Incident(id="i", job="j", failure_class=FailureClass.LOST_NODE, generation=1, failed_at=30.0, detected_at=31)
    inc.first_step_at = 70.0
    report = compute_ettr(state, [inc], now=100.0)
    assert report.window_seconds == 80.0 and report.downtime_seconds == 20.0
    assert report.ettr == pytest.approx(0.75)
    ongoing = state.model_copy(update={"suspensions": [Suspension(started_at=90.0)], "finished_at": None})
    assert compute_ettr(ongoing, [], now=100.0).window_seconds == 90.0


def test_fault_specs_parse() -> None:
    f = parse_fault("kill-worker:rank=1,step=20")
    assert (f.kind, f.rank, f.step) == (FaultKind.KILL_WORKER, 1, 20)
    assert parse_fault("kill-node:node=1,step=5").node == "1"
    assert parse_fault("kill-controller:step=3").kind is FaultKind.KILL_CONTROLLER


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("kill-worker:step=3", "needs rank"),
        ("kill-worker:rank=x", "rank"),
        ("kill-node:node=1,when=now", "when"),
        ("kill-worker:rank", "expected key=value"),
        ("melt:rank=1", "unknown fault kind"),
    ],
)
def test_bad_fault_specs_say_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_fault(text)


def test_ettr_over_a_window_and_mttr_per_class() -> None:
    state = JobState(job="j", created_at=0.0, updated_at=0.0, first_step_at=100.0, finished_at=1100.0)
    a = Incident(
        id="a",
        job="j",
        failure_class=FailureClass.LOST_NODE,
        generation=1,
        failed_at=200.0,
        detected_at=203.0,
        first_step_at=210.0,
    )
    b = Incident(
        id="b",
        job="j",
        failure_class=FailureClass.HANG,
        generation=2,
        failed_at=600.0,
        detected_at=610.0,
        first_step_at=640.0,
    )
    whole = compute_ettr(state, [a, b], now=2000.0)
    assert whole.window_seconds == 1000 and whole.downtime_seconds == 50 and whole.ettr == pytest.approx(0.95)
    late = compute_ettr(state, [a, b], now=2000.0, since=620.0)  # the hang's tail only
    assert late.window_seconds == 480 and late.downtime_seconds == 20
    rows = {r.failure_class: r for r in mttr_by_class([a, b])}
    assert rows["LostNode"].mttr_seconds == 10 and rows["LostNode"].mean_detect_seconds == 3
    assert rows["Hang"].mttr_seconds == 40 and [r.failure_class for r in mttr_by_class([a, b], since=500)] == ["Hang"]
