"""The job-metrics exporter's HTTP side: /metrics for the jobs in one etcd.

Hosted by `stalwart run` (its one job) and by the Kubernetes operator (every job; only the leading
replica exports them). It can also run alone, beside an etcd:

    python -m stalwart.telemetry.job_exporter --etcd 127.0.0.1:2379 --port 9401
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from stalwart.store.client import Store
from stalwart.telemetry.job_metrics import JobMetricsCollector

DEFAULT_PORT = 9401


class JobExporter:
    """One registry with the job collector; serve() on a port, stop() to free it."""

    def __init__(
        self, store: Store, jobs: Iterable[str] | None = None, leading: Callable[[], bool] | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = JobMetricsCollector(store, jobs, leading)
        self.registry.register(self.collector)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0, host: str = "127.0.0.1") -> int:
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return int(self._server.server_port)

    @property
    def port(self) -> int | None:
        return int(self._server.server_port) if self._server is not None else None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stalwart's job-metrics exporter (reads the jobs' records in etcd)")
    parser.add_argument("--etcd", required=True, help="HOST:PORT of etcd")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--job", action="append", help="export only this job (repeatable); default: every job")
    args = parser.parse_args(argv)
    store = Store(args.etcd)
    exporter = JobExporter(store, args.job)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    exporter.start(args.port, args.host)
    try:
        stop.wait()
    finally:
        exporter.stop()
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
