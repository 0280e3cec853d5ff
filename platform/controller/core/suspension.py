"""`spec.suspend`: the job stops (workers, then nodes) and keeps its state, incidents and
checkpoints; unset, it starts again from its newest checkpoint as a new generation. A suspension is
not a failure: no incident, no lost node, no restart counted, and ETTR leaves the time out."""

from __future__ import annotations

from stalwart.controller.core.decision import Plan
from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.progress import note_progress
from stalwart.controller.core.transitions import ACTIVE, Trigger
from stalwart.store.records import JobStage, Suspension


def follow(plan: Plan, view: View) -> bool:
    """Enter or leave the suspension the spec asks for; True if the stage changed."""
    state, wanted = plan.state, view.spec.suspend
    if wanted and state.stage in ACTIVE:
        if state.stage is JobStage.RUNNING:
            note_progress(plan, view.workers, force=True)
        state.suspensions.append(Suspension(started_at=plan.now))
        plan.enter(Trigger.SUSPEND)
        plan.log("info", "suspending: stopping the workers and the nodes", generation=state.generation)
        return True
    if not wanted and state.stage in (JobStage.SUSPENDING, JobStage.SUSPENDED):
        if state.suspensions and state.suspensions[-1].ended_at is None:
            state.suspensions[-1].ended_at = plan.now
        # What was under way when the job was suspended starts over: pre-flight on the nodes it
        # gets now, no replay of a phase half run.
        state.preflight_rounds, state.replay = 0, None
        plan.enter(Trigger.RESUMED)
        plan.log("info", "resuming: nodes start, then a new generation from the newest checkpoint")
        return True
    return False


def stopped(plan: Plan, view: View) -> None:
    """Suspending: done once the cluster reports none of the job's nodes alive."""
    if view.cluster is not None and not any(info.alive for info in view.cluster.values()):
        plan.enter(Trigger.NODES_STOPPED)
        plan.log("info", "suspended")
