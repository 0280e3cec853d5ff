"""The read commands through the Kubernetes API: what the operator writes into a TrainingJob's status
(build_status) reads back as the rows the etcd reader gives (stalwart_operator.cli_reads), and the CLI
renders them with no etcd at all."""

from __future__ import annotations

from typing import Any

from stalwart.store.records import FailureClass, Incident, JobPhase, JobState
from stalwart_operator import cli_reads
from stalwart_operator.status import PodView, TrainingJobStatus, build_status

T0 = 1_800_000_000.0


def incident(n: int, **changes: Any) -> Incident:
    base: dict[str, Any] = {
        "id": f"inc-{n:04d}-aaaaaa",
        "job": "ml.demo",
        "failure_class": FailureClass.LOST_NODE,
        "generation": n,
        "node": "node-1",
        "rank": 2,
        "suspects": ["node-1"],
        "action": "evict node-1 (standby node-2)",
        "failed_at": T0 + 10 * n,
        "detected_at": T0 + 10 * n + 2,
        "first_step_at": T0 + 10 * n + 7,
        "counted": False,
    }
    return Incident(**{**base, **changes})


def body(status: TrainingJobStatus, name: str = "demo") -> dict[str, Any]:
    """The TrainingJob as the API server returns it: the status as the operator patched it."""
    return {
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {},
        "status": status.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def written(incidents: list[Incident], **state: Any) -> TrainingJobStatus:
    base: dict[str, Any] = {
        "job": "ml.demo",
        "phase": JobPhase.RUNNING,
        "generation": 3,
        "slots": ["node-0", "node-1"],
        "standbys": ["node-2"],
        "created_at": T0,
        "updated_at": T0,
        "first_step_at": T0 + 5,
        "last_step": 400,
        "last_loss": 2.5,
        "last_tokens_per_second": 12345.67,
        "infra_restarts": 2,
    }
    return build_status(
        job_id="ml.demo",
        state=JobState(**{**base, **state}),
        incidents=incidents,
        slot_roles=["trainer", "trainer"],
        pods={"node-0": PodView(name="demo-node-0", phase="Running", machine="gpu-0")},  # node-1's pod: gone
        registered={"node-0"},
        previous=None,
        suspended=False,
        observed_generation=1,
        now=T0 + 500,
    )


def test_a_job_row_from_the_status_says_what_the_etcd_row_says() -> None:
    row = cli_reads.job_row(body(written([incident(1), incident(2)])), now=T0 + 600)
    assert (row.job, row.namespace, row.phase, row.generation, row.step) == ("demo", "ml", JobPhase.RUNNING, 3, 400)
    assert (row.restarts, row.infra_restarts, row.incidents) == (0, 2, 2)
    assert (row.nodes_up, row.nodes_total) == (1, 2) and row.tokens_per_second == 12345.7
    assert row.ettr is not None and 0 < row.ettr < 1


def test_the_newest_incidents_read_back_with_their_timings() -> None:
    incidents = [incident(n) for n in range(1, 15)]
    st = written(incidents)
    assert st.incident_count == 14 and [i.id for i in st.recent_incidents] == [i.id for i in incidents[-10:]]
    rows = cli_reads.job_status(body(st)).recent_incidents
    row = cli_reads.incident_row("demo", rows[-1])
    last = incidents[-1]
    assert (row.id, row.job, row.failure_class, row.generation, row.node, row.rank) == (
        last.id,
        "demo",
        "LostNode",
        14,
        "node-1",
        2,
    )
    assert row.failed_at == last.failed_at and row.detect_seconds == 2.0 and row.downtime_seconds == 7.0
    assert row.recovered and row.suspects == ["node-1"] and row.runbook


def test_a_status_report_lists_the_nodes_not_healthy_and_says_what_it_leaves_out() -> None:
    report = cli_reads.status_report(body(written([incident(1)])), now=T0 + 600)
    assert (report.job, report.phase, report.generation, report.step, report.loss) == (
        "demo",
        JobPhase.RUNNING,
        3,
        400,
        2.5,
    )
    assert [(n.node, n.state) for n in report.nodes] == [("node-1", "lost"), ("node-2", "lost")]
    assert report.standbys == ["node-2"] and report.ranks == [] and not report.detail
    assert report.partial is not None and "etcd" in report.partial
    assert [i.id for i in report.incidents] == ["inc-0001-aaaaaa"] and report.incident_count == 1


def test_a_job_the_operator_has_not_seen_yet_reads_as_pending() -> None:
    fresh = {"metadata": {"name": "new", "namespace": "ml"}, "spec": {}}
    row = cli_reads.job_row(fresh, now=T0)
    assert row.phase is JobPhase.PENDING and row.generation == 0 and row.incidents == 0


def test_the_chart_s_aggregated_view_role_grants_what_the_reads_need() -> None:
    """`kubectl stalwart jobs|status|incidents` get and list TrainingJobs (their status is part of
    them): whoever holds Kubernetes' `view` in a namespace may run them there, and nothing more."""
    from support.chart import render

    [view] = [
        d
        for d in render()
        if d.get("kind") == "ClusterRole"
        and (d["metadata"].get("labels") or {}).get("rbac.authorization.k8s.io/aggregate-to-view") == "true"
    ]
    granted = {
        (resource, verb)
        for rule in view["rules"]
        if "stalwart.dev" in rule.get("apiGroups", [])
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {("trainingjobs", "get"), ("trainingjobs", "list")} <= granted
    assert not {verb for _, verb in granted} - {"get", "list", "watch"}  # reading only
