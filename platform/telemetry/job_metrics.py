"""Job-level metrics, computed from a job's records in etcd at each scrape.

The controller keeps everything a platform team wants to graph in etcd already (JobState, incidents,
heartbeats, the spec), so these metrics are read, not kept: nothing is lost when the process that
serves them restarts, counters are the totals the records hold (the job's incidents, evictions and
restarts so far), and two exporters over one etcd agree. Histograms are rebuilt from every incident
at each scrape: a job has tens or hundreds of incidents, not millions.

Two values are not in etcd and are remembered here, per job: the newest progress report and the
newest committed checkpoint step seen in heartbeats (a heartbeat only holds the current generation,
which has reported nothing for the first seconds after a restart).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from stalwart.controller.core.detectors.throughput import job_throughput
from stalwart.controller.core.ettr import compute_ettr
from stalwart.controller.core.standbys import role_standbys
from stalwart.logs import get_logger
from stalwart.spec import SpecError, TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.jobs import read_spec
from stalwart.store.nodes import NodeRecords, read_nodes
from stalwart.store.records import Incident, JobPhase, JobState

JOB = "training_job"
log = get_logger("stalwart.telemetry")

# Detection is sub-second to minutes (a hang waits for its adaptive timeout); diagnosis and
# recovery are seconds to tens of minutes (stop-time checks, a replay).
DETECT_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RECOVERY_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


@dataclass
class JobRecords:
    """One job as etcd holds it now."""

    name: str
    state: JobState
    job: TrainingJob | None
    incidents: list[Incident]
    nodes: NodeRecords
    controller_up: bool


@dataclass
class Memo:
    """What heartbeats showed earlier, per job (see the module docstring)."""

    last_progress: dict[str, float] = field(default_factory=dict)
    last_checkpoint: dict[str, int] = field(default_factory=dict)


def read_job(store: Store, name: str) -> JobRecords | None:
    state = store.get(keys.job_state(name), JobState)
    if state is None:
        return None
    try:
        job = read_spec(store, name)
    except SpecError:
        job = None
    return JobRecords(
        name=name,
        state=state,
        job=job,
        incidents=store.get_prefix(keys.incidents_prefix(name), Incident),
        nodes=read_nodes(store, name),
        controller_up=store.get_raw(keys.job_leader(name)) is not None,
    )


def job_names(store: Store) -> list[str]:
    """Every job with a state record."""
    prefix = keys.jobs_prefix()
    return sorted(
        {name for k in store.list_keys(prefix) if k.endswith("/state") and (name := keys.job_name_from_key(k))}
    )


def _histogram(name: str, doc: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=(JOB, "failure_class"))


def _add_observations(
    family: HistogramMetricFamily, labels: list[str], values: list[float], buckets: Sequence[float]
) -> None:
    cumulative = [(str(float(b)), float(sum(1 for v in values if v <= b))) for b in buckets]
    cumulative.append(("+Inf", float(len(values))))
    family.add_metric(labels, cumulative, sum_value=float(sum(values)))


def _active(state: JobState) -> bool:
    """Expected to make progress: neither finished nor suspended."""
    return not state.phase.terminal and state.phase.value != "Suspended"


def job_families(jobs: Sequence[JobRecords], memo: Memo, now: float) -> list[Metric]:
    """Every job-level family for these jobs (pure but for the memo)."""
    phase = GaugeMetricFamily(
        "stalwart_job_phase", "1 for the job's current phase, 0 for the others.", labels=(JOB, "phase")
    )
    active = GaugeMetricFamily(
        "stalwart_job_active", "1 while the job should be training: neither finished nor suspended.", labels=(JOB,)
    )
    generation = GaugeMetricFamily("stalwart_job_generation", "The job's current generation.", labels=(JOB,))
    step = GaugeMetricFamily("stalwart_job_step", "Newest training step of the job.", labels=(JOB,))
    progress = GaugeMetricFamily(
        "stalwart_job_last_progress_timestamp_seconds",
        "Unix time of the newest progress report of any rank of the job.",
        labels=(JOB,),
    )
    ettr = GaugeMetricFamily(
        "stalwart_job_ettr_ratio",
        "Effective training time ratio since the first step: productive time over wall time (0-1).",
        labels=(JOB,),
    )
    incidents = CounterMetricFamily(
        "stalwart_job_incidents", "Incidents the controller recorded, by failure class.", labels=(JOB, "failure_class")
    )
    detection = _histogram("stalwart_job_detection_duration_seconds", "From a failure to its detection, per incident.")
    diagnosis = _histogram(
        "stalwart_job_diagnosis_duration_seconds",
        "From detection to the diagnosis verdict, per incident that was diagnosed.",
    )
    recovery = _histogram(
        "stalwart_job_recovery_duration_seconds",
        "From a failure to the first training step after it (the incident's downtime), per recovered incident.",
    )
    evictions = CounterMetricFamily(
        "stalwart_job_evictions", "Nodes the controller evicted from the job, by node.", labels=(JOB, "node")
    )
    hot_swaps = CounterMetricFamily(
        "stalwart_job_hot_swaps",
        "Evicted nodes replaced by a warm standby (which inherits their ranks).",
        labels=(JOB,),
    )
    standbys = GaugeMetricFamily("stalwart_job_standbys", "Warm standbys ready now.", labels=(JOB,))
    standbys_wanted = GaugeMetricFamily(
        "stalwart_job_standbys_wanted",
        "Warm standbys the job's spec asks for (every role's pool together).",
        labels=(JOB,),
    )
    restarts = CounterMetricFamily(
        "stalwart_job_restarts",
        "Restarts of the job's workers, by cause: counted (against maxRestarts) or infrastructure.",
        labels=(JOB, "cause"),
    )
    nodes_up = GaugeMetricFamily(
        "stalwart_job_node_up",
        "1 when the node holding a slot of the job has a live registration.",
        labels=(JOB, "node"),
    )
    checkpoint = GaugeMetricFamily(
        "stalwart_job_last_checkpoint_step",
        "Newest checkpoint step the job's ranks reported committed (or resumed from).",
        labels=(JOB,),
    )
    interval = GaugeMetricFamily(
        "stalwart_job_checkpoint_interval_steps", "The spec's checkpoint.intervalSteps.", labels=(JOB,)
    )
    tokens = GaugeMetricFamily(
        "stalwart_job_tokens_per_second", "Tokens per second: the running ranks' last steps, summed.", labels=(JOB,)
    )
    flops = GaugeMetricFamily(
        "stalwart_job_model_flops_per_second",
        "Model FLOP/s the running ranks report (report_step flops= over the step time), summed.",
        labels=(JOB,),
    )
    mfu = GaugeMetricFamily(
        "stalwart_job_mfu_ratio",
        "Model FLOPs utilization (0-1): the model FLOP/s over the ranks' peak (the roles' peakFlopsPerWorker).",
        labels=(JOB,),
    )
    controller = GaugeMetricFamily(
        "stalwart_job_controller_up", "1 while a controller holds the job's leadership in etcd.", labels=(JOB,)
    )
    for rec in jobs:
        name, state = rec.name, rec.state
        for p in JobPhase:
            phase.add_metric([name, p.value], 1.0 if p is state.phase else 0.0)
        active.add_metric([name], 1.0 if _active(state) else 0.0)
        generation.add_metric([name], float(state.generation))
        controller.add_metric([name], 1.0 if rec.controller_up else 0.0)
        workers = state.current_workers(rec.nodes.heartbeats)
        steps = [w.step for w in workers if w.step is not None]
        newest_step = max(steps) if steps else state.last_step
        if newest_step is not None:
            step.add_metric([name], float(newest_step))
        seen = [w.last_progress_at for w in workers if w.last_progress_at is not None]
        if seen:
            memo.last_progress[name] = max(memo.last_progress.get(name, 0.0), max(seen))
        if name in memo.last_progress:
            progress.add_metric([name], memo.last_progress[name])
        # A worker's newest commit, else the step it resumed from (a checkpoint committed before).
        committed = [w.last_checkpoint_step for w in workers if w.last_checkpoint_step is not None]
        committed += [w.first_step - 1 for w in workers if w.first_step is not None]
        if committed:
            memo.last_checkpoint[name] = max(memo.last_checkpoint.get(name, 0), max(committed))
        if name in memo.last_checkpoint:
            checkpoint.add_metric([name], float(memo.last_checkpoint[name]))
        pace = job_throughput(workers, rec.job.spec if rec.job is not None else None)
        for family, value in ((tokens, pace.tokens_per_second), (flops, pace.flops_per_second), (mfu, pace.mfu)):
            if value is not None:
                family.add_metric([name], value)
        report = compute_ettr(state, rec.incidents, now)
        if report.ettr is not None:
            ettr.add_metric([name], min(1.0, max(0.0, report.ettr)))
        _incident_families(rec, incidents, detection, diagnosis, recovery, evictions, hot_swaps)
        restarts.add_metric([name, "counted"], float(state.restarts))
        restarts.add_metric([name, "infrastructure"], float(state.infra_restarts))
        standbys.add_metric([name], float(len(state.standbys)))
        registered = rec.nodes.registrations
        for node in state.slots:
            nodes_up.add_metric([name, node], 1.0 if node in registered else 0.0)
        if rec.job is not None:
            spec = rec.job.spec
            standbys_wanted.add_metric([name], float(sum(role_standbys(spec).values())))  # each role its own pool
            interval.add_metric([name], float(spec.checkpoint.interval_steps))
    return [
        phase,
        active,
        generation,
        step,
        progress,
        ettr,
        incidents,
        detection,
        diagnosis,
        recovery,
        evictions,
        hot_swaps,
        standbys,
        standbys_wanted,
        restarts,
        nodes_up,
        checkpoint,
        interval,
        tokens,
        flops,
        mfu,
        controller,
    ]


def _incident_families(
    rec: JobRecords,
    incidents: CounterMetricFamily,
    detection: HistogramMetricFamily,
    diagnosis: HistogramMetricFamily,
    recovery: HistogramMetricFamily,
    evictions: CounterMetricFamily,
    hot_swaps: CounterMetricFamily,
) -> None:
    by_class: dict[str, list[Incident]] = {}
    for inc in rec.incidents:
        by_class.setdefault(inc.failure_class.value, []).append(inc)
    evicted: dict[str, int] = {}
    swaps = 0
    for cls, group in sorted(by_class.items()):
        labels = [rec.name, cls]
        incidents.add_metric(labels, float(len(group)))
        _add_observations(detection, labels, [max(0.0, i.detected_at - i.failed_at) for i in group], DETECT_BUCKETS)
        _add_observations(
            diagnosis,
            labels,
            [max(0.0, i.diagnosed_at - i.detected_at) for i in group if i.diagnosed_at is not None],
            RECOVERY_BUCKETS,
        )
        _add_observations(
            recovery, labels, [d for i in group if (d := i.downtime) is not None and math.isfinite(d)], RECOVERY_BUCKETS
        )
        for inc in group:
            for node in inc.evicted:
                evicted[node] = evicted.get(node, 0) + 1
            swaps += len(inc.replacements)
    for node, count in sorted(evicted.items()):
        evictions.add_metric([rec.name, node], float(count))
    hot_swaps.add_metric([rec.name], float(swaps))


class JobMetricsCollector(Collector):
    """A prometheus_client collector: reads etcd at every scrape. `jobs` narrows it to those jobs
    (`stalwart run`); None serves every job in etcd (the operator). `leading` (a callable) lets a
    standby replica serve only its own liveness, so two replicas never export one job twice."""

    def __init__(self, store: Store, jobs: Iterable[str] | None = None, leading: object = None) -> None:
        self.store = store
        self.jobs = sorted(jobs) if jobs is not None else None
        self.leading = leading
        self.memo = Memo()

    def describe(self) -> list[Metric]:
        return []  # families depend on what etcd holds: nothing to pre-register

    def collect(self) -> Iterable[Metric]:
        t0 = time.perf_counter()
        up = GaugeMetricFamily("stalwart_etcd_up", "1 when the last read of etcd by this exporter succeeded.")
        leader = GaugeMetricFamily(
            "stalwart_job_exporter_leader", "1 when this exporter serves the job metrics (the leading replica)."
        )
        leads = bool(self.leading()) if callable(self.leading) else True
        leader.add_metric([], 1.0 if leads else 0.0)
        families: list[Metric] = []
        if leads:
            try:
                names = self.jobs if self.jobs is not None else job_names(self.store)
                records = [r for n in names if (r := read_job(self.store, n)) is not None]
                families = job_families(records, self.memo, time.time())
                up.add_metric([], 1.0)
            except StoreUnavailable as exc:
                log.warning("etcd unavailable for job metrics", fields={"error": str(exc)})
                up.add_metric([], 0.0)
        took = GaugeMetricFamily(
            "stalwart_job_exporter_scrape_duration_seconds", "Time this exporter took to read etcd for the scrape."
        )
        took.add_metric([], time.perf_counter() - t0)
        return [*([up] if leads else []), leader, took, *families]
