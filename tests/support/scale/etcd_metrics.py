"""etcd's own /metrics, scraped at the start and end of a window and turned into rates.

etcd serves Prometheus text on its client URL. What the harness reports from it: requests by gRPC
method (unary calls handled, stream messages received, streams started), MVCC puts/ranges/txns,
bytes in and out, raft proposals, WAL fsync and backend commit latencies, the database size (it
only grows without compaction), watchers, leases that expired, and etcd's own CPU and memory.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Sample = dict[str, float]  # "name{label=value}" -> value

KEEP = (
    "grpc_server_handled_total",
    "grpc_server_msg_received_total",
    "grpc_server_msg_sent_total",
    "grpc_server_started_total",
    "etcd_mvcc_put_total",
    "etcd_mvcc_range_total",
    "etcd_mvcc_txn_total",
    "etcd_mvcc_delete_total",
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_failed_total",
    "etcd_server_proposals_pending",
    "etcd_server_slow_apply_total",
    "etcd_server_slow_read_indexes_total",
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_debugging_mvcc_keys_total",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_slow_watcher_total",
    "etcd_debugging_server_lease_expired_total",
    "etcd_server_quota_backend_bytes",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
)


def scrape(endpoint: str, timeout: float = 10.0) -> Sample:
    """One scrape of http://ENDPOINT/metrics, the families in KEEP only."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=timeout) as reply:
        text = reply.read().decode()
    out: Sample = {}
    for family in text_string_to_metric_families(text):
        if not any(family.name == k or family.name + "_total" == k for k in KEEP):
            continue
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def _by(sample: Sample, name: str, label: str) -> dict[str, float]:
    """Sum of `name`'s series grouped by one label's value."""
    grouped: dict[str, float] = defaultdict(float)
    for key, value in sample.items():
        metric, _, labels = key.partition("{")
        if metric != name:
            continue
        found = dict(kv.split("=", 1) for kv in labels.rstrip("}").split(",") if "=" in kv)
        grouped[found.get(label, "")] += value
    return dict(grouped)


def _total(sample: Sample, name: str) -> float:
    return sum(v for k, v in sample.items() if k.partition("{")[0] == name)


def _histogram_quantile(before: Sample, after: Sample, name: str, q: float) -> float | None:
    """The q-quantile of a histogram's observations between two scrapes (upper bucket bound)."""
    buckets: dict[float, float] = defaultdict(float)
    for key, value in after.items():
        if key.partition("{")[0] != f"{name}_bucket":
            continue
        le = next(kv.split("=", 1)[1] for kv in key.partition("{")[2].rstrip("}").split(",") if kv.startswith("le="))
        buckets[float(le)] += value - before.get(key, 0.0)
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def window(before: Sample, after: Sample, seconds: float) -> dict[str, Any]:
    """Rates and levels over a window between two scrapes."""

    def rate(name: str) -> float:
        return (_total(after, name) - _total(before, name)) / seconds

    def rates_by(name: str, label: str) -> dict[str, float]:
        b, a = _by(before, name, label), _by(after, name, label)
        return {k: round((v - b.get(k, 0.0)) / seconds, 2) for k, v in sorted(a.items()) if v - b.get(k, 0.0) > 0}

    fsync_count = _total(after, "etcd_disk_wal_fsync_duration_seconds_count") - _total(
        before, "etcd_disk_wal_fsync_duration_seconds_count"
    )
    fsync_sum = _total(after, "etcd_disk_wal_fsync_duration_seconds_sum") - _total(
        before, "etcd_disk_wal_fsync_duration_seconds_sum"
    )
    return {
        "puts_per_second": rate("etcd_mvcc_put_total"),
        "ranges_per_second": rate("etcd_mvcc_range_total"),
        "txns_per_second": rate("etcd_mvcc_txn_total"),
        "unary_calls_per_second": rates_by("grpc_server_handled_total", "grpc_method"),
        "stream_messages_in_per_second": rates_by("grpc_server_msg_received_total", "grpc_method"),
        "streams_started_per_second": rates_by("grpc_server_started_total", "grpc_method"),
        "bytes_in_per_second": rate("etcd_network_client_grpc_received_bytes_total"),
        "bytes_out_per_second": rate("etcd_network_client_grpc_sent_bytes_total"),
        "proposals_per_second": rate("etcd_server_proposals_committed_total"),
        "proposals_failed": _total(after, "etcd_server_proposals_failed_total")
        - _total(before, "etcd_server_proposals_failed_total"),
        "proposals_pending": _total(after, "etcd_server_proposals_pending"),
        "slow_applies": _total(after, "etcd_server_slow_apply_total") - _total(before, "etcd_server_slow_apply_total"),
        "fsyncs_per_second": fsync_count / seconds,
        "fsync_mean_s": fsync_sum / fsync_count if fsync_count else None,
        "fsync_p99_s": _histogram_quantile(before, after, "etcd_disk_wal_fsync_duration_seconds", 0.99),
        "backend_commit_p99_s": _histogram_quantile(before, after, "etcd_disk_backend_commit_duration_seconds", 0.99),
        "db_size_bytes": _total(after, "etcd_mvcc_db_total_size_in_bytes"),
        "db_growth_bytes_per_second": rate("etcd_mvcc_db_total_size_in_bytes"),
        "db_quota_bytes": _total(after, "etcd_server_quota_backend_bytes"),
        "keys": _total(after, "etcd_debugging_mvcc_keys_total"),
        "watchers": _total(after, "etcd_debugging_mvcc_watcher_total"),
        "slow_watchers": _total(after, "etcd_debugging_mvcc_slow_watcher_total"),
        "leases_expired": _total(after, "etcd_debugging_server_lease_expired_total")
        - _total(before, "etcd_debugging_server_lease_expired_total"),
        "cpu_cores": rate("process_cpu_seconds_total"),
        "rss_bytes": _total(after, "process_resident_memory_bytes"),
    }
