"""`promtool check metrics` on every exporter's output: no name breaks Prometheus's naming rules.
(The console's is checked with its pages, in tests/unit/console.)"""

from __future__ import annotations

import time

from fastapi.testclient import TestClient
from support.metrics_doc import promtool_check as lint

from stalwart.agents.metrics import MetricsExporter
from stalwart.diagnosis.service import create_app
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import CheckpointTiming, JobPhase, JobState, ProgressReport, WorkerState, WorkerStatus
from stalwart.telemetry.job_exporter import JobExporter


def test_the_agents_metrics_pass_promtool() -> None:
    m = MetricsExporter("lint-job", "node-0")
    now = time.time()
    m.update_workers([WorkerStatus(local_rank=0, rank=0, pid=1, state=WorkerState.RUNNING, started_at=now, step=3)])
    m.record_report(ProgressReport(rank=0, local_rank=0, step=3, tokens=10))
    m.record_report(
        ProgressReport(
            kind="checkpoint",
            rank=0,
            local_rank=0,
            step=3,
            checkpoint=CheckpointTiming(seconds=1, stall_seconds=0.1, bytes_written=10, tiers=["memory"]),
        )
    )
    m.record_heartbeat(1)
    lint(m.render())


def test_the_job_exporters_metrics_pass_promtool(store: Store) -> None:
    now = time.time()
    store.put(
        keys.job_state("lint-job"), JobState(job="lint-job", phase=JobPhase.RUNNING, created_at=now, updated_at=now)
    )
    try:
        lint(JobExporter(store, ["lint-job"]).render())
    finally:
        store.delete_prefix(keys.job_prefix("lint-job"))


def test_the_diagnosis_services_metrics_pass_promtool() -> None:
    client = TestClient(create_app(None, token="a-token-for-the-lint-only"))
    assert client.get("/healthz").status_code == 200
    assert client.post("/v1/diagnose", content=b"{}").status_code == 401  # a refusal, counted
    lint(client.get("/metrics").content)
