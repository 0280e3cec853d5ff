"""The operator's entry point: `python -m stalwart_operator` (the Deployment's command).

Waits for leadership (etcd), then runs kopf with the handlers until it is told to stop or loses
leadership; in both cases the hosted controllers stop at a tick boundary and the pods stay, so a
new leader carries every job on from etcd. Exits 1 on lost leadership (Kubernetes restarts it as
a standby), 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kopf

from stalwart.logs import configure, get_logger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import ServiceEndpoint
from stalwart.telemetry.job_exporter import JobExporter
from stalwart_operator.config import OperatorConfig
from stalwart_operator.election import OperatorLeadership
from stalwart_operator.handlers import build_registry
from stalwart_operator.kube import api_client
from stalwart_operator.runtime import Runtime

log = get_logger("stalwart.operator")


def serve_probes(port: int, host: str, leading: threading.Event) -> ThreadingHTTPServer | None:
    """/healthz answers while the process lives (leader or standby); /readyz only on the leader."""
    if not port:
        return None

    class Probes(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/healthz" or (self.path == "/readyz" and leading.is_set())
            body = b"ok\n" if ok else b"not leading\n"
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Probes)
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    return server


async def _run_kopf(
    config: OperatorConfig,
    runtime: Runtime,
    leadership: OperatorLeadership,
    lost: threading.Event,
) -> None:
    """kopf until SIGTERM (kopf's own handler) or lost leadership. The stop flag is an asyncio
    event: kopf would wait for a threading one in an executor thread that outlives the loop."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_lost() -> None:
        lost.set()
        loop.call_soon_threadsafe(stop.set)

    leadership.on_lost = on_lost
    await kopf.operator(
        registry=build_registry(config),
        standalone=True,  # no kopf peering: the etcd election decides who runs
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        stop_flag=stop,
        memo=kopf.Memo(runtime=runtime),
    )


def main() -> int:
    configure("INFO")
    # kopf logs every handler run at INFO; its warnings and errors are what an operator wants.
    logging.getLogger("kopf").setLevel(os.environ.get("STALWART_KOPF_LOG_LEVEL", "WARNING"))
    config = OperatorConfig.from_env()
    stop = threading.Event()
    leading = threading.Event()
    lost = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("stopping on signal", fields={"signal": signum})
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):  # until kopf installs its own
        signal.signal(signum, on_signal)
    probes = serve_probes(config.probe_port, config.probe_host, leading)
    store = Store(config.etcd)
    # Every replica answers /metrics (so a scrape of the standby succeeds); only the leader exports jobs.
    job_metrics = JobExporter(store, leading=leading.is_set) if config.job_metrics_port else None
    if job_metrics is not None:
        job_metrics.start(config.job_metrics_port, config.job_metrics_host)
    leadership = OperatorLeadership(store, config.operator_name, config.identity, config.election_ttl_seconds)
    runtime: Runtime | None = None
    try:
        if not leadership.acquire_until(stop):
            return 0
        leading.set()
        if stop.is_set():
            return 0
        if config.diagnosis_url:
            store.put(
                keys.service("diagnosis"),
                ServiceEndpoint(name="diagnosis", url=config.diagnosis_url.rstrip("/"), registered_at=time.time()),
            )
        runtime = Runtime(config, store, api_client())
        asyncio.run(_run_kopf(config, runtime, leadership, lost))
        return 1 if lost.is_set() else 0
    finally:
        leading.clear()
        if runtime is not None:
            runtime.close()
        leadership.release()
        if job_metrics is not None:
            job_metrics.stop()
        store.close()
        if probes is not None:
            probes.shutdown()


if __name__ == "__main__":
    sys.exit(main())
