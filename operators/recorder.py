"""Kubernetes Events on the TrainingJob: its incident history for `kubectl describe tj` and
`kubectl get events`, from the same records the status mirrors (the controller's, in etcd).

Each incident gives a Warning with its class, what the controller did and its runbook; then one
Event per node it evicted, per standby hot-swapped in, for a rollback, and when training resumed.
Phase changes (Running, Restarting, Suspended, Resumed, Succeeded, Failed) are Events too, and so is
the outcome of a suspension's checkpoint first (CheckpointedBeforeSuspend, or SuspendCheckpointMissed).

No Event is posted twice, even across operator restarts and after Kubernetes expired the old
ones (an hour by default): each has a name derived from the job's uid and what it reports (a
replay gets 409 Conflict), and the incidents already reported are kept in etcd with the job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from stalwart.runbooks import runbook_for_incident
from stalwart.spec import FailureAction
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Incident, JobStage, JobState
from stalwart_operator import names
from stalwart_operator.status import TrainingJobPhase, rfc3339

COMPONENT = "stalwart-operator"
REPORTING_COMPONENT = "stalwart.dev/operator"
MAX_MESSAGE = 1024
# Incidents remembered as reported; older ones were reported long ago and never change again.
REMEMBERED_INCIDENTS = 1000


@dataclass(frozen=True)
class JobEvent:
    key: str  # what it reports, unique within the job: its name derives from it
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    action: str
    at: float


class PostedEvents(BaseModel):
    """What the operator already reported for a job (etcd: keys.operator_events)."""

    incidents: list[str] = []  # detection Events posted (the incident, evictions, hot-swaps, rollback)
    recovered: list[str] = []  # "training resumed" Events posted
    suspension_saves: list[float] = []  # suspensions (their start) whose checkpoint first was reported


def _runbook(incident: Incident) -> str:
    rid = runbook_for_incident(incident)
    return f"runbook: stalwart runbook show {rid} (runbooks/{rid}.md)"


def incident_events(incident: Incident) -> list[JobEvent]:
    """What one incident reports when it is recorded: the failure, then what was done about it."""
    at, cls = incident.detected_at, incident.failure_class.value
    where = incident.node or "the job"
    evidence = f" Evidence: {incident.evidence[0]}" if incident.evidence else ""
    out = [
        JobEvent(
            key=f"incident/{incident.id}",
            type="Warning",
            reason=cls,
            message=f"{incident.id}: {cls} on {where} (generation {incident.generation}): {incident.action}. "
            f"{_runbook(incident)}.{evidence}",
            action=(incident.policy_action.value if incident.policy_action else "Restart"),
            at=at,
        )
    ]
    for node in incident.evicted:
        out.append(
            _follow_up(
                incident,
                f"evict/{node}",
                "Warning",
                "NodeEvicted",
                f"{node} evicted for {cls} ({incident.id}); its machine is cordoned. {_runbook(incident)}",
                "Evict",
            )
        )
    for evicted, standby in incident.replacements.items():
        message = f"standby {standby} takes {evicted}'s slot and ranks ({incident.id}); the other nodes keep their pods"
        if incident.role is not None and incident.scope == "Role":
            message = (
                f"{incident.role} standby {standby} takes {evicted}'s slot and ranks ({incident.id}); only the "
                f"{incident.role} role restarts, the other roles keep their pods and processes"
            )
        out.append(_follow_up(incident, f"swap/{evicted}", "Normal", "HotSwap", message, "HotSwap"))
    if incident.policy_action is FailureAction.ROLLBACK:
        message = f"rolling back to an earlier checkpoint after {cls} ({incident.id}): {incident.action}"
        out.append(_follow_up(incident, "rollback", "Warning", "Rollback", message, "Rollback"))
    return out


def _follow_up(
    incident: Incident, what: str, kind: Literal["Normal", "Warning"], reason: str, message: str, action: str
) -> JobEvent:
    """An Event about what was done for an incident, at the time it was detected."""
    return JobEvent(
        key=f"incident/{incident.id}/{what}",
        type=kind,
        reason=reason,
        message=message,
        action=action,
        at=incident.detected_at,
    )


def recovered_event(incident: Incident) -> JobEvent | None:
    if incident.first_step_at is None:
        return None
    resumed = f" from step {incident.resumed_step}" if incident.resumed_step is not None else ""
    return JobEvent(
        key=f"incident/{incident.id}/recovered",
        type="Normal",
        reason="Recovered",
        message=f"training resumed{resumed} after {incident.id} ({incident.failure_class.value}): "
        f"{incident.downtime or 0.0:.1f}s without training",
        action="Resume",
        at=incident.first_step_at,
    )


def phase_event(before: str | None, after: TrainingJobPhase, state: JobState | None, now: float) -> JobEvent | None:
    """A phase change the status shows; None when the phase did not change."""
    if before == after.value or (before is None and after is TrainingJobPhase.CREATED):
        return None
    generation = state.generation if state else 0
    if before == TrainingJobPhase.SUSPENDED.value:
        reason, message = "Resumed", "spec.suspend unset: the job resumes from its newest checkpoint"
    elif after is TrainingJobPhase.SUSPENDED:
        reason, message = "Suspended", "spec.suspend set: the job's pods stop, its state and checkpoints are kept"
    elif after is TrainingJobPhase.RUNNING:
        reason, message = "Running", f"generation {generation} running"
    elif after is TrainingJobPhase.RESTARTING:
        reason, message = "Restarting", f"generation {generation} stopped; restarting"
    elif after.value in ("Succeeded", "Failed"):
        reason = (state.reason if state else None) or after.value
        message = f"{after.value}: {(state.message if state else None) or after.value.lower()}"
    else:
        reason, message = after.value, f"phase {after.value}"
    return JobEvent(
        key=f"phase/{after.value}/{generation}/{reason}",
        type="Warning" if after is TrainingJobPhase.FAILED else "Normal",
        reason=reason,
        message=message,
        action=reason,
        at=now,
    )


def suspension_save_event(state: JobState | None, posted: PostedEvents) -> tuple[JobEvent | None, PostedEvents]:
    """The outcome of the newest suspension's checkpoint first, once it is known: Normal when the
    workers committed the step asked for, Warning when the grace period passed without it."""
    if state is None or not state.suspensions or state.stage is JobStage.SAVING:
        return None, posted
    suspension = state.suspensions[-1]
    if suspension.save_step is None or suspension.started_at in posted.suspension_saves:
        return None, posted
    if suspension.saved_step is not None:
        event = JobEvent(
            key=f"suspend-save/{suspension.started_at}",
            type="Normal",
            reason="CheckpointedBeforeSuspend",
            message=f"the workers committed a checkpoint at step {suspension.saved_step} (asked for step "
            f"{suspension.save_step}) before they stopped; the job resumes from it",
            action="Checkpoint",
            at=suspension.started_at,
        )
    else:
        event = JobEvent(
            key=f"suspend-save/{suspension.started_at}",
            type="Warning",
            reason="SuspendCheckpointMissed",
            message=f"no checkpoint at step {suspension.save_step} was committed within "
            "checkpoint.saveBeforeSuspendSeconds: the workers were stopped anyway and the job resumes from its "
            "newest earlier checkpoint (does the script save when worker_sdk.checkpoint_requested says so?)",
            action="Suspend",
            at=suspension.started_at,
        )
    kept = [*posted.suspension_saves, suspension.started_at][-REMEMBERED_INCIDENTS:]
    return event, posted.model_copy(update={"suspension_saves": kept})


def pending_events(incidents: list[Incident], posted: PostedEvents) -> tuple[list[JobEvent], PostedEvents]:
    """The incident Events not reported yet, oldest first, and the record once they are."""
    newest = sorted(incidents, key=lambda i: (i.detected_at, i.id))[-REMEMBERED_INCIDENTS:]
    seen, recovered = set(posted.incidents), set(posted.recovered)
    out: list[JobEvent] = []
    for incident in newest:
        if incident.id not in seen:
            out += incident_events(incident)
            seen.add(incident.id)
        done = recovered_event(incident)
        if done is not None and incident.id not in recovered:
            out.append(done)
            recovered.add(incident.id)
    kept = {i.id for i in newest}
    return out, PostedEvents(
        incidents=sorted(seen & kept),
        recovered=sorted(recovered & kept),
        suspension_saves=posted.suspension_saves,
    )


def event_name(job: str, uid: str, key: str) -> str:
    return f"{job}.{hashlib.sha256(f'{uid}/{key}'.encode()).hexdigest()[:16]}"


def event_manifest(event: JobEvent, *, job: str, namespace: str, uid: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about the TrainingJob, as `kubectl describe` lists them."""
    at = rfc3339(event.at)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": event_name(job, uid, event.key),
            "namespace": namespace,
            "labels": names.job_labels(job, namespace),
        },
        "involvedObject": {
            "apiVersion": f"{names.GROUP}/{names.VERSION}",
            "kind": names.KIND,
            "name": job,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": event.reason[:128],
        "message": event.message[:MAX_MESSAGE],
        "type": event.type,
        "action": event.action[:128],
        "source": {"component": COMPONENT},
        "reportingComponent": REPORTING_COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


def load_posted(store: Store, job_id: str) -> PostedEvents:
    raw = store.get_raw(keys.operator_events(job_id))
    return PostedEvents.model_validate_json(raw) if raw else PostedEvents()


def save_posted(store: Store, job_id: str, posted: PostedEvents) -> None:
    store.put(keys.operator_events(job_id), posted.model_dump_json())
