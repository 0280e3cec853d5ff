"""Incidents: what failed, what Stalwart did, and which runbook (`stalwart incidents`, the console's
incident pages)."""

from __future__ import annotations

from pydantic import BaseModel

from stalwart.ops.lookup import job_names, require_state
from stalwart.runbooks import runbook_for_incident
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Incident


class IncidentRow(BaseModel):
    id: str
    job: str
    failure_class: str
    generation: int
    node: str | None
    rank: int | None
    exit_code: int | None
    action: str
    policy_action: str | None
    suspects: list[str]
    failed_at: float
    detect_seconds: float
    downtime_seconds: float | None
    recovered: bool
    runbook: str


def incident_row(inc: Incident) -> IncidentRow:
    return IncidentRow(
        id=inc.id,
        job=inc.job,
        failure_class=inc.failure_class.value,
        generation=inc.generation,
        node=inc.node,
        rank=inc.rank,
        exit_code=inc.exit_code,
        action=inc.action,
        policy_action=inc.policy_action.value if inc.policy_action else None,
        suspects=inc.suspects,
        failed_at=inc.failed_at,
        detect_seconds=inc.detected_at - inc.failed_at,
        downtime_seconds=inc.downtime,
        recovered=inc.recovered,
        runbook=runbook_for_incident(inc),
    )


def read_incidents(store: Store, job: str | None) -> list[Incident]:
    """One job's incidents or every job's, oldest first."""
    jobs = [require_state(store, job).job] if job else job_names(store)
    found = [inc for j in jobs for inc in store.get_prefix(keys.incidents_prefix(j), Incident)]
    return sorted(found, key=lambda i: i.failed_at)
