"""One simulated job: a failure trace, played against one strategy in simulated time.

Each failure becomes a `Classified` and goes through the controller's `decide` with the
strategy's `FailurePolicy` and running `Counters`; the decision (Evict / Restart / Rollback /
Fail / Ignore, with or without stop-time checks) picks which recovery components the incident
pays. Evictions draw on a `StandbyPool` sized by `standbys_for`.

Accounting (the same definition as stalwart.controller.core.ettr): unproductive time is each
incident's downtime (failure to first step after recovery) plus the work it makes the job redo,
plus time spent slowed by a straggler (the fraction of its speed lost) and checkpoint stalls.
ETTR = 1 - unproductive / wall time.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
from pydantic import BaseModel, ConfigDict

from stalwart.controller.core.policy import Classified, Counters, count, decide
from stalwart.simulator.events import EventQueue, Kind
from stalwart.simulator.pool import StandbyPool
from stalwart.simulator.rates import Detection, FailureClass
from stalwart.simulator.scaling import JobModel
from stalwart.simulator.strategies import RestartMode, Strategy
from stalwart.spec.model import FailureAction, FailureEvent


class Arrival(BaseModel):
    """One failure (or planned update) in the trace. `phase` is where in the checkpoint interval it
    lands (uniform: Poisson arrivals ignore the checkpoint schedule), drawn once so that every
    strategy replays the same draws."""

    model_config = ConfigDict(frozen=True)

    time: float
    cls: int  # index into Trace.classes
    node: int
    phase: float


class Trace(BaseModel):
    model_config = ConfigDict(frozen=True)

    seed: int
    horizon_seconds: float
    nodes: int
    classes: list[FailureClass]
    arrivals: list[Arrival]


def generate_trace(classes: list[FailureClass], job: JobModel, seed: int) -> Trace:
    """Poisson arrivals per class over the job's wall time, reproducible from `seed`."""
    rng = np.random.default_rng(seed)
    horizon = job.horizon_seconds
    arrivals: list[Arrival] = []
    for index, cls in enumerate(classes):
        n = int(rng.poisson(cls.per_second(job.gpus) * horizon))
        times, nodes, phases = rng.uniform(0, horizon, n), rng.integers(0, job.nodes, n), rng.uniform(0, 1, n)
        arrivals += [
            Arrival(time=float(t), cls=index, node=int(k), phase=float(p))
            for t, k, p in zip(times, nodes, phases, strict=True)
        ]
    arrivals.sort(key=lambda a: (a.time, a.cls, a.node))
    return Trace(seed=seed, horizon_seconds=horizon, nodes=job.nodes, classes=list(classes), arrivals=arrivals)


class Component(str, Enum):
    """Where unproductive time goes."""

    DETECT = "detect"
    DIAGNOSE = "diagnose"  # stack capture, stop-time checks
    WAIT_FOR_NODE = "wait_for_node"  # the standby pool was empty: a cold replacement
    RESTART = "restart"  # hot-swap / in-place restart / requeue, to the first step
    MANUAL = "manual"  # a human fixes the code and resubmits
    LOST_WORK = "lost_work"  # steps redone since the checkpoint resumed from
    DEGRADED = "degraded"  # speed lost to a straggler before it was evicted
    CHECKPOINT_STALL = "checkpoint_stall"


DOWNTIME = (Component.DETECT, Component.DIAGNOSE, Component.WAIT_FOR_NODE, Component.RESTART, Component.MANUAL)


class Incident(BaseModel):
    cls: str
    event: FailureEvent | None
    action: FailureAction | None
    failed_at: float
    deferred: bool = False  # arrived while the job was already down; handled when it came back
    evicted: int = 0
    seconds: dict[Component, float]
    window_seconds: float = 0.0  # wall time not training at full speed: failure to first step after

    @property
    def time_to_recover(self) -> float:
        """Failure (or, for a deferred one, the job's return) to the first step after recovery."""
        return self.window_seconds


class RunResult(BaseModel):
    strategy: str
    seed: int
    horizon_seconds: float
    ettr: float
    lost: dict[Component, float]
    incidents: list[Incident]
    standbys: int | None
    cold_replacements: int
    checkpoint_interval_seconds: float
    failed_decisions: int


def simulate(trace: Trace, strategy: Strategy) -> RunResult:
    """Play `trace` against `strategy`; deterministic."""
    horizon = trace.horizon_seconds
    counters = Counters()
    pool = StandbyPool(strategy.standbys, strategy.replenish_seconds) if strategy.standbys is not None else None
    queue = EventQueue(max_events=4 * len(trace.arrivals) + 16)
    for i, a in enumerate(trace.arrivals):
        queue.push(a.time, Kind.FAILURE, arrival=i)

    incidents: list[Incident] = []
    up_at = 0.0  # the job trains from here on (after the current recovery)
    pending_update: int | None = None  # token of a code update waiting for a restart
    tokens = 0
    failed = 0
    down_total = 0.0  # wall time not training (downtime plus straggler periods), for the stall share

    while (ev := queue.pop()) is not None:
        if ev.time >= horizon:
            break
        arrival = trace.arrivals[ev.arrival] if ev.arrival >= 0 else None
        t = max(ev.time, up_at)
        deferred = ev.time < up_at
        if t >= horizon:
            continue

        if ev.kind is Kind.UPDATE_DEADLINE:
            if pending_update != ev.token:
                continue  # a restart already applied it
            pending_update = None
            inc = _planned(trace, arrival, t, strategy, forced=True)
        else:
            assert arrival is not None
            cls = trace.classes[arrival.cls]
            if cls.detection is Detection.PLANNED:
                if deferred:
                    continue  # the restart under way picks the update up
                if strategy.lazy_updates:
                    if pending_update is not None:
                        continue  # the restart already awaited applies this one too
                    tokens += 1
                    pending_update = tokens
                    if strategy.hot_update_deadline_seconds is not None:
                        queue.push(
                            t + strategy.hot_update_deadline_seconds,
                            Kind.UPDATE_DEADLINE,
                            arrival=ev.arrival,
                            token=tokens,
                        )
                    continue
                inc = _planned(trace, arrival, t, strategy, forced=False)
            else:
                since_resume = 0.0 if deferred else t - up_at
                inc, counters = _failure(cls, arrival, t, since_resume, strategy, counters, pool, trace.nodes)
                inc.deferred = deferred
                if ev.kind is Kind.RECURRENCE:
                    inc.cls += " (retry)"
                if inc.action is FailureAction.FAIL:
                    failed += 1
                if inc.action is not FailureAction.IGNORE:
                    pending_update = None  # every restart picks up the newest code

        inc = _clip(inc, t, horizon)
        incidents.append(inc)
        down_total += inc.window_seconds
        up_at = t + inc.window_seconds
        if inc.event is FailureEvent.USER_CODE_ERROR and inc.action is FailureAction.RESTART and arrival is not None:
            # A deterministic user-code error fails again on its first step after the retry.
            queue.push(up_at + strategy.step_seconds, Kind.RECURRENCE, arrival=ev.arrival)

    lost: dict[Component, float] = dict.fromkeys(Component, 0.0)
    for inc in incidents:
        for c, s in inc.seconds.items():
            lost[c] += s
    running = max(0.0, horizon - down_total)
    stall = strategy.checkpoint_stall_seconds
    lost[Component.CHECKPOINT_STALL] = running * stall / (strategy.checkpoint_interval_seconds + stall)
    unproductive = min(horizon, sum(lost.values()))
    return RunResult(
        strategy=strategy.name,
        seed=trace.seed,
        horizon_seconds=horizon,
        ettr=1.0 - unproductive / horizon,
        lost=lost,
        incidents=incidents,
        standbys=strategy.standbys,
        cold_replacements=pool.cold if pool else 0,
        checkpoint_interval_seconds=strategy.checkpoint_interval_seconds,
        failed_decisions=failed,
    )


def _planned(trace: Trace, arrival: Arrival | None, t: float, strategy: Strategy, *, forced: bool) -> Incident:
    """A code/config update: checkpoint, then restart (in place, or a whole requeue). No work is lost."""
    name = trace.classes[arrival.cls].name if arrival is not None else "Planned update"
    return Incident(
        cls=name + (" (forced at deadline)" if forced else ""),
        event=None,
        action=FailureAction.RESTART,
        failed_at=t,
        seconds={Component.RESTART: strategy.restart_seconds},
        window_seconds=strategy.restart_seconds,
    )


def _failure(
    cls: FailureClass,
    arrival: Arrival,
    t: float,
    since_resume: float,
    strategy: Strategy,
    counters: Counters,
    pool: StandbyPool | None,
    nodes: int,
) -> tuple[Incident, Counters]:
    """Detect, classify, `decide`, then pay for what the decision does."""
    assert cls.event is not None
    suspects: list[str] = []
    if strategy.knows_suspects and cls.machine_at_fault and cls.detection is not Detection.NAN:
        suspects = [f"node-{(arrival.node + i) % nodes}" for i in range(cls.nodes)]
    decision = decide(
        Classified(cls.event, suspects), strategy.policy, counters, checks_enabled=strategy.checks_enabled
    )
    counters = count(counters, decision)
    seconds: dict[Component, float] = {}
    detect = strategy.detection_seconds(cls)
    slow = cls.detection is Detection.SLOW
    if slow:
        # The job keeps training, slowed by the straggler, until it is evicted.
        seconds[Component.DEGRADED] = detect * (1.0 - 1.0 / cls.slow_factor)
    else:
        seconds[Component.DETECT] = detect
    action = decision.action
    interval = strategy.checkpoint_interval_seconds
    evicted = 0

    if action is FailureAction.IGNORE:
        return _incident(cls, action, t, seconds, 0, detect), counters
    if action is FailureAction.FAIL:
        # The job fails with a reason; a human fixes the cause and resubmits: a full requeue from the
        # remote tier (host-memory checkpoints do not outlive a failed job).
        seconds[Component.MANUAL] = strategy.manual_fix_seconds
        seconds[Component.RESTART] = strategy.resubmit_seconds
        seconds[Component.LOST_WORK] = min(arrival.phase * strategy.remote_checkpoint_interval_seconds, since_resume)
        return _incident(cls, action, t, seconds, 0, detect), Counters()

    diagnose = 0.0
    if cls.detection is Detection.HANG and strategy.knows_suspects:
        diagnose += strategy.stack_capture_seconds
    if decision.stop_time_checks:
        diagnose += strategy.stop_time_check_seconds
    if diagnose:
        seconds[Component.DIAGNOSE] = diagnose
    if action is FailureAction.EVICT:
        evicted = len(decision.suspects)
    elif decision.stop_time_checks and cls.machine_at_fault:
        evicted = cls.nodes  # the checks find the faulty machine; it is evicted before the restart
    if evicted and pool is not None and strategy.restart_mode is RestartMode.IN_PLACE:
        wait = pool.take(evicted, t + detect + diagnose)
        if wait > 0:
            seconds[Component.WAIT_FOR_NODE] = wait
    seconds[Component.RESTART] = strategy.restart_seconds
    lost = min(arrival.phase * interval, since_resume)
    if action is FailureAction.ROLLBACK:
        lost += strategy.policy.rollback_checkpoints * interval
    seconds[Component.LOST_WORK] = lost
    return _incident(cls, action, t, seconds, evicted, detect), counters


def _incident(
    cls: FailureClass, action: FailureAction, t: float, seconds: dict[Component, float], evicted: int, detect: float
) -> Incident:
    """An incident whose window is its downtime, plus the straggler's slowed period if it was one."""
    window = sum(seconds.get(c, 0.0) for c in DOWNTIME)
    if cls.detection is Detection.SLOW:
        window += detect
    return Incident(
        cls=cls.name,
        event=cls.event,
        action=action,
        failed_at=t,
        evicted=evicted,
        seconds=seconds,
        window_seconds=window,
    )


def _clip(inc: Incident, t: float, horizon: float) -> Incident:
    """An incident still open at the end of the window only costs the time inside it."""
    room = horizon - t
    if inc.window_seconds <= room:
        return inc
    f = room / inc.window_seconds
    return inc.model_copy(update={"seconds": {c: s * f for c, s in inc.seconds.items()}, "window_seconds": room})
