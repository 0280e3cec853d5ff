"""spec.activeDeadlineSeconds: a job active longer than this fails with reason DeadlineExceeded,
as a Kubernetes Job does. Active time counts from status.startTime or from the job's last resume
(its Suspended condition turning False), whichever is later, so a job Kueue suspended and resumed
gets its whole deadline again. The operator enforces it (`stalwart run` has --timeout instead)."""

from __future__ import annotations

import datetime as dt

from stalwart.spec import TrainingJob
from stalwart.store.records import JobState
from stalwart_operator.status import ConditionType, TrainingJobStatus

REASON = "DeadlineExceeded"


def _parse(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def active_since(status: TrainingJobStatus, state: JobState) -> float | None:
    if state.started_at is None:
        return None
    resumed = next(
        (c for c in status.conditions if c.type is ConditionType.SUSPENDED and c.status == "False"),
        None,
    )
    return max(state.started_at, _parse(resumed.last_transition_time)) if resumed else state.started_at


def expired(job: TrainingJob, status: TrainingJobStatus, state: JobState, now: float) -> str | None:
    """Why the job must fail now, or None."""
    limit = job.spec.active_deadline_seconds
    if limit is None or state.phase.terminal or job.spec.suspend:
        return None
    since = active_since(status, state)
    if since is None or now - since < limit:
        return None
    return f"active for {now - since:.0f}s, past spec.activeDeadlineSeconds ({limit}s)"
