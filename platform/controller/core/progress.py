"""The job's progress, kept in its state: first step, last step and loss, and the end of a recovery
(the open incident closes at the first step after it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stalwart.controller.core.decision import Plan
from stalwart.store import keys
from stalwart.store.records import Incident, JobStage, WorkerStatus

PROGRESS_PERSIST_SECONDS = 5.0  # step and loss are copied into the state this often, not every step


@dataclass(frozen=True)
class Progress:
    """What the job's progress is copied from: the workers' newest step, the first rank 0's loss (in
    the workers' order), the first step's time, the newest checkpoint, and the running ranks'
    tokens/s (a function: summed only when the state takes them, every few seconds)."""

    newest_step: int | None
    rank0_loss: float | None  # None: no rank 0 reports a loss
    first_step_at: float | None  # None: no worker stepped
    newest_checkpoint: int  # the highest last_checkpoint_step (0: none)
    rates: Callable[[], list[float]]


def progress_of(workers: Sequence[WorkerStatus]) -> Progress:
    """`Progress` from a walk over the workers (the controller's tick keeps it per node instead:
    stalwart.controller.core.detectors.node_digests.ProgressWatch)."""
    steps = [w.step for w in workers if w.step is not None]
    rank0 = next((w for w in workers if w.rank == 0 and w.loss is not None), None)
    firsts = [w.first_step_at for w in workers if w.first_step_at is not None]
    return Progress(
        newest_step=max(steps) if steps else None,
        rank0_loss=rank0.loss if rank0 is not None else None,
        first_step_at=min(firsts) if firsts else None,
        newest_checkpoint=max((w.last_checkpoint_step or 0 for w in workers), default=0),
        rates=lambda: [w.tokens_per_second for w in workers if w.tokens_per_second and w.exit_code is None],
    )


def note_progress(plan: Plan, workers: Sequence[WorkerStatus] | Progress, force: bool = False) -> None:
    """Copy the newest step, rank 0's loss and the job's tokens/s into the state now and then, so
    they outlive the heartbeats and a listing finds them without reading any (always when `force`:
    the job ends or fails)."""
    state = plan.state
    progress = workers if isinstance(workers, Progress) else progress_of(workers)
    if progress.newest_step is None:
        return
    found = progress.rank0_loss
    loss = found if found is not None and math.isfinite(found) else state.last_loss
    if (state.last_step, state.last_loss) == (progress.newest_step, loss):
        return
    # Timed from the last copy, not the state's last write: a state written more often than this for
    # other reasons would otherwise never get the step.
    if force or plan.now - (state.progress_noted_at or 0.0) >= PROGRESS_PERSIST_SECONDS:
        state.last_step, state.last_loss, state.progress_noted_at = progress.newest_step, loss, plan.now
        rates = progress.rates()
        state.last_tokens_per_second = sum(rates) if rates else None


def track(
    plan: Plan,
    workers: Sequence[WorkerStatus] | Callable[[], Sequence[WorkerStatus]],
    incident: Incident | None,
    job: str,
    progress: Progress | None = None,
) -> None:
    """Record the job's first step; forget a rollback bound once a newer checkpoint exists; close
    the open incident (`incident`) at the first step after its recovery. `progress`: the workers'
    `Progress` where the caller keeps it; `workers` (or a function that walks them) is then read
    only while an incident is open."""
    if progress is None:
        walked = workers() if callable(workers) else workers
        progress, workers = progress_of(walked), walked
    if progress.first_step_at is None:
        return
    state = plan.state
    note_progress(plan, progress)
    if state.first_step_at is None:
        state.first_step_at = progress.first_step_at
    if state.resume_max_step is not None and progress.newest_checkpoint > state.resume_max_step:
        state.resume_max_step = None  # a checkpoint newer than the rollback point exists: it is good
    if state.open_incident is None:
        return
    workers = workers() if callable(workers) else workers
    stepped = [w for w in workers if w.first_step_at is not None]
    if incident is not None and incident.scope == "Role":
        if incident.first_step_at is None and not _role_recovered(plan, workers, incident, job):
            return  # the job stepped, but the restarted role is not back yet
    elif incident is not None and incident.first_step_at is None:
        incident = incident.model_copy(deep=True)
        first = min(stepped, key=lambda w: w.first_step_at or 0.0)
        rank0 = next((w for w in stepped if w.rank == 0), first)
        incident.first_step_at = first.first_step_at
        incident.resumed_step = first.first_step
        if first.first_step is not None and incident.step_at_failure is not None:
            # The step at failure is the newest the heartbeats had told; the checkpoint the whole job
            # resumed from was saved before the failure, so the job had got at least that far.
            incident.step_at_failure = max(incident.step_at_failure, first.first_step - 1)
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


def _resumed_by_survivors(workers: Sequence[WorkerStatus], incident: Incident) -> float | None:
    """When workers that kept running through a role-scoped failure were first seen stepping after
    it (as heartbeats tell it: within a heartbeat interval of the step)."""
    after = [
        w.last_progress_at
        for w in workers
        if w.first_step_at is not None
        and w.first_step_at < incident.failed_at
        and w.last_progress_at is not None
        and w.last_progress_at > incident.failed_at
    ]
    return min(after) if after else None


def note_job_resumed(plan: Plan, workers: Sequence[WorkerStatus], incident: Incident | None, job: str) -> None:
    """While a role-scoped recovery is under way: the moment the roles that kept running stepped
    again (an actor training on with what the relay holds), which ends the job's own downtime."""
    if plan.state.stage is JobStage.RUNNING or incident is None or incident.scope != "Role":
        return  # running: track() records it with the rest
    if incident.job_resumed_at is None and (at := _resumed_by_survivors(workers, incident)) is not None:
        incident = incident.model_copy(deep=True)
        incident.job_resumed_at = at
        plan.put(keys.incident(job, incident.id), incident)


def _role_recovered(plan: Plan, workers: Sequence[WorkerStatus], incident: Incident, job: str) -> bool:
    """A role-scoped incident ends at the job's first step after the role's restart: the restarted
    workers' own first step, or a step of the roles that kept running (an RLHF rollout does not
    step; the actor stepping again with it back does)."""
    restarted = incident.restarted_at
    if restarted is None:
        return False
    firsts = [
        (w.first_step_at, w.first_step, w)
        for w in workers
        if w.first_step_at is not None and w.first_step_at >= restarted
    ] + [
        (w.last_progress_at, w.step, w)
        for w in workers
        if w.first_step_at is not None
        and w.first_step_at < restarted
        and w.last_progress_at is not None
        and w.last_progress_at >= restarted
    ]
    if not firsts:
        return False
    at, step, first = min(firsts, key=lambda f: f[0] or 0.0)
    incident = incident.model_copy(deep=True)
    incident.job_resumed_at = incident.job_resumed_at or _resumed_by_survivors(workers, incident)
    incident.first_step_at, incident.resumed_step = at, step
    incident.loss_after = first.first_loss if first.first_step_at == at else first.loss
    plan.put(keys.incident(job, incident.id), incident)
    plan.log("info", "role recovered", incident=incident.id, role=incident.role, downtime=incident.downtime)
    return True
