"""The job's progress, kept in its state: first step, last step and loss, and the end of a recovery
(the open incident closes at the first step after it)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from stalwart.controller.decision import Plan
from stalwart.store import keys
from stalwart.store.records import Incident, WorkerStatus

PROGRESS_PERSIST_SECONDS = 5.0  # step and loss are copied into the state this often, not every step


def note_progress(plan: Plan, workers: Sequence[WorkerStatus], force: bool = False) -> None:
    """Copy the newest step and rank 0's loss into the state now and then, so they outlive the
    heartbeats (always when `force`: the job ends or fails)."""
    state = plan.state
    steps = [w.step for w in workers if w.step is not None]
    if not steps:
        return
    rank0 = next((w for w in workers if w.rank == 0 and w.loss is not None), None)
    loss = rank0.loss if rank0 is not None and rank0.loss is not None and math.isfinite(rank0.loss) else state.last_loss
    if (state.last_step, state.last_loss) == (max(steps), loss):
        return
    if force or plan.now - state.updated_at >= PROGRESS_PERSIST_SECONDS:
        state.last_step, state.last_loss = max(steps), loss


def track(plan: Plan, workers: Sequence[WorkerStatus], incident: Incident | None, job: str) -> None:
    """Record the job's first step; forget a rollback bound once a newer checkpoint exists; close
    the open incident (`incident`) at the first step after its recovery."""
    stepped = [w for w in workers if w.first_step_at is not None]
    if not stepped:
        return
    state = plan.state
    note_progress(plan, workers)
    if state.first_step_at is None:
        state.first_step_at = min(w.first_step_at for w in stepped if w.first_step_at is not None)
    if state.resume_max_step is not None and any(
        (w.last_checkpoint_step or 0) > state.resume_max_step for w in workers
    ):
        state.resume_max_step = None  # a checkpoint newer than the rollback point exists: it is good
    if state.open_incident is None:
        return
    if incident is not None and incident.first_step_at is None:
        incident = incident.model_copy(deep=True)
        first = min(stepped, key=lambda w: w.first_step_at or 0.0)
        rank0 = next((w for w in stepped if w.rank == 0), first)
        incident.first_step_at = first.first_step_at
        incident.resumed_step = first.first_step
        incident.loss_after = rank0.first_loss
        plan.put(keys.incident(job, incident.id), incident)
        plan.log(
            "info",
            "recovered",
            incident=incident.id,
            resumed_step=incident.resumed_step,
            downtime=incident.downtime,
        )
    state.open_incident = None
