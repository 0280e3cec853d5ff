"""The job-metrics exporter over a real etcd: values come from the job's records, match
docs/metrics.md, survive an exporter restart, and say when etcd is gone."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from support.metrics_doc import documented, families, sample, scrape_families

from stalwart.spec import parse_job
from stalwart.spec.model import FailureEvent
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import (
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    NodeRegistration,
    WorkerState,
    WorkerStatus,
)
from stalwart.telemetry.job_exporter import JobExporter

JOB = "metrics-job"
NOW = time.time()


def spec() -> dict[str, object]:
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 2,
                    "processesPerNode": 1,
                    "command": ["python", "t.py"],
                    "peakFlopsPerWorker": 1e12,
                },
                # A role with a standby pool of its own: the job wants both pools.
                {
                    "name": "evaluator",
                    "replicas": 1,
                    "processesPerNode": 1,
                    "command": ["python", "e.py"],
                    "standbys": 1,
                },
            ],
            "standbys": {"count": 2},
            "checkpoint": {"intervalSteps": 10},
        },
    }


def worker(rank: int, **kw: object) -> WorkerStatus:
    return WorkerStatus(local_rank=0, rank=rank, pid=100 + rank, state=WorkerState.RUNNING, started_at=NOW, **kw)  # type: ignore[arg-type]


@pytest.fixture
def job_in_etcd(store: Store) -> Iterator[Store]:
    store.delete_prefix(keys.job_prefix(JOB))
    parse_job(spec())  # the document is a valid job
    store.put(keys.job_spec(JOB), json.dumps(spec()))
    state = JobState(
        job=JOB,
        phase=JobPhase.RUNNING,
        generation=3,
        restarts=1,
        infra_restarts=2,
        slots=["node-0", "node-3"],
        standbys=["node-4"],
        evicted=["node-1"],
        created_at=NOW - 100,
        first_step_at=NOW - 90,
        last_step=40,
        updated_at=NOW,
    )
    store.put(keys.job_state(JOB), state)
    lost = Incident(
        id="inc-1",
        job=JOB,
        failure_class=FailureEvent.LOST_NODE,
        generation=2,
        node="node-1",
        evicted=["node-1"],
        replacements={"node-1": "node-3"},
        failed_at=NOW - 60,
        detected_at=NOW - 59.5,
        diagnosed_at=NOW - 59,
        first_step_at=NOW - 50,
    )
    crash = Incident(
        id="inc-2",
        job=JOB,
        failure_class=FailureEvent.WORKER_CRASH,
        generation=3,
        failed_at=NOW - 30,
        detected_at=NOW - 29.9,
    )
    for inc in (lost, crash):
        store.put(keys.incident(JOB, inc.id), inc)
    lease = store.lease(30)
    store.put(
        keys.node_registration(JOB, "node-0"),
        NodeRegistration(node="node-0", job=JOB, host="h", agent_pid=1, registered_at=NOW, lease_id=lease.id),
        lease=lease,
    )
    store.put(
        keys.node_heartbeat(JOB, "node-0"),
        Heartbeat(
            node="node-0",
            generation=3,
            sent_at=NOW,
            workers=[
                worker(
                    0,
                    step=42,
                    last_progress_at=NOW - 1,
                    first_step=31,
                    last_checkpoint_step=40,
                    step_time=0.5,
                    tokens_per_second=2048.0,
                    flops_per_second=4e11,
                )
            ],
        ),
    )
    yield store
    lease.revoke()
    store.delete_prefix(keys.job_prefix(JOB))


def test_job_metrics_come_from_the_records_and_match_the_docs(job_in_etcd: Store) -> None:
    exporter = JobExporter(job_in_etcd, [JOB])
    port = exporter.start()
    try:
        served = scrape_families(f"http://127.0.0.1:{port}/metrics")
        text = exporter.render().decode()
    finally:
        exporter.stop()
    doc = documented("Job-metrics exporter")
    for name, (kind, labels) in doc.items():
        assert name in served, f"{name} is documented but not served"
        assert served[name][0] == kind, name
        assert any(set(ls) == labels for ls in served[name][1]), (name, labels, served[name][1])
    extra = {n for n in served if n.startswith("stalwart_")} - set(doc)
    assert not extra, f"served but not documented in docs/metrics.md: {sorted(extra)}"

    def value(name: str, **labels: str) -> float | None:
        return sample(text, name, training_job=JOB, **labels)

    assert value("stalwart_job_phase", phase="Running") == 1 and value("stalwart_job_phase", phase="Failed") == 0
    assert value("stalwart_job_active") == 1 and value("stalwart_job_step") == 42
    assert value("stalwart_job_incidents_total", failure_class="LostNode") == 1
    assert value("stalwart_job_incidents_total", failure_class="WorkerCrash") == 1
    assert value("stalwart_job_recovery_duration_seconds_count", failure_class="LostNode") == 1
    assert value("stalwart_job_recovery_duration_seconds_sum", failure_class="LostNode") == pytest.approx(10, abs=0.01)
    assert value("stalwart_job_recovery_duration_seconds_count", failure_class="WorkerCrash") == 0  # not recovered yet
    assert value("stalwart_job_detection_duration_seconds_bucket", failure_class="LostNode", le="0.5") == 1
    assert value("stalwart_job_evictions_total", node="node-1") == 1 and value("stalwart_job_hot_swaps_total") == 1
    assert value("stalwart_job_restarts_total", cause="counted") == 1
    assert value("stalwart_job_restarts_total", cause="infrastructure") == 2
    assert value("stalwart_job_standbys") == 1 and value("stalwart_job_standbys_wanted") == 2 + 1
    assert value("stalwart_job_node_up", node="node-0") == 1 and value("stalwart_job_node_up", node="node-3") == 0
    assert value("stalwart_job_last_checkpoint_step") == 40 and value("stalwart_job_checkpoint_interval_steps") == 10
    assert value("stalwart_job_controller_up") == 0  # no controller holds the job's leader key
    assert value("stalwart_job_tokens_per_second") == 2048 and value("stalwart_job_mfu_ratio") == pytest.approx(0.4)
    ettr = value("stalwart_job_ettr_ratio")
    assert ettr is not None and 0 < ettr < 1  # the unrecovered crash keeps costing until now
    assert sample(text, "stalwart_etcd_up") == 1


def test_every_job_is_served_without_a_list_and_a_lost_etcd_says_so(job_in_etcd: Store) -> None:
    exporter = JobExporter(job_in_etcd)
    served = families(exporter.render().decode())
    assert {"training_job": JOB, "phase": "Running"} in served["stalwart_job_phase"][1]
    dead = Store("127.0.0.1:1", timeout=1)  # nothing listens there
    try:
        text = JobExporter(dead, [JOB]).render().decode()
    finally:
        dead.close()
    assert sample(text, "stalwart_etcd_up") == 0
    assert "stalwart_job_phase" not in families(text)


def test_a_standby_replica_serves_only_its_own_liveness(job_in_etcd: Store) -> None:
    text = JobExporter(job_in_etcd, [JOB], leading=lambda: False).render().decode()
    assert sample(text, "stalwart_job_exporter_leader") == 0
    assert not [
        n
        for n in families(text)
        if n.startswith("stalwart_job_")
        and n != "stalwart_job_exporter_leader"
        and not n.startswith("stalwart_job_exporter_")
    ]
    assert sample(text, "stalwart_etcd_up") is None  # a standby does not read etcd: it cannot say
