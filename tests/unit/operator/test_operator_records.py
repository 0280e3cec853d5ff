"""What the operator derives from the controller's records: the Events it posts (once each), the
requests it takes from annotations, and the active deadline."""

from __future__ import annotations

import kubernetes_validate

from stalwart.spec import FailureAction, parse_job
from stalwart.store import Store, keys
from stalwart.store.records import (
    FailureClass,
    Incident,
    JobPhase,
    JobStage,
    JobState,
    OperatorRequest,
    RequestKind,
    RequestStatus,
)
from stalwart_operator import deadline, kube_requests, recorder
from stalwart_operator.status import Condition, ConditionType, TrainingJobPhase, TrainingJobStatus

T0 = 1_800_000_000.0


def incident(n: int, **changes: object) -> Incident:
    base = Incident(
        id=f"inc-{n:04d}-abc",
        job="ml.demo",
        failure_class=FailureClass.LOST_NODE,
        generation=n,
        node="node-1",
        action="evict node-1, standby node-2 takes its ranks",
        policy_action=FailureAction.EVICT,
        evicted=["node-1"],
        replacements={"node-1": "node-2"},
        evidence=["node-1: node lease lapsed (no heartbeat for 5s)"],
        failed_at=T0 + n,
        detected_at=T0 + n + 1,
    )
    return base.model_copy(update=changes)


def test_an_incident_tells_its_class_action_runbook_eviction_and_hot_swap() -> None:
    events = recorder.incident_events(incident(1))
    assert [(e.type, e.reason) for e in events] == [
        ("Warning", "LostNode"),
        ("Warning", "NodeEvicted"),
        ("Normal", "HotSwap"),
    ]
    assert "inc-0001-abc: LostNode on node-1 (generation 1)" in events[0].message
    assert "runbook: stalwart runbook show lost_node" in events[0].message
    assert "standby node-2 takes node-1's slot and ranks" in events[2].message
    scoped = recorder.incident_events(incident(1, role="rollout", scope="Role"))[2].message
    assert "rollout standby node-2 takes node-1's slot and ranks" in scoped
    assert "only the rollout role restarts, the other roles keep their pods and processes" in scoped
    rollback = recorder.incident_events(
        incident(
            2, failure_class=FailureClass.NAN_LOSS, policy_action=FailureAction.ROLLBACK, evicted=[], replacements={}
        )
    )
    assert [e.reason for e in rollback] == ["NaNLoss", "Rollback"]
    assert recorder.recovered_event(incident(3)) is None
    done = recorder.recovered_event(incident(3, first_step_at=T0 + 10, resumed_step=40))
    assert done is not None and done.reason == "Recovered" and "from step 40" in done.message


def test_each_event_is_posted_once_even_after_a_restart() -> None:
    """The record of what was posted (kept in etcd) makes a second pass post nothing, even when
    Kubernetes has expired the Events themselves; a recovery is posted when it happens."""
    first, posted = recorder.pending_events([incident(1)], recorder.PostedEvents())
    assert len(first) == 3 and posted.incidents == ["inc-0001-abc"]
    again, same = recorder.pending_events([incident(1)], posted)
    assert again == [] and same == posted
    recovered, after = recorder.pending_events([incident(1, first_step_at=T0 + 9)], posted)
    assert [e.reason for e in recovered] == ["Recovered"] and after.recovered == ["inc-0001-abc"]
    assert recorder.pending_events([incident(1, first_step_at=T0 + 9)], after)[0] == []
    # Names derive from the job's uid and what the Event reports: a replay is refused with 409.
    assert recorder.event_name("demo", "u-1", "incident/x") == recorder.event_name("demo", "u-1", "incident/x")
    assert recorder.event_name("demo", "u-1", "incident/x") != recorder.event_name("demo", "u-2", "incident/x")


def test_phase_changes_and_the_event_object() -> None:
    running = JobState(job="ml.demo", phase=JobPhase.RUNNING, generation=2, created_at=T0, updated_at=T0)
    assert recorder.phase_event("Running", TrainingJobPhase.RUNNING, running, T0) is None
    assert recorder.phase_event(None, TrainingJobPhase.CREATED, None, T0) is None
    change = recorder.phase_event("Restarting", TrainingJobPhase.RUNNING, running, T0)
    assert change is not None and change.reason == "Running" and "generation 2" in change.message
    resumed = recorder.phase_event("Suspended", TrainingJobPhase.RUNNING, running, T0)
    assert resumed is not None and resumed.reason == "Resumed"
    failed = recorder.phase_event(
        "Running",
        TrainingJobPhase.FAILED,
        running.model_copy(update={"stage": JobStage.FAILED, "reason": "DeadlineExceeded", "message": "too long"}),
        T0,
    )
    assert failed is not None and failed.type == "Warning" and failed.reason == "DeadlineExceeded"
    body = recorder.event_manifest(change, job="demo", namespace="ml", uid="u-1", instance="operator-0")
    kubernetes_validate.validate(body, "1.30", strict=True)
    assert body["involvedObject"] == {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "name": "demo",
        "namespace": "ml",
        "uid": "u-1",
    }


def test_requests_from_annotations_go_to_etcd_once_and_leave_when_answered(store: Store) -> None:
    job = "ml.requests"
    value = kube_requests.RequestAnnotation(
        kind=RequestKind.EVICT, node="node-3", reason="Xid 79", requested_by="alice@laptop", requested_at=T0
    ).model_dump_json(by_alias=True)
    annotations = {
        kube_requests.annotation_key("req-1"): value,
        kube_requests.annotation_key("req-bad"): '{"kind": "reboot"}',
        "unrelated": "x",
    }
    assert kube_requests.sync(store, job, annotations) == [kube_requests.annotation_key("req-bad")]
    request = store.get(keys.request(job, "req-1"), OperatorRequest)
    assert request is not None and request.kind is RequestKind.EVICT and request.node == "node-3"
    assert request.requested_by == "alice@laptop" + kube_requests.VIA_KUBERNETES
    # Still pending: its annotation stays (only the malformed one goes), nothing is created twice.
    assert kube_requests.sync(store, job, annotations) == [kube_requests.annotation_key("req-bad")]
    assert len(store.get_prefix(keys.requests_prefix(job), OperatorRequest)) == 1
    store.put(keys.request(job, "req-1"), request.model_copy(update={"status": RequestStatus.DONE}))
    assert kube_requests.annotation_key("req-1") in kube_requests.sync(store, job, annotations)
    # A pending request whose annotation went (the CLI gave up) is withdrawn.
    annotations = {kube_requests.annotation_key("req-2"): value}
    kube_requests.sync(store, job, annotations)
    kube_requests.sync(store, job, {})
    withdrawn = store.get(keys.request(job, "req-2"), OperatorRequest)
    assert (
        withdrawn is not None and withdrawn.status is RequestStatus.FAILED and "withdrawn" in (withdrawn.message or "")
    )


def test_the_active_deadline_counts_from_the_start_or_the_last_resume() -> None:
    job = parse_job(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "d"},
            "spec": {"roles": [{"name": "t", "command": ["x"]}], "activeDeadlineSeconds": 100},
        }
    )
    state = JobState(job="ml.d", phase=JobPhase.RUNNING, created_at=T0, updated_at=T0, started_at=T0)
    status = TrainingJobStatus()
    assert deadline.expired(job, status, state, T0 + 99) is None
    assert "activeDeadlineSeconds (100s)" in (deadline.expired(job, status, state, T0 + 100) or "")
    resumed = TrainingJobStatus(
        conditions=[
            Condition(
                type=ConditionType.SUSPENDED,
                status="False",
                reason="Resumed",
                last_transition_time="2027-01-15T08:01:30Z",
            )
        ]
    )  # T0 + 90
    assert deadline.expired(job, resumed, state, T0 + 150) is None
    assert deadline.expired(job, resumed, state, T0 + 190) is not None
    finished = state.model_copy(update={"stage": JobStage.SUCCEEDED})
    assert deadline.expired(job, status, finished, T0 + 1000) is None
