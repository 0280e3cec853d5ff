"""The agent's real-time checks: probes run on their own thread, every few seconds.

The probes are told what the job's spec expects of the node (GPUs, required NICs, watched disks;
stalwart.health.node_expectations) and read the kernel log only in the spec's window. Their findings
feed /metrics and, when they name a machine fault (Xid 79, uncorrectable ECC, a GPU missing, a
required NIC or IB port down, a full disk), the heartbeat, so the controller can evict at once;
`check_now` runs them once more for the node's share of a pre-flight.
"""

from __future__ import annotations

import os
import threading
import time

from stalwart.agents.metrics import MetricsExporter
from stalwart.health.host import HostReadings, read_host
from stalwart.health.network import NetReadings, error_deltas, read_net_sysfs
from stalwart.health.node_expectations import NodeExpectations
from stalwart.health.probes import Probe, node_probes, run_probes
from stalwart.health.recorded import recorded_outputs
from stalwart.health.records import ProbeResult

INTERVAL_ENV = "STALWART_PROBE_INTERVAL"


class ProbeLoop:
    def __init__(
        self,
        metrics: MetricsExporter,
        expected: NodeExpectations | None = None,
        interval: float | None = None,
        started_at: float | None = None,
        sysfs_root: str = "/sys",
    ) -> None:
        self.metrics = metrics
        self.interval = interval if interval is not None else float(os.environ.get(INTERVAL_ENV, "15"))
        self.expected = expected or NodeExpectations()
        self.started_at = started_at if started_at is not None else time.time()
        self.sysfs_root = sysfs_root
        self.recorded = recorded_outputs(metrics.node)  # recorded outputs for this node's readers, if named
        self.probes = self._probes()
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

    def _probes(self) -> list[Probe]:
        return node_probes(self.expected, self.started_at, self.sysfs_root, self.recorded)

    def expect(self, expected: NodeExpectations) -> None:
        """Judge the node by `expected` from the next round on (its role's, once it has one)."""
        if expected != self.expected:
            self.expected = expected
            self.probes = self._probes()  # one assignment: the loop's thread reads the new list whole

    def machine_faults(self) -> list[str]:
        """High-confidence machine faults from the last round, one line each."""
        return machine_fault_lines(self.results)

    def check_now(self) -> list[str]:
        """One round of fresh probes, now (on the caller's thread): the machine faults of a node about
        to be checked, which must not wait for the loop's next round."""
        return machine_fault_lines(run_probes(self._probes()))

    def stop(self) -> None:
        """Safe before start: an agent that exits while registering stops what it never started."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)


def machine_fault_lines(results: list[ProbeResult]) -> list[str]:
    return [f"{r.probe}: {f.message}" for r in results for f in r.findings if f.machine_fault][:20]
