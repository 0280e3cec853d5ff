"""The node's share of the collective and compute checks, when the job's controller asks its agents
to run them (stalwart.health.distributed_check): on a cluster, only the agents are on the machines
under test.

Requests are etcd keys every agent of the job watches; the watch callback only enqueues, and `serve`
(on the agent's loop) starts each share on a thread of its own: a check takes seconds, heartbeats
must not wait for it. The check ranks inherit the agent's environment, so they see the machine as
the workers do.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from stalwart.health.collective_runner import RankStarter, start_cold
from stalwart.health.distributed_check import CheckRendezvous, CheckRequest, NodeCheckReport, run_share
from stalwart.logs import ContextLogger
from stalwart.net import free_port
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable

POLL_SECONDS = 0.1
SEEN_LIMIT = 256  # request ids remembered, so a replayed watch event starts nothing twice


class CheckDuty:
    def __init__(
        self,
        store: Store,
        job: str,
        node: str,
        address: str,
        workdir: Path,
        log: ContextLogger,
        start: RankStarter = start_cold,
        wake: Callable[[], None] = lambda: None,
        machine_check: Callable[[], list[str]] = lambda: [],
        bandwidth_floor_gbps: Callable[[], float | None] = lambda: None,
    ) -> None:
        """`start` starts a check rank (the agent forks it from its fork server when it can);
        `wake()` wakes the loop that calls `serve`; `machine_check()` runs the node's probes once and
        says its machine faults (a GPU missing, a required NIC down), which fail its share whatever
        the collectives say; `bandwidth_floor_gbps()` is the spec's floor for this node's links."""
        self.store, self.job, self.node, self.address = store, job, node, address
        self.machine_check = machine_check
        self.bandwidth_floor_gbps = bandwidth_floor_gbps
        self.wake = wake
        self.start = start
        self.workdir = workdir
        self.log = log
        self.requests: queue.Queue[CheckRequest] = queue.Queue()
        self._seen: list[str] = []

    def watch(self) -> None:
        self.store.watch_prefix(keys.checks_prefix(self.job), self._on_key)
        # A request written before the watch started is not replayed by it: read once.
        for key, value in self.store.get_prefix_raw(keys.checks_prefix(self.job)):
            self._on_key(key, value)

    def _on_key(self, key: str, value: bytes | None) -> None:
        if value is None or keys.parse_check_request_key(self.job, key) is None:
            return
        try:
            request = CheckRequest.loads(value)
        except ValidationError as exc:
            self.log.warning("unreadable check request", fields={"key": key, "error": str(exc)[:200]})
            return
        if self.node in request.nodes:
            self.requests.put(request)
            self.wake()

    def serve(self) -> None:
        """Start the shares asked for since the last call."""
        while True:
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                break
            if request.id in self._seen:
                continue
            self._seen = [*self._seen, request.id][-SEEN_LIMIT:]
            # Daemon: the rank processes it starts die with it (PR_SET_PDEATHSIG), as with the agent.
            threading.Thread(target=self._run, args=(request,), name=f"check-{request.id}", daemon=True).start()

    def _run(self, request: CheckRequest) -> None:
        started = time.monotonic()
        self.log.info(
            "running my share of the node checks",
            fields={"request": request.id, "nodes": len(request.nodes), "procs": request.procs_per_node},
        )
        try:
            # The probes first: a node refused for a missing GPU still runs its ranks, so its peers'
            # collectives do not wait for it in vain.
            faults = self.machine_check()
        except Exception as exc:  # says nothing about the machine (as a probe that crashes: not available)
            self.log.warning("the probes could not run", fields={"request": request.id, "error": repr(exc)[:200]})
            faults = []
        try:
            report = run_share(
                request, self.node, self.workdir / "checks" / request.id, self._rendezvous(request), self.start
            )
        except Exception as exc:  # a share that cannot run still answers, so the requester need not time out
            report = NodeCheckReport(request_id=request.id, node=self.node, error=f"{type(exc).__name__}: {exc}")
        report = report.model_copy(
            update={"machine_faults": faults, "bandwidth_floor_gbps": self.bandwidth_floor_gbps()}
        )
        try:
            self.store.put(keys.check_report(self.job, request.id, self.node), report)
        except StoreUnavailable as exc:
            self.log.warning("could not store my check report", fields={"request": request.id, "error": str(exc)})
            return
        self.log.info(
            "node checks done",
            fields={
                "request": request.id,
                "seconds": round(time.monotonic() - started, 2),
                "finished": all(r.finished for r in report.ranks) and not report.error,
                "error": report.error,
                "machine_faults": report.machine_faults,
            },
        )

    def _rendezvous(self, request: CheckRequest) -> Callable[[float], CheckRendezvous | None]:
        """The first node picks a free port on its own address and publishes it; the rest wait."""
        key = keys.check_rendezvous(self.job, request.id)

        def where(deadline: float) -> CheckRendezvous | None:
            if request.nodes[0] == self.node:
                published = CheckRendezvous(address=self.address, port=free_port(self.address))
                self.store.put(key, published)
                return published
            while time.monotonic() < deadline:  # bounded by the request's timeout
                found = self.store.get(key, CheckRendezvous)
                if found is not None:
                    return found
                time.sleep(POLL_SECONDS)
            return None

        return where
