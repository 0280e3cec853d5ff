"""The Grafana dashboard, built in code with grafana-foundation-sdk's typed builders.

The committed JSON (charts/stalwart/dashboards/stalwart.json, also packaged with stalwart.telemetry
for `stalwart dashboards push`) is generated here; a test fails when it differs. Regenerate with:

    python -m stalwart.telemetry.dashboard > charts/stalwart/dashboards/stalwart.json

Three rows: the fleet, one job (the `$job` variable: phase timeline, ETTR, incidents, throughput,
loss, per-node health and GPUs, standbys) and its checkpoints. `$namespace` narrows both to one
Kubernetes namespace (a TrainingJob's `training_job` is `<namespace>.<name>`; `stalwart run`'s jobs
have none and show under All). Runbooks cite panels by their titles (`Grafana panel "Throughput"`);
a test checks every title they cite is here. Every query selects by `training_job`, never `job`
(Prometheus's own target label). Counters are shown as increases or rates over `$__rate_interval`
and histogram quantiles are taken over the rate of their buckets, so a panel shows what happened
then, not since the job started; an e2e test runs every query against a real Prometheus scraping a
live `stalwart run` job.

grafana-foundation-sdk is needed only to regenerate (the `observability-dev` extra); the product
reads the committed JSON.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Literal

UID = "stalwart-training"
TITLE = "Stalwart training"
JOB = 'training_job=~"$job"'
# The fleet's jobs in the chosen namespace (All: every job, `stalwart run`'s included).
NAMESPACE = 'training_job=~"$namespace\\\\..+|$namespace"'
RATE = "$__rate_interval"

Kind = Literal["timeseries", "stat", "statetimeline"]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: Kind = "timeseries"
    width: int = 8


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


def quantile(phi: float, histogram: str, legend: str) -> Query:
    """A quantile of the observations in each interval (the rate of the buckets), not since the start."""
    return q(f"histogram_quantile({phi}, sum by (le) (rate({histogram}_bucket{{{JOB}}}[{RATE}])))", legend)


FLEET = (
    PanelSpec(
        "Jobs by phase",
        "How many jobs are in each phase now.",
        (q(f"sum by (phase) (stalwart_job_phase{{{NAMESPACE}}} == 1)", "{{phase}}"),),
        kind="stat",
    ),
    PanelSpec(
        "Throughput by job",
        "Tokens per second of each job: rate() of the ranks' token counters.",
        (q(f"sum by (training_job) (rate(stalwart_worker_tokens_total{{{NAMESPACE}}}[{RATE}]))", "{{training_job}}"),),
        unit="short",
    ),
    PanelSpec(
        "ETTR by job",
        "Effective training time ratio of each job since its first step.",
        (q(f"stalwart_job_ettr_ratio{{{NAMESPACE}}}", "{{training_job}}"),),
        unit="percentunit",
    ),
    PanelSpec(
        "Incidents by class",
        "Incidents recorded in each interval, by failure class, over every job.",
        (
            q(
                f"sum by (failure_class) (increase(stalwart_job_incidents_total{{{NAMESPACE}}}[{RATE}]))",
                "{{failure_class}}",
            ),
        ),
    ),
    PanelSpec(
        "Control plane",
        "etcd as the exporter sees it (1 up), and each job's controller (1 leading).",
        (
            q("max(stalwart_etcd_up)", "etcd"),
            q(f"stalwart_job_controller_up{{{NAMESPACE}}}", "controller {{training_job}}"),
        ),
        width=16,
    ),
)

ONE_JOB = (
    PanelSpec(
        "Phase timeline",
        "The job's phase over time.",
        (q(f"max by (phase) (stalwart_job_phase{{{JOB}}} == 1)", "{{phase}}"),),
        kind="statetimeline",
        width=24,
    ),
    PanelSpec(
        "ETTR", "Effective training time ratio.", (q(f"stalwart_job_ettr_ratio{{{JOB}}}", "ETTR"),), "percentunit"
    ),
    PanelSpec(
        "Incidents",
        "Incidents recorded in each interval, by failure class.",
        (q(f"sum by (failure_class) (increase(stalwart_job_incidents_total{{{JOB}}}[{RATE}]))", "{{failure_class}}"),),
    ),
    PanelSpec(
        "Recovery time by class",
        "Mean failure-to-first-step time (MTTR) by class, and mean detection time, over the job's incidents so far.",
        (
            q(
                f"sum by (failure_class) (stalwart_job_recovery_duration_seconds_sum{{{JOB}}}) / "
                f"sum by (failure_class) (stalwart_job_recovery_duration_seconds_count{{{JOB}}})",
                "recovery {{failure_class}}",
            ),
            q(
                f"sum by (failure_class) (stalwart_job_detection_duration_seconds_sum{{{JOB}}}) / "
                f"sum by (failure_class) (stalwart_job_detection_duration_seconds_count{{{JOB}}})",
                "detection {{failure_class}}",
            ),
        ),
        unit="s",
    ),
    PanelSpec(
        "Throughput",
        "Tokens per second over the job's ranks.",
        (q(f"sum(rate(stalwart_worker_tokens_total{{{JOB}}}[{RATE}]))", "tokens/s"),),
    ),
    PanelSpec("Loss", "The loss rank 0 reports.", (q(f'stalwart_worker_loss{{{JOB},rank="0"}}', "loss"),)),
    PanelSpec(
        "Step time by rank",
        "Each rank's last step time: a slow node's ranks stand out.",
        (q(f"stalwart_worker_step_time_seconds{{{JOB}}}", "rank {{rank}} ({{node}})"),),
        unit="s",
    ),
    PanelSpec(
        "Silent ranks",
        "Seconds since each rank last reported progress.",
        (q(f"time() - stalwart_worker_last_progress_timestamp_seconds{{{JOB}}}", "rank {{rank}}"),),
        unit="s",
    ),
    PanelSpec(
        "Node heartbeat age",
        "Seconds since each node's agent last sent a heartbeat; and 1/0 for a slot's live registration.",
        (
            q(f"time() - stalwart_agent_last_heartbeat_timestamp_seconds{{{JOB}}}", "{{node}}"),
            q(f"stalwart_job_node_up{{{JOB}}}", "registered {{node}}"),
        ),
        unit="s",
    ),
    PanelSpec(
        "Node CPU and memory",
        "Host CPU and memory use of each node (0-1).",
        (
            q(f"stalwart_node_cpu_utilization_ratio{{{JOB}}}", "cpu {{node}}"),
            q(f"stalwart_node_memory_utilization_ratio{{{JOB}}}", "memory {{node}}"),
        ),
        unit="percentunit",
    ),
    PanelSpec(
        "GPU utilization by node",
        "Mean utilization of each node's GPUs (0-1), as its agent's GPU probe reads them (NVML or nvidia-smi).",
        (q(f"stalwart_node_gpu_utilization_ratio{{{JOB}}}", "{{node}}"),),
        unit="percentunit",
    ),
    PanelSpec(
        "GPU temperature by node",
        "The hottest GPU of each node: a GPU near its slowdown temperature throttles its clocks.",
        (q(f"stalwart_node_gpu_temperature_celsius{{{JOB}}}", "{{node}}"),),
        unit="celsius",
    ),
    PanelSpec(
        "Machine faults by node",
        "1 when a probe of the node reports a machine fault (evict at once).",
        (q(f"max by (node) (stalwart_probe_machine_fault{{{JOB}}})", "{{node}}"),),
    ),
    PanelSpec(
        "Standbys",
        "Warm standbys ready, against the number the spec wants.",
        (q(f"stalwart_job_standbys{{{JOB}}}", "ready"), q(f"stalwart_job_standbys_wanted{{{JOB}}}", "wanted")),
    ),
    PanelSpec(
        "Restarts by cause",
        "Restarts in each interval: counted against maxRestarts, and those caused by the infrastructure.",
        (q(f"sum by (cause) (increase(stalwart_job_restarts_total{{{JOB}}}[{RATE}]))", "{{cause}}"),),
    ),
    PanelSpec(
        "Evictions by node",
        "Evictions of each node in each interval, and hot-swaps (a standby took the evicted node's ranks).",
        (
            q(f"sum by (node) (increase(stalwart_job_evictions_total{{{JOB}}}[{RATE}]))", "{{node}}"),
            q(f"sum(increase(stalwart_job_hot_swaps_total{{{JOB}}}[{RATE}]))", "hot-swaps"),
        ),
    ),
)

CHECKPOINTS = (
    PanelSpec(
        "Checkpoint age (steps)",
        "Steps since the newest committed checkpoint, against the save interval.",
        (
            q(f"stalwart_job_step{{{JOB}}} - stalwart_job_last_checkpoint_step{{{JOB}}}", "steps since"),
            q(f"stalwart_job_checkpoint_interval_steps{{{JOB}}}", "interval"),
        ),
    ),
    PanelSpec(
        "Checkpoint saves by outcome",
        "Saves the job's ranks finished in each interval, committed or failed.",
        (q(f"sum by (outcome) (increase(stalwart_checkpoint_saves_total{{{JOB}}}[{RATE}]))", "{{outcome}}"),),
    ),
    PanelSpec(
        "Checkpoint save stall",
        "Time training waited per save (the blocking part), 50th and 99th percentiles of the saves in each interval.",
        (
            quantile(0.5, "stalwart_checkpoint_save_stall_seconds", "p50"),
            quantile(0.99, "stalwart_checkpoint_save_stall_seconds", "p99"),
        ),
        unit="s",
    ),
    PanelSpec(
        "Checkpoint save duration",
        "Save from the call to the commit, 50th and 99th percentiles of the saves in each interval.",
        (
            quantile(0.5, "stalwart_checkpoint_save_duration_seconds", "p50"),
            quantile(0.99, "stalwart_checkpoint_save_duration_seconds", "p99"),
        ),
        unit="s",
    ),
    PanelSpec(
        "Checkpoint load duration by tier",
        "Mean load time on resume, by the tier the checkpoint came from.",
        (
            q(
                f"sum by (tier) (stalwart_checkpoint_load_duration_seconds_sum{{{JOB}}}) / "
                f"sum by (tier) (stalwart_checkpoint_load_duration_seconds_count{{{JOB}}})",
                "{{tier}}",
            ),
        ),
        unit="s",
    ),
    PanelSpec(
        "Checkpoint bytes by tier",
        "Bytes per second written into committed checkpoints, by tier.",
        (q(f"sum by (tier) (rate(stalwart_checkpoint_saved_bytes_total{{{JOB}}}[{RATE}]))", "{{tier}}"),),
        unit="Bps",
    ),
    PanelSpec(
        "Data loader ready batches",
        "Batches each node's shadow loader holds ready ahead of its trainers (0: the trainer waits on data).",
        (q(f"stalwart_dataloader_ready_batches{{{JOB}}}", "{{node}} lane {{lane}}"),),
    ),
)

ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Fleet overview", FLEET),
    ("Job: $job", ONE_JOB),
    ("Checkpoints: $job", CHECKPOINTS),
)


def panel_titles() -> list[str]:
    return [p.title for _, panels in ROWS for p in panels]


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, statetimeline, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

    datasource = DataSourceRef(type_val="prometheus", uid="${datasource}")

    def new_panel(kind: Kind) -> timeseries.Panel | stat.Panel | statetimeline.Panel:
        if kind == "stat":
            return stat.Panel()
        return statetimeline.Panel() if kind == "statetimeline" else timeseries.Panel()

    board = (
        dashboard.Dashboard(TITLE)
        .uid(UID)
        .tags(["stalwart", "training"])
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            dashboard.QueryVariable("namespace")
            .label("Namespace")
            .datasource(datasource)
            .query("label_values(stalwart_job_phase, training_job)")
            .regex("/^([^.]+)\\./")  # a TrainingJob's training_job is <namespace>.<name>
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
            .multi(False)
        )
        .with_variable(
            dashboard.QueryVariable("job")
            .label("Training job")
            .datasource(datasource)
            .query(f"label_values(stalwart_job_phase{{{NAMESPACE}}}, training_job)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .multi(False)
        )
    )
    for title, panels in ROWS:
        board = board.with_row(dashboard.Row(title))
        for spec in panels:
            panel = new_panel(spec.kind).title(spec.title).description(spec.description).datasource(datasource)
            panel = panel.unit(spec.unit).height(8).span(spec.width)
            for i, query in enumerate(spec.queries):
                target = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + i)).range()
                if query.legend:
                    target = target.legend_format(query.legend)
                panel = panel.with_target(target)
            board = board.with_panel(panel)
    model = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    assert isinstance(model, dict)
    return model


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
