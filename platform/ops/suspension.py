"""Suspend or resume a job through etcd (a `stalwart run` job, or anyone with etcd access): set
`spec.suspend` with the one spec edit (stalwart.ops.spec_edit, which the console uses too) and wait
for the job's controller to carry it out. The Kubernetes path (stalwart_operator.cli_actions) patches
the TrainingJob instead; the operator writes the spec into etcd from it, so a job the operator runs
is best suspended that way."""

from __future__ import annotations

import time

from stalwart.ops.errors import EXIT_TIMEOUT, OpsError
from stalwart.ops.lookup import require_state
from stalwart.ops.requests import Waiting, quiet
from stalwart.ops.spec_edit import SpecEditError, set_suspend
from stalwart.store.client import Store
from stalwart.store.records import JobPhase, JobStage, JobState

POLL_SECONDS = 0.5


def suspend(store: Store, job: str, suspended: bool, timeout: float, waiting: Waiting = quiet) -> str:
    """Set or unset spec.suspend and wait until the controller has stopped every node (suspend) or
    runs a new generation (resume). The line to show the user."""
    verb = "suspend" if suspended else "resume"
    before = require_state(store, job)
    if before.phase.terminal:
        raise OpsError(f"job {job!r} has finished ({before.phase.value}): nothing to {verb}")
    try:
        changed = set_suspend(store, job, suspended)
    except SpecEditError as exc:
        raise OpsError(str(exc)) from None
    if not changed and (before.stage is JobStage.SUSPENDED) == suspended:
        return f"{job} is already {'suspended' if suspended else 'not suspended'} ({_where(before)})"
    deadline = time.monotonic() + timeout
    with waiting(f"spec.suspend of {job} is {str(suspended).lower()}; waiting for its controller to {verb} it"):
        while True:
            state = require_state(store, job)
            if _done(before, state, suspended):
                return f"{job}: {_where(state)}"
            if time.monotonic() >= deadline:
                raise OpsError(
                    f"spec.suspend of {job} is set to {str(suspended).lower()}, but the job is still "
                    f"{_where(state)} after {timeout:.0f}s; its controller carries on (is it running? "
                    "stalwart status shows where the job is)",
                    EXIT_TIMEOUT,
                )
            time.sleep(POLL_SECONDS)


def _done(before: JobState, state: JobState, suspended: bool) -> bool:
    """Suspended: every node stopped. Resumed: a generation newer than the suspended one runs."""
    if state.phase.terminal:
        return True
    if suspended:
        return state.stage is JobStage.SUSPENDED
    return state.phase is JobPhase.RUNNING and (
        before.phase is not JobPhase.SUSPENDED or state.generation > before.generation
    )


def _where(state: JobState) -> str:
    return f"{state.phase.value} ({state.stage.value}, generation {state.generation})"
