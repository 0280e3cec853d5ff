"""Many seeds, every strategy on the same traces, summarised with mean and spread.

Usage: `run_default(seeds=range(10))` returns a `Summary`; `report.markdown` renders it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from pydantic import BaseModel

from stalwart.simulator.control_plane import ControlPlaneAtScale, load_control_plane
from stalwart.simulator.measured import MeasuredRecovery, load_measured
from stalwart.simulator.model import Component, RunResult, generate_trace, simulate
from stalwart.simulator.rates import FailureClass, default_classes
from stalwart.simulator.scaling import JobModel, ScaledRecovery, scale
from stalwart.simulator.strategies import Strategy, default_strategies

MAX_SEEDS = 1000


class Spread(BaseModel):
    mean: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(
            mean=statistics.fmean(values),
            std=statistics.pstdev(values) if len(values) > 1 else 0.0,
            min=min(values),
            max=max(values),
        )


class ClassStats(BaseModel):
    count: float  # mean incidents per run
    mttr_seconds: float  # mean failure-to-first-step (downtime, or a straggler's slowed window)
    lost_work_seconds: float  # mean work redone per incident
    total_hours: float  # mean unproductive hours per run attributed to the class


class StrategySummary(BaseModel):
    strategy: str
    description: str
    ettr: Spread
    lost_hours: dict[Component, float]  # mean per run
    classes: dict[str, ClassStats]
    standbys: int | None
    cold_replacements: float
    checkpoint_interval_seconds: float
    restart_seconds: float
    failed_decisions: float


class Summary(BaseModel):
    seeds: list[int]
    job: JobModel
    measured: MeasuredRecovery
    control_plane: ControlPlaneAtScale
    scaled: ScaledRecovery
    strategies: list[StrategySummary]
    expected_failures: float


def summarise(strategy: Strategy, runs: list[RunResult]) -> StrategySummary:
    n = len(runs)
    lost: dict[Component, float] = defaultdict(float)
    per_class: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for run in runs:
        for c, s in run.lost.items():
            lost[c] += s / 3600.0 / n
        for inc in run.incidents:
            per_class[inc.cls].append(
                (inc.time_to_recover, inc.seconds.get(Component.LOST_WORK, 0.0), sum(inc.seconds.values()))
            )
    classes = {
        name: ClassStats(
            count=len(rows) / n,
            mttr_seconds=statistics.fmean(r[0] for r in rows),
            lost_work_seconds=statistics.fmean(r[1] for r in rows),
            total_hours=sum(r[2] for r in rows) / 3600.0 / n,
        )
        for name, rows in sorted(per_class.items())
    }
    return StrategySummary(
        strategy=strategy.name,
        description=strategy.description,
        ettr=Spread.of([r.ettr for r in runs]),
        lost_hours=dict(lost),
        classes=classes,
        standbys=strategy.standbys,
        cold_replacements=statistics.fmean(r.cold_replacements for r in runs),
        checkpoint_interval_seconds=strategy.checkpoint_interval_seconds,
        restart_seconds=strategy.restart_seconds,
        failed_decisions=statistics.fmean(r.failed_decisions for r in runs),
    )


def run_many(
    strategies: list[Strategy], classes: list[FailureClass], job: JobModel, seeds: Iterable[int]
) -> dict[str, list[RunResult]]:
    """Every strategy on the same trace for each seed."""
    out: dict[str, list[RunResult]] = {s.name: [] for s in strategies}
    for count, seed in enumerate(seeds):
        if count >= MAX_SEEDS:
            break
        trace = generate_trace(classes, job, seed)
        for strategy in strategies:
            out[strategy.name].append(simulate(trace, strategy))
    return out


def run_default(
    seeds: Iterable[int] = range(10),
    *,
    job: JobModel | None = None,
    measured: MeasuredRecovery | None = None,
    classes: list[FailureClass] | None = None,
    strategies: list[Strategy] | None = None,
    control_plane: ControlPlaneAtScale | None = None,
) -> Summary:
    """The published table: the 9,600-GPU, 90-day job under the three strategies."""
    job = job or JobModel()
    measured = measured or load_measured()
    control_plane = control_plane or load_control_plane(nodes=job.nodes)
    classes = classes if classes is not None else default_classes()
    strategies = strategies or default_strategies(measured, job, classes, control_plane)
    seed_list = list(seeds)[:MAX_SEEDS]
    runs = run_many(strategies, classes, job, seed_list)
    expected = sum(c.per_second(job.gpus) for c in classes if c.event is not None) * job.horizon_seconds
    return Summary(
        seeds=seed_list,
        job=job,
        measured=measured,
        control_plane=control_plane,
        scaled=scale(measured, job),
        strategies=[summarise(s, runs[s.name]) for s in strategies],
        expected_failures=expected,
    )
