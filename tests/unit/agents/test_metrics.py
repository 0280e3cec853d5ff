"""The Prometheus exporter, scraped over HTTP on loopback; its metrics match docs/metrics.md."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.paths import REPO

from stalwart.agents.metrics import MetricsExporter
from stalwart.health.node_vector import NodeMetricVector
from stalwart.health.records import Finding, ProbeResult, ProbeStatus, Severity
from stalwart.signatures import LogScanner
from stalwart.store.records import WorkerState, WorkerStatus

DOC = REPO / "docs" / "metrics.md"
ROW = re.compile(r"^\|\s*`(stalwart_[a-z0-9_]+)`\s*\|\s*(gauge|counter)\s*\|\s*([^|]*)\|")


def documented() -> dict[str, tuple[str, set[str]]]:
    out = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            out[m.group(1)] = (m.group(2), set(re.findall(r"`([a-z_]+)`", m.group(3))))
    return out


def scrape(port: int) -> dict[str, tuple[str, list[dict[str, str]]]]:
    """Sample name -> (family type, label sets), from a real HTTP scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[str, tuple[str, list[dict[str, str]]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out.setdefault(s.name, (family.type, []))[1].append(dict(s.labels))
    return out


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
            node="node-0",
            gpu_utilization_pct=50.0,
            gpu_temperature_c=61.0,
            cpu_percent=25.0,
            memory_percent=40.0,
            nic_error_delta=3,
        )
    )


def test_every_documented_metric_is_served_with_its_type_and_labels(exporter: MetricsExporter) -> None:
    feed(exporter)
    assert exporter.port is not None
    served = scrape(exporter.port)
    doc = documented()
    assert len(doc) >= 20
    for name, (kind, labels) in doc.items():
        assert name in served, f"{name} is documented but not served"
        served_kind, label_sets = served[name]
        assert served_kind == kind, name
        assert any(set(ls) == labels for ls in label_sets), (name, labels, label_sets)
    extra = {n for n in served if n.startswith("stalwart_")} - set(doc)
    assert not extra, f"served but not documented in docs/metrics.md: {sorted(extra)}"


def test_values_follow_the_updates(exporter: MetricsExporter) -> None:
    feed(exporter)
    assert exporter.port is not None
    served = scrape(exporter.port)
    text = exporter.render().decode()
    assert 'stalwart_worker_step{job="pretrain",node="node-0",rank="0"} 13.0' in text
    assert 'stalwart_worker_restarts_total{job="pretrain",node="node-0",rank="1"} 1.0' in text
    assert 'stalwart_worker_restarts_total{job="pretrain",node="node-0",rank="0"} 0.0' in text
    assert 'stalwart_worker_exit_code{job="pretrain",node="node-0",rank="1"}' not in text  # the new process runs
    assert 'stalwart_probe_status{job="pretrain",node="node-0",probe="gpu",status="not_available"} 1.0' in text
    assert 'stalwart_probe_status{job="pretrain",node="node-0",probe="gpu",status="ok"} 0.0' in text
    assert 'stalwart_probe_machine_fault{job="pretrain",node="node-0",probe="network"} 1.0' in text
    assert served["stalwart_log_signature_matches_total"][1] == [
        {"job": "pretrain", "node": "node-0", "rank": "0", "failure_class": "ecc_error", "scope": "node"}
    ]
    assert 'stalwart_worker_exit_code{job="pretrain",node="node-0",rank="2"} 1.0' in text
    assert 'stalwart_node_gpu_utilization_ratio{job="pretrain",node="node-0"} 0.5' in text
    assert 'stalwart_node_network_errors_total{job="pretrain",node="node-0"} 3.0' in text
    exporter.update_workers([status(0, 100)])  # ranks 1 and 2 are gone from this node
    after = exporter.render().decode()
    assert 'stalwart_worker_running{job="pretrain",node="node-0",rank="2"}' not in after
    assert 'stalwart_worker_exit_code{job="pretrain",node="node-0",rank="2"}' not in after


def test_stop_frees_the_port() -> None:
    m = MetricsExporter(job="j", node="n")
    port = m.start()
    m.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
