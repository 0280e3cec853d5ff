"""The agent's real-time checks: probes run on their own thread, every few seconds.

Their findings feed /metrics and, when they name a machine fault (Xid 79, uncorrectable ECC, a
required NIC or IB port down, a full disk), the heartbeat, so the controller can evict at once.
"""

from __future__ import annotations

import os
import threading

from stalwart.agents.metrics import MetricsExporter
from stalwart.health.host import HostReadings, read_host
from stalwart.health.network import NetReadings, error_deltas, read_net_sysfs
from stalwart.health.probes import default_probes, run_probes
from stalwart.health.records import ProbeResult

INTERVAL_ENV = "STALWART_PROBE_INTERVAL"


class ProbeLoop:
    def __init__(self, metrics: MetricsExporter, interval: float | None = None) -> None:
        self.metrics = metrics
        self.interval = interval if interval is not None else float(os.environ.get(INTERVAL_ENV, "15"))
        self.probes = default_probes()
        self.results: list[ProbeResult] = []
        self.host: HostReadings | None = None
        self.net_now: NetReadings | None = None
        self.net_previous: NetReadings | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probes", daemon=True)

    def start(self) -> ProbeLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            results = run_probes(self.probes)  # a probe that crashes reports "not available"
            for result in results:
                self.metrics.record_probe(result)
            try:
                host, net = read_host(), read_net_sysfs()
            except OSError:
                host, net = None, None
            self.results, self.host = results, host
            self.net_previous, self.net_now = self.net_now, net
            if net is not None and self.net_previous is not None:
                self.metrics.record_network_errors(sum(error_deltas(net, self.net_previous).values()))
            self._stop.wait(self.interval)

    def machine_faults(self) -> list[str]:
        """High-confidence machine faults from the last round, one line each."""
        return [f"{r.probe}: {f.message}" for r in self.results for f in r.findings if f.machine_fault][:20]

    def stop(self) -> None:
        """Safe before start: an agent that exits while registering stops what it never started."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
