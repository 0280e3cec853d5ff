"""The agent's Prometheus exporter, scraped over HTTP on loopback; its metrics match docs/metrics.md."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest
from support.metrics_doc import documented, sample, scrape_families

from stalwart.agents.metrics import MetricsExporter
from stalwart.health.node_vector import NodeMetricVector
from stalwart.health.records import Finding, ProbeResult, ProbeStatus, Severity
from stalwart.signatures import LogScanner
from stalwart.store.records import CheckpointTiming, ProgressReport, WorkerState, WorkerStatus


def status(rank: int, pid: int, **kw: object) -> WorkerStatus:
    return WorkerStatus(local_rank=rank, rank=rank, pid=pid, state=WorkerState.RUNNING, started_at=time.time(), **kw)  # type: ignore[arg-type]


@pytest.fixture
def exporter() -> Iterator[MetricsExporter]:
    m = MetricsExporter(job="pretrain", node="node-0")
    m.start(port=0, host="127.0.0.1")
    yield m
    m.stop()


def feed(m: MetricsExporter) -> None:
    now = time.time()
    m.update_workers(
        [
            status(0, 100, step=12, loss=2.5, step_time=0.4, tokens_per_second=5000.0, last_progress_at=now),
            WorkerStatus(local_rank=1, rank=1, pid=101, state=WorkerState.EXITED, exit_code=-9, started_at=now),
        ]
    )
    m.update_workers(
        [
            status(0, 100, step=13, loss=2.4, step_time=0.4, tokens_per_second=5000.0, last_progress_at=now),
            status(1, 202),  # rank 1 restarted
            WorkerStatus(local_rank=2, rank=2, pid=102, state=WorkerState.EXITED, exit_code=1, started_at=now),
        ]
    )
    m.record_probe(ProbeResult(probe="gpu", status=ProbeStatus.NOT_AVAILABLE, reason="no NVML"))
    m.record_probe(
        ProbeResult.from_findings(
            "network",
            [
                Finding(
                    code="ib_port_down",
                    severity=Severity.CRITICAL,
                    message="down",
                    machine_fault=True,
                    failure_class="ib_port_down",
                )
            ],
        )
    )
    m.record_heartbeat(generation=3, sent_at=now)
    [match] = LogScanner(rank=0).feed("RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    m.record_signature_match(match)
    m.record_node_vector(
        NodeMetricVector(
            node="node-0", gpu_utilization_pct=50.0, gpu_temperature_c=61.0, cpu_percent=25.0, memory_percent=40.0
        )
    )
    m.record_network_errors(3)
    m.record_loader_lanes([2, 0])
    for tokens in (512, 512):
        m.record_report(ProgressReport(rank=0, local_rank=0, step=13, tokens=tokens, step_time=0.4))
    m.record_report(
        ProgressReport(
            kind="checkpoint",
            rank=0,
            local_rank=0,
            step=10,
            sent_at=now,
            checkpoint=CheckpointTiming(
                stall_seconds=0.02, seconds=1.5, bytes_written=2000, tiers=["memory", "filesystem"]
            ),
        )
    )
    m.record_report(
        ProgressReport(
            kind="checkpoint",
            rank=1,
            local_rank=1,
            step=20,
            checkpoint=CheckpointTiming(committed=False, stall_seconds=0.01),
        )
    )
    m.record_report(
        ProgressReport(
            kind="checkpoint",
            rank=1,
            local_rank=1,
            step=10,
            checkpoint=CheckpointTiming(operation="load", seconds=0.3, tiers=["memory"]),
        )
    )


def test_every_documented_metric_is_served_with_its_type_and_labels(exporter: MetricsExporter) -> None:
    feed(exporter)
    assert exporter.port is not None
    served = scrape_families(f"http://127.0.0.1:{exporter.port}/metrics")
    doc = documented("Node agent")
    assert len(doc) >= 28
    for name, (kind, labels) in doc.items():
        assert name in served, f"{name} is documented but not served"
        served_kind, label_sets = served[name]
        assert served_kind == kind, name
        assert any(set(ls) == labels for ls in label_sets), (name, labels, label_sets)
    extra = {n for n in served if n.startswith("stalwart_")} - set(doc)
    assert not extra, f"served but not documented in docs/metrics.md: {sorted(extra)}"


def test_values_follow_the_updates(exporter: MetricsExporter) -> None:
    feed(exporter)
    text = exporter.render().decode()
    at = {"training_job": "pretrain", "node": "node-0"}

    def value(name: str, **labels: str) -> float | None:
        return sample(text, name, **at, **labels)

    assert value("stalwart_worker_step", rank="0") == 13
    assert value("stalwart_worker_restarts_total", rank="1") == 1
    assert value("stalwart_worker_restarts_total", rank="0") == 0
    assert value("stalwart_worker_exit_code", rank="1") is None  # the new process runs
    assert value("stalwart_probe_status", probe="gpu", status="not_available") == 1
    assert value("stalwart_probe_status", probe="gpu", status="ok") == 0
    assert value("stalwart_probe_machine_fault", probe="network") == 1
    assert value("stalwart_log_signature_matches_total", rank="0", failure_class="ecc_error", scope="node") == 1
    assert value("stalwart_worker_exit_code", rank="2") == 1
    assert value("stalwart_node_gpu_utilization_ratio") == 0.5
    assert value("stalwart_node_network_errors_total") == 3
    # Tokens are a counter over every step's report; checkpoints carry the engine's numbers.
    assert value("stalwart_worker_tokens_total", rank="0") == 1024
    assert value("stalwart_checkpoint_saves_total", outcome="committed") == 1
    assert value("stalwart_checkpoint_saves_total", outcome="failed") == 1
    assert value("stalwart_checkpoint_save_stall_seconds_count") == 2
    assert value("stalwart_checkpoint_save_duration_seconds_count") == 1  # only the committed one
    assert value("stalwart_checkpoint_saved_bytes_total", tier="memory") == 1000
    assert value("stalwart_checkpoint_load_duration_seconds_count", tier="memory") == 1
    assert value("stalwart_checkpoint_last_committed_step") == 10  # the failed step 20 is not
    assert value("stalwart_dataloader_ready_batches", lane="1") == 0
    exporter.update_workers([status(0, 100)])  # ranks 1 and 2 are gone from this node
    after = exporter.render().decode()
    assert sample(after, "stalwart_worker_running", **at, rank="2") is None
    assert sample(after, "stalwart_worker_exit_code", **at, rank="2") is None


def test_stop_frees_the_port() -> None:
    m = MetricsExporter(job="j", node="n")
    port = m.start()
    m.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_gpu_probes_readings_feed_the_node_gpu_gauges() -> None:
    """The GPU probe's summary (from recorded nvidia-smi output) sets the node's GPU utilization and
    hottest temperature, which the dashboard's GPU panels plot."""
    from support.paths import REPO

    from stalwart.health.gpu_health import evaluate_gpus
    from stalwart.health.nvidia_smi import parse_nvidia_smi_q

    text = (REPO / "tests" / "data" / "health" / "nvidia-smi" / "a100-sxm4-80gb-healthy.txt").read_text()
    report = parse_nvidia_smi_q(text)
    result = evaluate_gpus(report.gpus, source="nvidia-smi")
    m = MetricsExporter(job="pretrain", node="node-0")
    m.record_probe(result)
    rendered = m.render().decode()
    at = {"training_job": "pretrain", "node": "node-0"}
    [gpu] = report.gpus
    assert gpu.temperature_c is not None and gpu.utilization_gpu_pct is not None
    assert sample(rendered, "stalwart_node_gpu_temperature_celsius", **at) == gpu.temperature_c
    assert sample(rendered, "stalwart_node_gpu_utilization_ratio", **at) == gpu.utilization_gpu_pct / 100
    m.record_probe(ProbeResult(probe="gpu", status=ProbeStatus.NOT_AVAILABLE, reason="no NVML"))
    assert sample(m.render().decode(), "stalwart_node_gpu_temperature_celsius", **at) == gpu.temperature_c  # kept
