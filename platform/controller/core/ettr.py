"""Effective training time ratio and per-class MTTR, computed from recorded incidents, not estimated.

Window: from the job's first training step to its end (or now), optionally narrowed to
[since, until] (e.g. the last 24 hours), less the time the job was suspended (spec.suspend: the
user's choice, neither productive nor the platform's fault). Unproductive time in it is each
incident's downtime (failure to first step after recovery) clipped to the window and outside any
suspension, plus the work it made the job redo (steps between the restored checkpoint and the
failure, at the mean step time). A role-scoped incident (an RLHF rollout that died while the actor
trained on) costs the job only until the roles that kept running stepped again. Time a role ran
below its replicas (elastic data parallelism: `JobState.resizes`) counts at the capacity it had: an
hour at 4 of 6 ranks is 40 minutes productive, 20 reduced (outside the incidents' downtime, which
already counts whole).

Per role (multi-role jobs): how often each role failed, how long until the job stepped again with
the role back (its MTTR), and its share of the job's downtime.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

from pydantic import BaseModel

from stalwart.store.records import Incident, JobState, Suspension


class EttrReport(BaseModel):
    window_seconds: float
    downtime_seconds: float
    lost_work_seconds: float
    productive_seconds: float
    ettr: float | None
    reduced_capacity_seconds: float = 0.0  # the share of the window's capacity a shrunk role lacked


class ClassMttr(BaseModel):
    failure_class: str
    incidents: int
    recovered: int
    mttr_seconds: float | None  # mean failure-to-first-step of the recovered ones
    mean_detect_seconds: float | None
    downtime_seconds: float


def compute_ettr(
    state: JobState, incidents: list[Incident], now: float, *, since: float | None = None, until: float | None = None
) -> EttrReport:
    if state.first_step_at is None:
        return EttrReport(window_seconds=0, downtime_seconds=0, lost_work_seconds=0, productive_seconds=0, ettr=None)
    start = max(state.first_step_at, since if since is not None else state.first_step_at)
    end = min(state.finished_at or now, until if until is not None else now)
    window = _outside(start, end, state.suspensions, now)
    downtime = 0.0
    lost = 0.0
    down: list[tuple[float, float]] = []
    for inc in incidents:
        if inc.failed_at < state.first_step_at or inc.failed_at >= end:
            continue
        down_end = inc.failed_at + inc.downtime if inc.downtime is not None else end
        downtime += _outside(max(inc.failed_at, start), min(down_end, end), state.suspensions, now)
        down.append((max(inc.failed_at, start), min(down_end, end)))
        if inc.failed_at >= start:
            lost += inc.lost_work_seconds
    reduced = _reduced_capacity(state, start, end, down, now)
    productive = max(0.0, window - downtime - lost - reduced)
    return EttrReport(
        window_seconds=window,
        downtime_seconds=downtime,
        lost_work_seconds=lost,
        productive_seconds=productive,
        ettr=(productive / window) if window > 0 else None,
        reduced_capacity_seconds=reduced,
    )


def _reduced_capacity(state: JobState, start: float, end: float, down: list[tuple[float, float]], now: float) -> float:
    """Seconds of [start, end] times the capacity a shrunk role lacked, outside suspensions and the
    incidents' downtime (`down`)."""
    resizes = sorted(state.resizes, key=lambda r: r.at)
    suspended = [(x.started_at, x.ended_at if x.ended_at is not None else now) for x in state.suspensions]
    gaps = [Suspension(started_at=a, ended_at=b) for a, b in _merged([*suspended, *down])]
    out = 0.0
    for i, resize in enumerate(resizes):
        seg_start = max(start, resize.at)
        seg_end = min(end, resizes[i + 1].at if i + 1 < len(resizes) else end)
        if resize.capacity < 1.0 and seg_end > seg_start:
            out += (1.0 - resize.capacity) * _outside(seg_start, seg_end, gaps, now)
    return out


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _outside(start: float, end: float, suspensions: list[Suspension], now: float) -> float:
    """Seconds of [start, end] when the job was not suspended."""
    inside = sum(
        max(0.0, min(end, s.ended_at if s.ended_at is not None else now) - max(start, s.started_at))
        for s in suspensions
    )
    return max(0.0, end - start - inside)


def mttr_by_class(
    incidents: list[Incident], *, since: float | None = None, until: float | None = None
) -> list[ClassMttr]:
    """Per failure class: how many, how fast detected, how long until training resumed."""
    groups: dict[str, list[Incident]] = defaultdict(list)
    for inc in incidents:
        if (since is None or inc.failed_at >= since) and (until is None or inc.failed_at < until):
            groups[inc.failure_class.value].append(inc)
    out = []
    for cls, incs in sorted(groups.items()):
        downs = [d for i in incs if (d := i.downtime) is not None]
        out.append(
            ClassMttr(
                failure_class=cls,
                incidents=len(incs),
                recovered=len(downs),
                mttr_seconds=mean(downs) if downs else None,
                mean_detect_seconds=mean(i.detected_at - i.failed_at for i in incs),
                downtime_seconds=sum(downs),
            )
        )
    return out


class RoleMttr(BaseModel):
    role: str
    incidents: int
    recovered: int
    role_scoped: int  # restarted that role alone
    mttr_seconds: float | None  # mean failure-to-first-step after the role's restart
    downtime_seconds: float  # the job's downtime these incidents caused


def mttr_by_role(incidents: list[Incident]) -> list[RoleMttr]:
    """Per role that failed (incidents with no role are the job's)."""
    groups: dict[str, list[Incident]] = defaultdict(list)
    for inc in incidents:
        groups[inc.role or "(job)"].append(inc)
    out = []
    for role, incs in sorted(groups.items()):
        recoveries = [r for i in incs if (r := i.recovery) is not None]
        out.append(
            RoleMttr(
                role=role,
                incidents=len(incs),
                recovered=len(recoveries),
                role_scoped=sum(1 for i in incs if i.scope == "Role"),
                mttr_seconds=mean(recoveries) if recoveries else None,
                downtime_seconds=sum(d for i in incs if (d := i.downtime) is not None),
            )
        )
    return out
