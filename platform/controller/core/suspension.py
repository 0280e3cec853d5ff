"""`spec.suspend`: the job stops (workers, then nodes) and keeps its state, incidents and
checkpoints; unset, it starts again from its newest checkpoint as a new generation. A suspension is
not a failure: no incident, no lost node, no restart counted, and ETTR leaves the time out.

A running job checkpoints first (Kueue's preemption must not cost the steps since the last periodic
save): the controller writes a CheckpointRequest for a step just ahead of the fastest rank, the
agents hand it to their workers (worker_sdk.checkpoint_requested), and the job stays in SuspendSaving,
workers running, until a node reports that step committed or checkpoint.saveBeforeSuspendSeconds
pass; then it suspends as any job does. The checkpoint it resumes from is that one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stalwart.controller.core.decision import Plan
from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.progress import note_progress
from stalwart.controller.core.transitions import ACTIVE, Trigger
from stalwart.store import keys
from stalwart.store.records import CheckpointRequest, JobStage, Suspension, WorkerStatus

# How long a request takes to reach every worker (the etcd watch, the agent's loop, the worker's next
# step): the step asked for is this far ahead of where the fastest rank is now, so that no rank is
# past it when it reads the request (one that is saves at its next step).
DELIVERY_SECONDS = 2.0
MIN_STEPS_AHEAD = 2


def save_step(workers: list[WorkerStatus], now: float) -> int | None:
    """The step every rank should checkpoint at: the fastest rank's step now (its last report plus
    the steps its pace gave it since), plus the steps that pass while the request travels. None when
    no rank has reported a step (nothing to save since the checkpoint it started from)."""
    ahead: list[float] = []
    for w in workers:
        if w.step is None or w.exit_code is not None:
            continue
        pace = w.step_time if w.step_time and w.step_time > 0 else None
        since = max(0.0, now - w.last_progress_at) if w.last_progress_at is not None else 0.0
        travelling = math.ceil(DELIVERY_SECONDS / pace) if pace else MIN_STEPS_AHEAD
        ahead.append(w.step + (since / pace if pace else 0.0) + max(MIN_STEPS_AHEAD, travelling))
    return math.ceil(max(ahead)) if ahead else None


def follow(plan: Plan, view: View, job: str, new_id: Callable[[], str]) -> bool:
    """Enter or leave the suspension the spec asks for; True if the stage changed."""
    state, wanted = plan.state, view.spec.suspend
    if wanted and state.stage in ACTIVE:
        if state.stage is JobStage.RUNNING:
            note_progress(plan, view.workers, force=True)
        state.suspensions.append(Suspension(started_at=plan.now))
        step = save_step(view.workers, plan.now) if state.stage is JobStage.RUNNING else None
        if step is not None and view.spec.checkpoint.save_before_suspend_seconds > 0:
            _ask_for_checkpoint(plan, job, step, new_id())
            return True
        plan.enter(Trigger.SUSPEND)
        plan.log("info", "suspending: stopping the workers and the nodes", generation=state.generation)
        return True
    if not wanted and state.stage is JobStage.SAVING:
        _end_suspension(plan)
        plan.deletes.append(keys.checkpoint_request(job))
        plan.enter(Trigger.RESUMED)
        plan.log("info", "suspension withdrawn before the checkpoint: the generation goes on")
        return True
    if not wanted and state.stage in (JobStage.SUSPENDING, JobStage.SUSPENDED):
        _end_suspension(plan)
        # What was under way when the job was suspended starts over: pre-flight on the nodes it
        # gets now, no replay of a phase half run.
        state.preflight_rounds, state.replay = 0, None
        plan.enter(Trigger.RESUMED)
        plan.log("info", "resuming: nodes start, then a new generation from the newest checkpoint")
        return True
    return False


def _ask_for_checkpoint(plan: Plan, job: str, step: int, request_id: str) -> None:
    state = plan.state
    state.suspensions[-1].save_step = step
    plan.put(
        keys.checkpoint_request(job),
        CheckpointRequest(
            id=f"suspend-{state.generation:04d}-{request_id}",
            generation=state.generation,
            step=step,
            reason="suspend",
            requested_at=plan.now,
        ),
    )
    plan.enter(Trigger.SUSPEND_SAVING)
    plan.log("info", "suspending: the workers checkpoint first", step=step, generation=state.generation)


def _end_suspension(plan: Plan) -> None:
    suspensions = plan.state.suspensions
    if suspensions and suspensions[-1].ended_at is None:
        suspensions[-1].ended_at = plan.now


def saving(plan: Plan, view: View, job: str) -> None:
    """SuspendSaving: on to Suspending once a node reports the asked-for step (or a later one)
    committed, or once the grace period is spent."""
    state = plan.state
    suspension = state.suspensions[-1] if state.suspensions else None
    asked = suspension.save_step if suspension is not None else None
    committed = [
        s.step
        for beat in view.beats.values()
        for s in beat.checkpoints
        if asked is not None and s.step >= asked and (s.generation is None or s.generation >= state.generation)
    ]
    grace = view.spec.checkpoint.save_before_suspend_seconds
    if committed and suspension is not None:
        suspension.saved_step = min(committed)
        plan.deletes.append(keys.checkpoint_request(job))
        plan.enter(Trigger.SAVE_COMMITTED)
        plan.log("info", "suspending: checkpoint committed; stopping the workers and the nodes", step=min(committed))
    elif plan.now - (state.stage_since or plan.now) > grace:
        plan.deletes.append(keys.checkpoint_request(job))
        plan.enter(Trigger.SAVE_GRACE_PASSED)
        plan.log(
            "warning",
            "suspending without the checkpoint asked for: none committed within saveBeforeSuspendSeconds",
            step=asked,
            grace_seconds=grace,
        )


def stopped(plan: Plan, view: View) -> None:
    """Suspending: done once the cluster reports none of the job's nodes alive."""
    if view.cluster is not None and not any(info.alive for info in view.cluster.values()):
        plan.enter(Trigger.NODES_STOPPED)
        plan.log("info", "suspended")
