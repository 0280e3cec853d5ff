"""Effective training time ratio, computed from recorded incidents rather than estimated.

Window: from the job's first training step to its end (or now). Unproductive time in it is each
incident's downtime (failure to first step after recovery) plus the work it made the job redo
(steps between the restored checkpoint and the failure, at the mean step time).
"""

from __future__ import annotations

from pydantic import BaseModel

from stalwart.store.records import Incident, JobState


class EttrReport(BaseModel):
    window_seconds: float
    downtime_seconds: float
    lost_work_seconds: float
    productive_seconds: float
    ettr: float | None


def compute_ettr(state: JobState, incidents: list[Incident], now: float) -> EttrReport:
    if state.first_step_at is None:
        return EttrReport(
            window_seconds=0, downtime_seconds=0, lost_work_seconds=0, productive_seconds=0, ettr=None
        )
    end = state.finished_at or now
    window = max(0.0, end - state.first_step_at)
    downtime = 0.0
    lost = 0.0
    for inc in incidents:
        if inc.failed_at < state.first_step_at:
            continue
        down_end = inc.first_step_at if inc.first_step_at is not None else end
        downtime += max(0.0, min(down_end, end) - inc.failed_at)
        lost += inc.lost_work_seconds
    productive = max(0.0, window - downtime - lost)
    return EttrReport(
        window_seconds=window,
        downtime_seconds=downtime,
        lost_work_seconds=lost,
        productive_seconds=productive,
        ettr=(productive / window) if window > 0 else None,
    )
