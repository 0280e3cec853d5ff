"""The node agent's Prometheus exporter: per-rank progress, tokens, checkpoints, probes, heartbeats.

It has its own CollectorRegistry (no process-global state, so several agents or tests can live in
one process) and serves /metrics over HTTP. Every metric is documented in docs/metrics.md; a test
scrapes the endpoint and checks each documented name is there, and `promtool check metrics` lints it.

The job's name is the label `training_job`, never `job`: Prometheus reserves `job` for the scrape
target, so a scraped `job` label would be renamed `exported_job` and queries by it would find nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from stalwart.health.gpu_health import PROBE as GPU_PROBE
from stalwart.health.node_vector import NodeMetricVector
from stalwart.health.records import ProbeResult, ProbeStatus, Severity
from stalwart.signatures.scanner import SignatureMatch
from stalwart.store.records import ProgressReport, WorkerState, WorkerStatus

JOB_LABEL = "training_job"
WORKER_LABELS = (JOB_LABEL, "node", "rank")
NODE_LABELS = (JOB_LABEL, "node")
PROBE_LABELS = (JOB_LABEL, "node", "probe")
TIER_LABELS = (JOB_LABEL, "node", "tier")

# Checkpoint timings span milliseconds (a staged copy) to minutes (a large upload).
STALL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
SAVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class MetricsExporter:
    def __init__(self, job: str, node: str) -> None:
        self.job = job
        self.node = node
        self.registry = CollectorRegistry(auto_describe=True)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}
        self._ranks: set[int] = set()
        self._last_checkpoint: int | None = None
        r = self.registry

        self.worker_step = Gauge(
            "stalwart_worker_step", "Last training step the rank reported.", WORKER_LABELS, registry=r
        )
        self.worker_step_time = Gauge(
            "stalwart_worker_step_time_seconds", "Duration of the rank's last step.", WORKER_LABELS, registry=r
        )
        self.worker_tokens = Counter(
            "stalwart_worker_tokens",
            "Tokens the rank trained on, as it reported them step by step (rate() is its throughput).",
            WORKER_LABELS,
            registry=r,
        )
        self.worker_loss = Gauge("stalwart_worker_loss", "Last loss the rank reported.", WORKER_LABELS, registry=r)
        self.worker_progress = Gauge(
            "stalwart_worker_last_progress_timestamp_seconds",
            "Unix time of the rank's last progress report.",
            WORKER_LABELS,
            registry=r,
        )
        self.worker_running = Gauge(
            "stalwart_worker_running", "1 while the rank's process runs, 0 once it exited.", WORKER_LABELS, registry=r
        )
        self.worker_exit_code = Gauge(
            "stalwart_worker_exit_code", "Exit code of the rank's exited process.", WORKER_LABELS, registry=r
        )
        self.worker_restarts = Counter(
            "stalwart_worker_restarts", "Times the rank's process was replaced.", WORKER_LABELS, registry=r
        )

        self.checkpoint_saves = Counter(
            "stalwart_checkpoint_saves",
            "Checkpoint saves the node's ranks finished, by outcome (committed or failed).",
            (*NODE_LABELS, "outcome"),
            registry=r,
        )
        self.checkpoint_stall = Histogram(
            "stalwart_checkpoint_save_stall_seconds",
            "Time training waited for each rank's checkpoint save (the blocking part).",
            NODE_LABELS,
            buckets=STALL_BUCKETS,
            registry=r,
        )
        self.checkpoint_save = Histogram(
            "stalwart_checkpoint_save_duration_seconds",
            "Each rank's checkpoint save, from the call to the commit.",
            NODE_LABELS,
            buckets=SAVE_BUCKETS,
            registry=r,
        )
        self.checkpoint_saved_bytes = Counter(
            "stalwart_checkpoint_saved_bytes",
            "Bytes the node's ranks wrote into committed checkpoints, by storage tier.",
            TIER_LABELS,
            registry=r,
        )
        self.checkpoint_load = Histogram(
            "stalwart_checkpoint_load_duration_seconds",
            "Each rank's checkpoint load, by the tier it was read from.",
            TIER_LABELS,
            buckets=SAVE_BUCKETS,
            registry=r,
        )
        self.checkpoint_last_step = Gauge(
            "stalwart_checkpoint_last_committed_step",
            "Newest checkpoint step the node's ranks committed (or loaded).",
            NODE_LABELS,
            registry=r,
        )
        self.checkpoint_last_time = Gauge(
            "stalwart_checkpoint_last_committed_timestamp_seconds",
            "Unix time the node's ranks last reported a committed checkpoint.",
            NODE_LABELS,
            registry=r,
        )
        self.loader_ready = Gauge(
            "stalwart_dataloader_ready_batches",
            "Batches the node's shadow data loader holds ready for the trainer of each lane (0: it waits on data).",
            (*NODE_LABELS, "lane"),
            registry=r,
        )

        self.probe_status = Gauge(
            "stalwart_probe_status",
            "1 for the probe's current status, 0 for the others.",
            (*PROBE_LABELS, "status"),
            registry=r,
        )
        self.probe_machine_fault = Gauge(
            "stalwart_probe_machine_fault",
            "1 when the probe's last result reports a machine fault.",
            PROBE_LABELS,
            registry=r,
        )
        self.probe_findings = Gauge(
            "stalwart_probe_findings",
            "Findings in the probe's last result, by severity.",
            (*PROBE_LABELS, "severity"),
            registry=r,
        )
        self.probe_last_run = Gauge(
            "stalwart_probe_last_run_timestamp_seconds", "Unix time of the probe's last run.", PROBE_LABELS, registry=r
        )

        self.generation = Gauge(
            "stalwart_agent_generation", "Generation the agent's workers belong to.", NODE_LABELS, registry=r
        )
        self.last_heartbeat = Gauge(
            "stalwart_agent_last_heartbeat_timestamp_seconds",
            "Unix time of the agent's last heartbeat.",
            NODE_LABELS,
            registry=r,
        )
        self.heartbeats = Counter("stalwart_agent_heartbeats", "Heartbeats the agent sent.", NODE_LABELS, registry=r)

        self.signature_matches = Counter(
            "stalwart_log_signature_matches",
            "Worker log lines that matched a failure signature.",
            (*WORKER_LABELS, "failure_class", "scope"),
            registry=r,
        )

        self.node_gpu_utilization = Gauge(
            "stalwart_node_gpu_utilization_ratio", "Mean GPU utilization (0-1).", NODE_LABELS, registry=r
        )
        self.node_gpu_temperature = Gauge(
            "stalwart_node_gpu_temperature_celsius", "Hottest GPU's temperature.", NODE_LABELS, registry=r
        )
        self.node_cpu_utilization = Gauge(
            "stalwart_node_cpu_utilization_ratio", "Host CPU utilization (0-1).", NODE_LABELS, registry=r
        )
        self.node_memory_utilization = Gauge(
            "stalwart_node_memory_utilization_ratio", "Host memory in use (0-1).", NODE_LABELS, registry=r
        )
        self.node_network_errors = Counter(
            "stalwart_node_network_errors",
            "NIC and InfiniBand error counter increments seen by the probe.",
            NODE_LABELS,
            registry=r,
        )
        for counter in (self.heartbeats, self.node_network_errors):
            counter.labels(job, node)  # present at 0 from the start: rate() and increase() need a first sample

    # -- serving ----------------------------------------------------------------------------
    def start(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Serve /metrics on host:port (0: any free port); returns the port."""
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    @property
    def port(self) -> int | None:
        return int(self._server.server_port) if self._server is not None else None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None

    def render(self) -> bytes:
        """The exposition text, as /metrics would serve it."""
        return generate_latest(self.registry)

    # -- updates ----------------------------------------------------------------------------
    def update_workers(self, statuses: Sequence[WorkerStatus]) -> None:
        """The node's workers as the agent last saw them. Ranks no longer listed lose their series;
        a rank whose pid changed was restarted."""
        with self._lock:
            present = {s.rank for s in statuses}
            for rank in self._ranks - present:
                self._forget(str(rank), keep_running=False)
            self._ranks = present
            for s in statuses:
                labels = (self.job, self.node, str(s.rank))
                previous = self._pids.get(s.rank)
                if previous is not None and previous != s.pid:
                    self.worker_restarts.labels(*labels).inc()
                    self._forget(str(s.rank), keep_running=True)  # the new process has reported nothing yet
                else:
                    self.worker_restarts.labels(*labels)  # create the series at 0
                self.worker_tokens.labels(*labels)
                self._pids[s.rank] = s.pid
                self.worker_running.labels(*labels).set(1 if s.state is WorkerState.RUNNING else 0)
                if s.exit_code is not None:
                    self.worker_exit_code.labels(*labels).set(s.exit_code)
                for gauge, value in (
                    (self.worker_step, s.step),
                    (self.worker_step_time, s.step_time),
                    (self.worker_loss, s.loss),
                    (self.worker_progress, s.last_progress_at),
                ):
                    if value is not None:
                        gauge.labels(*labels).set(value)

    def _forget(self, rank: str, keep_running: bool) -> None:
        gauges = [
            self.worker_step,
            self.worker_step_time,
            self.worker_loss,
            self.worker_progress,
            self.worker_exit_code,
        ]
        if not keep_running:
            gauges.append(self.worker_running)
        for g in gauges:
            try:
                g.remove(self.job, self.node, rank)
            except KeyError:
                pass

    def record_report(self, report: ProgressReport) -> None:
        """One report of the worker SDK, as it arrives: tokens count every step (a heartbeat only
        carries the last one), and checkpoint saves and loads carry the engine's timings."""
        if report.kind == "step":
            if report.tokens:
                self.worker_tokens.labels(self.job, self.node, str(report.rank)).inc(report.tokens)
            return
        timing = report.checkpoint
        node = (self.job, self.node)
        if timing is None:  # a bare "committed" report (an SDK call without the engine's result)
            self._committed(report.step, report.sent_at)
            return
        if timing.operation == "load":
            tier = timing.tiers[0] if timing.tiers else "unknown"
            if timing.seconds is not None:
                self.checkpoint_load.labels(*node, tier).observe(timing.seconds)
            self._committed(report.step, report.sent_at)
            return
        self.checkpoint_saves.labels(*node, "committed" if timing.committed else "failed").inc()
        if timing.stall_seconds is not None:
            self.checkpoint_stall.labels(*node).observe(timing.stall_seconds)
        if not timing.committed:
            return
        if timing.seconds is not None:
            self.checkpoint_save.labels(*node).observe(timing.seconds)
        if timing.bytes_written and timing.tiers:
            share = timing.bytes_written / len(timing.tiers)  # every tier receives the same file
            for tier in timing.tiers:
                self.checkpoint_saved_bytes.labels(*node, tier).inc(share)
        self._committed(report.step, report.sent_at)

    def _committed(self, step: int, at: float) -> None:
        labels = (self.job, self.node)
        if self._last_checkpoint is None or step >= self._last_checkpoint:
            self._last_checkpoint = step
            self.checkpoint_last_step.labels(*labels).set(step)
        self.checkpoint_last_time.labels(*labels).set(at or time.time())

    def record_loader_lanes(self, ready: Sequence[int]) -> None:
        """Batches the shadow loader holds ready, per lane (the agent reads them off the segment)."""
        for lane, count in enumerate(ready):
            self.loader_ready.labels(self.job, self.node, str(lane)).set(count)

    def record_probe(self, result: ProbeResult) -> None:
        labels = (self.job, self.node, result.probe)
        for status in ProbeStatus:
            self.probe_status.labels(*labels, status.value).set(1 if status is result.status else 0)
        self.probe_machine_fault.labels(*labels).set(1 if result.machine_fault else 0)
        for severity in Severity:
            self.probe_findings.labels(*labels, severity.value).set(
                sum(f.severity is severity for f in result.findings)
            )
        self.probe_last_run.labels(*labels).set(result.checked_at)
        if result.probe == GPU_PROBE:  # the GPU probe's summary feeds the node's GPU gauges (dashboard panels)
            utilization, temperature = (
                result.readings.get("mean_utilization_pct"),
                result.readings.get("max_temperature_c"),
            )
            if isinstance(utilization, int | float):
                self.node_gpu_utilization.labels(self.job, self.node).set(utilization / 100.0)
            if isinstance(temperature, int | float):
                self.node_gpu_temperature.labels(self.job, self.node).set(temperature)

    def record_heartbeat(self, generation: int, sent_at: float | None = None) -> None:
        labels = (self.job, self.node)
        self.generation.labels(*labels).set(generation)
        self.last_heartbeat.labels(*labels).set(time.time() if sent_at is None else sent_at)
        self.heartbeats.labels(*labels).inc()

    def record_signature_match(self, match: SignatureMatch) -> None:
        rank = "" if match.rank is None else str(match.rank)
        self.signature_matches.labels(self.job, self.node, rank, match.failure_class, match.scope.value).inc()

    def record_node_vector(self, vector: NodeMetricVector) -> None:
        """The node's utilization, from the vector each heartbeat carries."""
        labels = (self.job, self.node)
        if vector.gpu_utilization_pct is not None:
            self.node_gpu_utilization.labels(*labels).set(vector.gpu_utilization_pct / 100.0)
        if vector.gpu_temperature_c is not None:
            self.node_gpu_temperature.labels(*labels).set(vector.gpu_temperature_c)
        if vector.cpu_percent is not None:
            self.node_cpu_utilization.labels(*labels).set(vector.cpu_percent / 100.0)
        if vector.memory_percent is not None:
            self.node_memory_utilization.labels(*labels).set(vector.memory_percent / 100.0)

    def record_network_errors(self, increments: int) -> None:
        """Error counter growth between two probe readings (counted once per reading, not per beat)."""
        self.node_network_errors.labels(self.job, self.node).inc(max(0, increments))
