"""The TrainingJob's status: a pydantic model (the CRD's status schema is generated from it) and
the pure function that mirrors the controller's state in etcd into it.

Conditions follow the Kubernetes convention (Kubeflow Trainer, JobSet): one entry per type, with
status True/False, a CamelCase reason, a message, and the time the status last flipped. A finished
job sets `Complete` (reason `Succeeded`), as a Job, a JobSet and a TrainJob do, so
`kubectl wait --for=condition=Complete` works; the `Succeeded` condition stays beside it for the
watchers that already use it.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

from stalwart.controller.core.ettr import compute_ettr
from stalwart.runbooks import runbook_for_incident
from stalwart.store.records import Incident, JobPhase, JobStage, JobState, OperatorRequest, RoleState


class StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class TrainingJobPhase(str, Enum):
    CREATED = "Created"  # accepted by the operator; the controller has not started it yet
    PENDING = "Pending"  # nodes starting, pre-flight checks
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionType(str, Enum):
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETE = "Complete"  # what Job, JobSet and TrainJob users wait for
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


# Times in the status are RFC 3339 strings, declared as such so clients can parse them.
Timestamp = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]

# At 10,000 nodes the status must stay far from etcd's object limit and cheap to rewrite: the nodes
# are counted per role and state, and only the ones not healthy are listed, up to these bounds.
# The full picture is in etcd (`stalwart status JOB`, the console).
MAX_LISTED_NODES = 50
MAX_LISTED_EVICTED = 50
MAX_LISTED_REQUESTS = 16
RECENT_INCIDENTS = 10  # the newest incidents in the status (`kubectl stalwart incidents`); all: with etcd
MAX_SUSPECTS = 8
RESULT_LIMIT = 8192


class Condition(StatusModel):
    type: Annotated[
        ConditionType,
        Field(description="Created, Running, Restarting, Complete, Succeeded, Failed or Suspended."),
    ]
    status: Annotated[
        Literal["True", "False", "Unknown"],
        Field(description="True, False or Unknown."),
    ]
    reason: Annotated[str, Field(max_length=128, description="Why, in one CamelCase word.")]
    message: Annotated[str, Field(max_length=1024, description="Why, for people.")] = ""
    last_transition_time: Annotated[Timestamp, Field(description="When the status last changed.")]
    observed_generation: Annotated[
        int | None,
        Field(ge=0, description="The metadata.generation of the TrainingJob the condition was set for."),
    ] = None


class Restarts(StatusModel):
    total: Annotated[int, Field(ge=0, description="Every restart of the job's workers.")] = 0
    infrastructure: Annotated[
        int,
        Field(
            ge=0,
            description="Restarts caused by the infrastructure (machine faults, lost nodes, "
            "hangs): they do not count against failurePolicy.maxRestarts.",
        ),
    ] = 0
    counted: Annotated[
        int,
        Field(ge=0, description="Restarts counted against failurePolicy.maxRestarts."),
    ] = 0


class NodeState(str, Enum):
    STARTING = "Starting"  # pod pending, or its agent not registered yet
    RUNNING = "Running"  # agent registered and heartbeating
    STANDBY = "Standby"  # a warm standby, waiting for a slot
    LOST = "Lost"  # its pod or agent is gone; the controller replaces it
    FINISHED = "Finished"


HEALTHY = frozenset({NodeState.RUNNING, NodeState.STANDBY, NodeState.FINISHED})


class NodeStatus(StatusModel):
    name: Annotated[str, Field(max_length=63, description="Stalwart node name, e.g. node-3.")]
    rank: Annotated[int | None, Field(description="Node rank (slot) it holds; none for a standby.")] = None
    role: Annotated[
        str | None, Field(max_length=63, description="Role of its slot, or of the pool a standby waits in.")
    ] = None
    state: Annotated[NodeState, Field(description="Starting, Running, Standby, Lost or Finished.")]
    pod: Annotated[str | None, Field(max_length=253, description="The pod that runs its agent.")] = None
    machine: Annotated[
        str | None,
        Field(max_length=253, description="The Kubernetes Node the pod runs on."),
    ] = None


class StandbyCounts(StatusModel):
    ready: Annotated[int, Field(ge=0, description="Standbys registered and waiting for a slot.")] = 0
    starting: Annotated[int, Field(ge=0, description="Standbys whose pod or agent is starting.")] = 0
    lost: Annotated[int, Field(ge=0, description="Standbys whose pod or agent is gone.")] = 0


class RoleRestarts(StatusModel):
    restarted: Annotated[
        int,
        Field(ge=0, description="How often the role's workers were restarted, by its own failures or the job's."),
    ] = 0
    infrastructure: Annotated[
        int,
        Field(
            ge=0,
            description="Restarts the role's failures caused in the infrastructure (machine faults, lost "
            "nodes, hangs): not counted against failurePolicy.maxRestarts.",
        ),
    ] = 0
    counted: Annotated[
        int,
        Field(ge=0, description="Restarts the role's failures caused, counted against failurePolicy.maxRestarts."),
    ] = 0


class RoleStatus(StatusModel):
    """One role of the job, its own world: its slots counted by state, its standbys (made from its
    own template, taking only its slots), its generation, restarts and incidents."""

    role: Annotated[str, Field(max_length=63, description="The role.")]
    slots: Annotated[int, Field(ge=0, description="Slots (node ranks) of the role: its replicas.")] = 0
    running: Annotated[int, Field(ge=0, description="Slots whose node is registered and running.")] = 0
    starting: Annotated[int, Field(ge=0, description="Slots whose pod or agent is starting.")] = 0
    lost: Annotated[int, Field(ge=0, description="Slots whose pod or agent is gone (being replaced).")] = 0
    finished: Annotated[
        int, Field(ge=0, description="Slots of a finished job, or of a suspended one whose pods stopped.")
    ] = 0
    standbys: Annotated[
        StandbyCounts, Field(description="The role's warm standbys (its own pool), counted by state.")
    ] = StandbyCounts()
    restart_scope: Annotated[
        Literal["Role", "Job"] | None,
        Field(description="Role: the role's failures restart it alone; Job: the whole job."),
    ] = None
    generation: Annotated[
        int | None, Field(ge=0, description="The role's own generation: 1 at its first start, +1 at each restart.")
    ] = None
    restarts: Annotated[RoleRestarts, Field(description="The role's restarts, split by cause.")] = RoleRestarts()
    incidents: Annotated[int, Field(ge=0, description="Incidents the role's failures opened.")] = 0
    last_incident: Annotated[
        str | None, Field(max_length=128, description="The newest of them: stalwart incidents JOB.")
    ] = None


class IncidentSummary(StatusModel):
    id: Annotated[str, Field(max_length=128)]
    failure_class: Annotated[
        str,
        Field(
            alias="class",
            max_length=64,
            description="The failure event, e.g. LostNode.",
        ),
    ]
    action: Annotated[str, Field(max_length=1024, description="What the controller did about it.")]
    at: Annotated[Timestamp, Field(description="When it failed.")]
    node: Annotated[str | None, Field(max_length=63, description="The node it happened on, if one.")] = None
    runbook: Annotated[str | None, Field(max_length=128, description="Its runbook: stalwart runbook show NAME.")] = None
    generation: Annotated[int | None, Field(ge=0, description="The generation that failed.")] = None
    rank: Annotated[int | None, Field(description="The rank it happened on, if one.")] = None
    exit_code: Annotated[int | None, Field(description="The worker's exit code, if one exited.")] = None
    policy_action: Annotated[
        str | None, Field(max_length=32, description="The failure policy's action: Restart, Evict, Rollback, Fail.")
    ] = None
    suspects: Annotated[
        list[str], Field(max_length=MAX_SUSPECTS, description=f"The nodes suspected, at most {MAX_SUSPECTS}.")
    ] = []
    detect_seconds: Annotated[float | None, Field(ge=0, description="From the failure to its detection.")] = None
    downtime_seconds: Annotated[
        float | None, Field(ge=0, description="From the failure to the first step after it (once recovered).")
    ] = None
    recovered: Annotated[bool | None, Field(description="Whether training stepped again since.")] = None


class RequestState(StatusModel):
    """A request made through the Kubernetes API (`stalwart node evict`, `stalwart check`... with a
    kubeconfig), as the job's controller answered it."""

    id: Annotated[str, Field(max_length=63, description="The request's id (its annotation's name).")]
    kind: Annotated[str, Field(max_length=32, description="evict, cordon, uncordon or check.")]
    node: Annotated[str | None, Field(max_length=63, description="The node; none: every node (check).")] = None
    phase: Annotated[str, Field(max_length=32, description="Pending, Done or Failed.")]
    message: Annotated[str | None, Field(max_length=1024, description="The controller's answer.")] = None
    requested_by: Annotated[str, Field(max_length=256, description="Who the CLI said asked.")] = ""
    finished_at: Annotated[Timestamp | None, Field(description="When the controller answered.")] = None
    result: Annotated[
        str | None,
        Field(max_length=RESULT_LIMIT, description="The controller's result as JSON (per-node check results)."),
    ] = None


class TrainingJobStatus(StatusModel):
    """What `kubectl get tj` and `kubectl describe tj` show; mirrored from etcd by the operator.
    It stays small at any size: nodes are counted, and only those not healthy are listed."""

    phase: Annotated[
        TrainingJobPhase,
        Field(description="Created, Pending, Running, Restarting, Succeeded, Failed or Suspended."),
    ] = TrainingJobPhase.CREATED
    conditions: Annotated[
        list[Condition],
        Field(max_length=8, description="The job's conditions, one per type (kubectl wait --for=condition=TYPE)."),
    ] = []
    job_id: Annotated[
        str | None,
        Field(
            max_length=128,
            description="The job's name in etcd and for the `stalwart` CLI: <namespace>.<name>.",
        ),
    ] = None
    observed_generation: Annotated[
        int | None,
        Field(description="The metadata.generation of the spec last handed to the controller."),
    ] = None
    current_generation: Annotated[
        int | None,
        Field(description="The controller's generation: how many times the workers were started."),
    ] = None
    current_step: Annotated[int | None, Field(description="The newest training step reported.")] = None
    loss: Annotated[float | None, Field(description="Rank 0's loss at currentStep.")] = None
    ettr: Annotated[
        float | None,
        Field(
            ge=0,
            le=1,
            description="Effective training time ratio since the first step, from the recorded incidents.",
        ),
    ] = None
    restarts: Annotated[Restarts, Field(description="Restarts, split by cause.")] = Restarts()
    nodes_ready: Annotated[
        str | None,
        Field(max_length=32, description="Running slots / slots, e.g. 1022/1024 (the Nodes column)."),
    ] = None
    roles: Annotated[
        list[RoleStatus],
        Field(
            max_length=16,
            description="Each role: its slots counted by state, its standbys, generation, restarts and incidents.",
        ),
    ] = []
    roles_ready: Annotated[
        str | None,
        Field(
            max_length=512,
            description="Running slots / slots of each role, e.g. actor 2/2, rollout 3/4 (the Roles column).",
        ),
    ] = None
    standby_counts: Annotated[StandbyCounts, Field(description="Every role's warm standbys, counted by state.")] = (
        StandbyCounts()
    )
    unhealthy_nodes: Annotated[
        list[NodeStatus],
        Field(
            max_length=MAX_LISTED_NODES,
            description=f"Nodes starting or lost, slots in rank order then standbys, at most "
            f"{MAX_LISTED_NODES} (the rest are counted in unhealthyNodesOmitted; every node: "
            "`stalwart status JOB`).",
        ),
    ] = []
    unhealthy_nodes_omitted: Annotated[
        int, Field(ge=0, description="Nodes not healthy beyond those listed in unhealthyNodes.")
    ] = 0
    standbys: Annotated[list[str], Field(max_length=1024, description="Warm standby nodes.")] = []
    evicted: Annotated[
        list[str],
        Field(
            max_length=MAX_LISTED_EVICTED,
            description=f"The newest nodes evicted for a fault, at most {MAX_LISTED_EVICTED} (all: evictedCount).",
        ),
    ] = []
    evicted_count: Annotated[int, Field(ge=0, description="Nodes evicted for a fault, in all.")] = 0
    last_incident: Annotated[IncidentSummary | None, Field(description="The newest incident.")] = None
    recent_incidents: Annotated[
        list[IncidentSummary],
        Field(
            max_length=RECENT_INCIDENTS,
            description=f"The newest {RECENT_INCIDENTS} incidents, oldest first (`kubectl stalwart incidents JOB`; "
            "every one: `stalwart incidents` with etcd).",
        ),
    ] = []
    incident_count: Annotated[int, Field(ge=0, description="Incidents recorded, in all.")] = 0
    tokens_per_second: Annotated[
        float | None, Field(ge=0, description="Training throughput at currentStep, while Running.")
    ] = None
    start_time: Annotated[Timestamp | None, Field(description="When the first generation started.")] = None
    completion_time: Annotated[Timestamp | None, Field(description="When the job finished.")] = None
    requests: Annotated[
        list[RequestState],
        Field(
            max_length=MAX_LISTED_REQUESTS,
            description="Requests made through the Kubernetes API (stalwart node evict|cordon|uncordon, "
            "stalwart check), newest last, and the controller's answers.",
        ),
    ] = []

    def to_patch(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


@dataclass(frozen=True)
class PodView:
    """The little the status needs to know about a node's pod."""

    name: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    machine: str | None = None
    terminating: bool = False


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _phase(state: JobState | None, suspended: bool) -> TrainingJobPhase:
    """Suspended from the moment spec.suspend is set (the controller is stopping the pods) until
    the resumed job's controller moves on; else the controller's phase."""
    if state is not None and state.phase.terminal:
        return TrainingJobPhase(state.phase.value)
    if suspended:
        return TrainingJobPhase.SUSPENDED
    return TrainingJobPhase.CREATED if state is None else TrainingJobPhase(state.phase.value)


def _pods_stopped(state: JobState | None) -> bool:
    """The suspension is complete: the controller stopped every node (or never started any)."""
    return state is None or state.stage is JobStage.SUSPENDED


def _node_state(name: str, pod: PodView | None, registered: bool, state: JobState) -> NodeState:
    if state.phase.terminal or (state.stage is JobStage.SUSPENDED and pod is None):
        return NodeState.FINISHED
    if pod is None or pod.terminating or pod.phase in ("Failed", "Succeeded", "Unknown"):
        return NodeState.LOST
    if name in state.standbys and registered:
        return NodeState.STANDBY
    return NodeState.RUNNING if registered and pod.phase == "Running" else NodeState.STARTING


def _wanted_conditions(
    phase: TrainingJobPhase,
    state: JobState | None,
    job_id: str,
    incident: IncidentSummary | None,
) -> dict[ConditionType, tuple[bool, str, str]]:
    """Each condition's (status, reason, message) for this phase; None-valued types are left out."""
    restart_msg = f"{incident.failure_class} on {incident.node or 'the job'}: {incident.action}" if incident else ""
    out: dict[ConditionType, tuple[bool, str, str]] = {
        ConditionType.CREATED: (
            True,
            "JobCreated",
            f"submitted to the controller as {job_id}",
        ),
    }
    if phase is TrainingJobPhase.RUNNING:
        out[ConditionType.RUNNING] = (
            True,
            "Running",
            f"generation {state.generation if state else 0} running",
        )
        out[ConditionType.RESTARTING] = (False, "Recovered", restart_msg or "running")
    elif phase is TrainingJobPhase.RESTARTING:
        out[ConditionType.RUNNING] = (False, "Restarting", restart_msg or "restarting")
        out[ConditionType.RESTARTING] = (
            True,
            incident.failure_class if incident else "Restarting",
            restart_msg or "restarting",
        )
    elif phase is TrainingJobPhase.SUCCEEDED:
        msg = (state.message if state else None) or "the job completed"
        out[ConditionType.RUNNING] = (False, "Completed", msg)
        out[ConditionType.RESTARTING] = (False, "Completed", msg)
        out[ConditionType.COMPLETE] = (True, "Succeeded", msg)
        out[ConditionType.SUCCEEDED] = (
            True,
            (state.reason if state else None) or "Completed",
            msg,
        )
    elif phase is TrainingJobPhase.FAILED:
        msg = (state.message if state else None) or "the job failed"
        out[ConditionType.RUNNING] = (False, "Failed", msg)
        out[ConditionType.RESTARTING] = (False, "Failed", msg)
        out[ConditionType.FAILED] = (
            True,
            (state.reason if state else None) or "Failed",
            msg,
        )
    elif phase is TrainingJobPhase.SUSPENDED and _pods_stopped(state):
        message = "spec.suspend is true: pods stopped, state and checkpoints kept"
        out[ConditionType.RUNNING] = (False, "Suspended", message)
        out[ConditionType.SUSPENDED] = (True, "Suspended", message)
    elif phase is TrainingJobPhase.SUSPENDED and state is not None and state.stage is JobStage.SAVING:
        step = state.suspensions[-1].save_step if state.suspensions else None
        message = f"spec.suspend is true: the workers checkpoint at step {step} first, then stop, then the pods"
        out[ConditionType.RUNNING] = (False, "Checkpointing", message)
        out[ConditionType.SUSPENDED] = (False, "Checkpointing", message)
    elif phase is TrainingJobPhase.SUSPENDED:
        message = "spec.suspend is true: the controller is stopping the workers, then the pods"
        out[ConditionType.RUNNING] = (False, "Suspending", message)
        out[ConditionType.SUSPENDED] = (False, "Suspending", message)
    if phase is not TrainingJobPhase.SUSPENDED:
        out[ConditionType.SUSPENDED] = (False, "Resumed", "spec.suspend is false")
    return out


def merge_conditions(
    wanted: dict[ConditionType, tuple[bool, str, str]],
    previous: list[Condition],
    now: float,
    generation: int | None = None,
) -> list[Condition]:
    """Keep lastTransitionTime while a condition's status stays the same. A False condition of a
    type never True before is left out (no 'Suspended: False' on a job never suspended), except
    Running: a job that finished (or was suspended) before a status tick saw it run still says
    Running False and why, so `kubectl wait --for=condition=Running=false` never waits forever."""
    before = {c.type: c for c in previous}
    out: list[Condition] = []
    for ctype in ConditionType:
        if ctype not in wanted:
            if ctype in before:
                out.append(before[ctype])
            continue
        value, reason, message = wanted[ctype]
        status = "True" if value else "False"
        old = before.get(ctype)
        if old is None and not value and ctype is not ConditionType.RUNNING:
            continue
        changed = old is None or old.status != status
        out.append(
            Condition(
                type=ctype,
                status=status,
                reason=reason[:128],
                message=message[:1024],
                last_transition_time=rfc3339(now) if changed or old is None else old.last_transition_time,
                observed_generation=generation,
            )
        )
    return out


def summarize_incident(incident: Incident) -> IncidentSummary:
    return IncidentSummary(
        id=incident.id,
        failure_class=incident.failure_class.value,
        action=incident.action[:1024],
        at=rfc3339(incident.failed_at) or "",
        node=incident.node,
        runbook=runbook_for_incident(incident),
        generation=incident.generation,
        rank=incident.rank,
        exit_code=incident.exit_code,
        policy_action=incident.policy_action.value if incident.policy_action else None,
        suspects=[s[:253] for s in incident.suspects[:MAX_SUSPECTS]],
        detect_seconds=max(0.0, incident.detected_at - incident.failed_at),
        downtime_seconds=incident.downtime,
        recovered=incident.recovered,
    )


def request_states(requests: list[OperatorRequest]) -> list[RequestState]:
    """The newest requests (made through the Kubernetes API) and the controller's answers."""
    newest = sorted(requests, key=lambda r: (r.requested_at, r.id))[-MAX_LISTED_REQUESTS:]
    out = []
    for r in newest:
        result = json.dumps(r.result, separators=(",", ":"), sort_keys=True) if r.result is not None else None
        if result is not None and len(result) > RESULT_LIMIT:
            result = json.dumps({"truncated": f"{len(result)} bytes: stalwart status with etcd shows it all"})
        out.append(
            RequestState(
                id=r.id,
                kind=r.kind.value,
                node=r.node,
                phase=r.status.value,
                message=(r.message or "")[:1024] or None,
                requested_by=r.requested_by[:256],
                finished_at=rfc3339(r.finished_at),
                result=result,
            )
        )
    return out


def _counted(counts: StandbyCounts, field: str) -> StandbyCounts:
    return counts.model_copy(update={field: getattr(counts, field) + 1})


def _role_books(role: RoleState) -> dict[str, object]:
    """A role's own world from the controller's record: its scope, generation, restarts, incidents."""
    return {
        "restart_scope": role.restart_scope,
        "generation": role.generation,
        "restarts": RoleRestarts(restarted=role.restarted, infrastructure=role.infra_restarts, counted=role.restarts),
        "incidents": len(role.incidents),
        "last_incident": role.incidents[-1][:128] if role.incidents else None,
    }


def build_status(
    *,
    job_id: str,
    state: JobState | None,
    incidents: list[Incident],
    slot_roles: list[str],
    pods: dict[str, PodView],
    registered: set[str],
    previous: TrainingJobStatus | None,
    suspended: bool,
    observed_generation: int | None,
    now: float,
    requests: list[OperatorRequest] | None = None,
) -> TrainingJobStatus:
    """The status for a job as etcd and the pods show it now. Pure: every input is passed in.
    `requests`: the ones made through the Kubernetes API, to show the controller's answers."""
    phase = _phase(state, suspended)
    newest = max(incidents, key=lambda i: (i.detected_at, i.id), default=None)
    last = summarize_incident(newest) if newest else None
    conditions = merge_conditions(
        _wanted_conditions(phase, state, job_id, last),
        previous.conditions if previous else [],
        now,
        observed_generation,
    )
    recent = sorted(incidents, key=lambda i: (i.detected_at, i.id))[-RECENT_INCIDENTS:]
    status = TrainingJobStatus(
        phase=phase,
        conditions=conditions,
        job_id=job_id,
        last_incident=last,
        recent_incidents=[summarize_incident(i) for i in recent],
        incident_count=len(incidents),
        observed_generation=observed_generation,
        requests=request_states(requests or []),
    )
    if state is None:
        return status
    counts = {role: RoleStatus(role=role) for role in dict.fromkeys(slot_roles)}
    standby_counts = StandbyCounts()
    unhealthy: list[NodeStatus] = []
    omitted = 0

    def note(node: NodeStatus) -> None:
        nonlocal omitted
        if node.state in HEALTHY:
            return
        if len(unhealthy) < MAX_LISTED_NODES:
            unhealthy.append(node)
        else:
            omitted += 1

    roles = state.slot_roles()
    for rank, name in enumerate(state.slots):
        pod = pods.get(name)
        role = roles.get(name) or (slot_roles[rank] if rank < len(slot_roles) else None)
        node = NodeStatus(
            name=name,
            rank=rank,
            role=role,
            state=_node_state(name, pod, name in registered, state),
            pod=pod.name if pod else None,
            machine=pod.machine if pod else None,
        )
        if role in counts:
            entry = counts[role]
            field = "running" if node.state is NodeState.STANDBY else node.state.value.lower()
            counts[role] = entry.model_copy(update={"slots": entry.slots + 1, field: getattr(entry, field) + 1})
        note(node)
    for name in state.standbys:
        pod = pods.get(name)
        role = state.standby_roles.get(name)
        node = NodeStatus(
            name=name,
            role=role,
            state=_node_state(name, pod, name in registered, state),
            pod=pod.name if pod else None,
            machine=pod.machine if pod else None,
        )
        field = {NodeState.STANDBY: "ready", NodeState.RUNNING: "ready", NodeState.LOST: "lost"}.get(
            node.state, "starting"
        )
        standby_counts = _counted(standby_counts, field)
        if role in counts:
            counts[role] = counts[role].model_copy(update={"standbys": _counted(counts[role].standbys, field)})
        note(node)
    for name, books in state.roles.items():
        if name in counts:
            counts[name] = counts[name].model_copy(update=_role_books(books))
    running = sum(c.running for c in counts.values())
    ettr = compute_ettr(state, incidents, now).ettr
    return status.model_copy(
        update={
            "current_generation": state.generation,
            "current_step": state.last_step,
            "loss": state.last_loss,
            "tokens_per_second": (
                round(state.last_tokens_per_second, 1)
                if state.last_tokens_per_second is not None and state.phase is JobPhase.RUNNING
                else None
            ),
            "ettr": None if ettr is None else round(min(1.0, max(0.0, ettr)), 4),
            "restarts": Restarts(
                total=state.restarts + state.infra_restarts, infrastructure=state.infra_restarts, counted=state.restarts
            ),
            "nodes_ready": f"{running}/{len(state.slots)}",
            "roles": list(counts.values()),
            "roles_ready": ", ".join(f"{c.role} {c.running}/{c.slots}" for c in counts.values())[:512],
            "standby_counts": standby_counts,
            "unhealthy_nodes": unhealthy,
            "unhealthy_nodes_omitted": omitted,
            "standbys": list(state.standbys),
            "evicted": list(state.evicted[-MAX_LISTED_EVICTED:]),
            "evicted_count": len(state.evicted),
            "start_time": rfc3339(state.started_at),
            "completion_time": rfc3339(state.finished_at),
        }
    )
