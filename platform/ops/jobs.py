"""Every job in etcd, one row each: the first thing on-call looks at (`stalwart jobs`, the console's
jobs page)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from stalwart.controller.core.ettr import compute_ettr
from stalwart.ops.lookup import job_namespace, job_states, spec_document
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.jobs import registered_nodes
from stalwart.store.records import Incident, JobPhase


class JobRow(BaseModel):
    job: str
    namespace: str
    phase: JobPhase
    generation: int
    step: int | None
    restarts: int  # counted against maxRestarts
    infra_restarts: int  # caused by the infrastructure: not counted
    tokens_per_second: float | None
    ettr: float | None
    nodes_up: int
    nodes_total: int
    incidents: int
    age_seconds: float
    reason: str | None


def read_jobs(store: Store) -> list[JobRow]:
    """One row per job, from its state, its incidents and a keys-only listing of its registered
    nodes: a few small reads per job whatever its size (no heartbeat, no stack report)."""
    now = time.time()
    rows = []
    for state in job_states(store):
        name = state.job
        incidents = store.get_prefix(keys.incidents_prefix(name), Incident)
        registered = registered_nodes(store, name)
        rows.append(
            JobRow(
                job=name,
                namespace=job_namespace(spec_document(store, name)),
                phase=state.phase,
                generation=state.generation,
                step=state.last_step,
                restarts=state.restarts,
                infra_restarts=state.infra_restarts,
                tokens_per_second=state.last_tokens_per_second if state.phase is JobPhase.RUNNING else None,
                ettr=compute_ettr(state, incidents, now).ettr,
                nodes_up=sum(1 for s in state.slots if s in registered),
                nodes_total=len(state.slots),
                incidents=len(incidents),
                age_seconds=now - state.created_at,
                reason=state.reason,
            )
        )
    # Jobs that need attention first: unfinished ones, then the rest; newest first within each.
    return sorted(rows, key=lambda r: (r.phase.terminal, r.age_seconds))
