"""The read commands' Kubernetes path (stalwart.ops.reading): `kubectl stalwart jobs|status|incidents`
read the TrainingJobs' status, which the operator keeps (stalwart_operator.status: the summary, the
newest incidents, the nodes not healthy), through the Kubernetes API with the user's kubeconfig. No
etcd client certificate: the cluster's RBAC decides (get and list on trainingjobs, which the chart's
aggregated `view` role grants) and its audit log records, as for the writes (cli_actions).

The rows are the ones the etcd reader gives (stalwart.ops.jobs, .status, .incidents), so the tables
and `-o json|yaml|jsonpath` read the same either way; what the status does not carry (every node's
heartbeat, the ranks, the checkpoint catalog, incidents older than the newest few) is left empty and
the report says where to find it.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from pydantic import ValidationError

from stalwart.ops.errors import OpsError
from stalwart.ops.incidents import IncidentRow
from stalwart.ops.jobs import JobRow
from stalwart.ops.status import RECENT_INCIDENTS, NodeRow, StatusReport
from stalwart.store.records import JobPhase, RequestStatus
from stalwart_operator import names
from stalwart_operator.cli_actions import KubernetesActions, api_error, as_request, json_body
from stalwart_operator.status import (
    ConditionType,
    IncidentSummary,
    NodeState,
    TrainingJobPhase,
    TrainingJobStatus,
)

# What a status read through the Kubernetes API leaves out, and where it is.
PARTIAL = (
    "read through the Kubernetes API (the TrainingJob's status): only the nodes not healthy are listed, "
    "and no rank; every node and rank, the checkpoint catalog and every incident: with etcd access "
    "(stalwart status JOB --etcd HOST:PORT), or the console"
)
_NODE_STATES = {NodeState.STARTING: "starting", NodeState.LOST: "lost", NodeState.FINISHED: "idle"}


def _node_state(state: NodeState, standby: bool) -> str:
    """The etcd reader's word for a node (stalwart.ops.status.NodeRow.state)."""
    if standby and state is NodeState.STARTING:
        return "standby-starting"
    return _NODE_STATES.get(state, "standby" if standby else "up")


def parse_time(value: str | None) -> float | None:
    """An RFC 3339 time of the status (`2026-01-02T03:04:05Z`) as Unix time; None if absent or bad."""
    if not value:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def job_status(body: dict[str, Any]) -> TrainingJobStatus:
    """The TrainingJob's status as the operator wrote it (empty before its first status tick)."""
    try:
        return TrainingJobStatus.model_validate(body.get("status") or {})
    except ValidationError as exc:
        name = (body.get("metadata") or {}).get("name")
        raise OpsError(
            f"the status of TrainingJob {name!r} is not what this CLI reads: {exc.errors()[0]['msg']}"
        ) from None


def _phase(status: TrainingJobStatus) -> JobPhase:
    return JobPhase.PENDING if status.phase is TrainingJobPhase.CREATED else JobPhase(status.phase.value)


def _reason(status: TrainingJobStatus) -> tuple[str | None, str | None]:
    """The reason and message of a finished (or failed) job, from its conditions."""
    for condition in status.conditions:
        if condition.type in (ConditionType.FAILED, ConditionType.SUCCEEDED) and condition.status == "True":
            return condition.reason, condition.message or None
    return None, None


def _age(body: dict[str, Any], now: float) -> float:
    created = parse_time((body.get("metadata") or {}).get("creationTimestamp"))
    return max(0.0, now - created) if created is not None else 0.0


def job_row(body: dict[str, Any], now: float) -> JobRow:
    """`stalwart jobs`' row of a TrainingJob, from its status."""
    meta, status = body.get("metadata") or {}, job_status(body)
    return JobRow(
        job=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        phase=_phase(status),
        generation=status.current_generation or 0,
        step=status.current_step,
        restarts=status.restarts.counted,
        infra_restarts=status.restarts.infrastructure,
        tokens_per_second=status.tokens_per_second,
        ettr=status.ettr,
        nodes_up=sum(r.running for r in status.roles),
        nodes_total=sum(r.slots for r in status.roles),
        incidents=status.incident_count,
        age_seconds=_age(body, now),
        reason=_reason(status)[0],
    )


def incident_row(job: str, summary: IncidentSummary) -> IncidentRow:
    return IncidentRow(
        id=summary.id,
        job=job,
        failure_class=summary.failure_class,
        generation=summary.generation or 0,
        node=summary.node,
        rank=summary.rank,
        exit_code=summary.exit_code,
        action=summary.action,
        policy_action=summary.policy_action,
        suspects=list(summary.suspects),
        failed_at=parse_time(summary.at) or 0.0,
        detect_seconds=summary.detect_seconds or 0.0,
        downtime_seconds=summary.downtime_seconds,
        recovered=bool(summary.recovered),
        runbook=summary.runbook or "",
    )


def status_report(body: dict[str, Any], now: float) -> StatusReport:
    """`stalwart status`' report of a TrainingJob, from its status (see PARTIAL)."""
    name, status = (body.get("metadata") or {}).get("name", ""), job_status(body)
    reason, message = _reason(status)
    incidents = [incident_row(name, i) for i in status.recent_incidents]
    last = status.last_incident
    return StatusReport(
        job=name,
        phase=_phase(status),
        generation=status.current_generation or 0,
        restarts=status.restarts.counted,
        infra_restarts=status.restarts.infrastructure,
        reason=reason,
        message=message,
        step=status.current_step,
        loss=status.loss,
        tokens_per_second=status.tokens_per_second,
        ettr={"ettr": status.ettr, "downtime_seconds": None, "lost_work_seconds": None, "window_seconds": None},
        age_seconds=_age(body, now),
        open_incident=last.id if last is not None and last.recovered is False else None,
        nodes=[
            NodeRow(
                node=n.name,
                state=_node_state(n.state, standby=n.name in status.standbys),
                node_rank=n.rank,
                role=n.role,
                ranks=[],
                host=n.machine,
                heartbeat_age=None,
                generation=None,
                machine_faults=[],
                cordoned=None,
            )
            for n in status.unhealthy_nodes
        ],
        ranks=[],
        standbys=list(status.standbys),
        incidents=incidents[-RECENT_INCIDENTS:],
        incident_count=status.incident_count,
        last_checkpoint=None,
        pending_requests=[as_request(r) for r in status.requests if r.phase == RequestStatus.PENDING.value],
        detail=False,
        partial=PARTIAL,
    )


class KubernetesReader:
    """stalwart.ops.reading.JobReader over the TrainingJobs of one namespace."""

    def __init__(self, actions: KubernetesActions) -> None:
        self.actions = actions
        self.namespace = actions.namespace
        self.where = actions.where

    def _list(self) -> list[dict[str, Any]]:
        try:
            listed = self.actions.custom.list_namespaced_custom_object(
                names.GROUP, names.VERSION, self.namespace, names.PLURAL, _preload_content=False
            )
        except Exception as exc:
            raise api_error(exc, f"list TrainingJobs in namespace {self.namespace}") from None
        items: list[dict[str, Any]] = json_body(listed).get("items") or []
        return sorted(items, key=lambda b: (b.get("metadata") or {}).get("name", ""))

    def jobs(self) -> list[JobRow]:
        now = time.time()
        return [job_row(body, now) for body in self._list()]

    def status(self, job: str) -> StatusReport:
        return status_report(self.actions.require(job), time.time())

    def incidents(self, job: str | None) -> list[IncidentRow]:
        bodies = [self.actions.require(job)] if job else self._list()
        rows = [
            incident_row((b.get("metadata") or {}).get("name", ""), i)
            for b in bodies
            for i in job_status(b).recent_incidents
        ]
        return sorted(rows, key=lambda r: r.failed_at)
