"""Fires injected faults when the job reaches their step. Used by `stalwart run` and the tests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

from pydantic import BaseModel

from stalwart.cluster.local import LocalCluster
from stalwart.faults.etcd_faults import EtcdFaults
from stalwart.faults.spec import FaultKind, FaultSpec
from stalwart.faults.worker_faults import (
    HANG_SIGNAL,
    LOSS_SPIKE_SIGNAL,
    SLOW_DATA_SIGNAL,
    SLOW_OPTIMIZER_SIGNAL,
    SLOW_SIGNAL,
)
from stalwart.logs import get_logger
from stalwart.store.records import Heartbeat, JobPhase, JobState

_WORKER_SIGNALS = {
    FaultKind.KILL_WORKER: signal.SIGKILL,
    FaultKind.HANG_WORKER: HANG_SIGNAL,
    FaultKind.SLOW_WORKER: SLOW_SIGNAL,
    FaultKind.SLOW_DATA: SLOW_DATA_SIGNAL,
    FaultKind.SLOW_OPTIMIZER: SLOW_OPTIMIZER_SIGNAL,
    FaultKind.LOSS_SPIKE: LOSS_SPIKE_SIGNAL,
}


class FiredFault(BaseModel):
    fault: str
    fired_at: float
    step: int
    target: str


class FaultInjector:
    def __init__(
        self,
        faults: list[FaultSpec],
        cluster: LocalCluster,
        kill_controller: Callable[[], int | None],
        etcd: EtcdFaults | None = None,
    ) -> None:
        self.pending = [f for f in faults if not f.kind.through_environment]
        self.fired: list[FiredFault] = []
        self.cluster = cluster
        self.kill_controller = kill_controller
        self.etcd = etcd or EtcdFaults(None)
        self.log = get_logger("stalwart.faults", job=cluster.job)
        # The job's handled failures when the last fault fired: an `after=recovery` fault waits until
        # one more was handled and no incident is open any more.
        self._handled_at_last_fire: int | None = None

    def poll(self, state: JobState | None, beats: dict[str, Heartbeat]) -> list[FiredFault]:
        if state is None or state.phase is not JobPhase.RUNNING or not self.pending:
            return []
        workers = state.current_workers(beats)
        step = max((w.step for w in workers if w.step is not None), default=0)
        out = []
        for fault in list(self.pending):
            if step < fault.step or (fault.after is not None and not self._recovered(state)):
                continue
            fired_at = time.time()  # before the signal: killing a node also waits for its processes to go
            target = self._fire(fault, state, workers)
            if target is None:
                continue  # the target is not up yet: try again next poll
            self.pending.remove(fault)
            self._handled_at_last_fire = handled(state)
            fired = FiredFault(fault=fault.describe(), fired_at=fired_at, step=step, target=target)
            self.fired.append(fired)
            self.log.warning("fault injected", fields=fired.model_dump())
            out.append(fired)
        return out

    def _recovered(self, state: JobState) -> bool:
        """The faults fired so far were handled and the job is past them (phase Running is checked
        by the caller; a role recovering alone keeps the job Running, so its incident is asked)."""
        if self._handled_at_last_fire is None:
            return True
        return (
            handled(state) > self._handled_at_last_fire and state.open_incident is None and not state.restarting_roles
        )

    def _fire(self, fault: FaultSpec, state: JobState, workers: list) -> str | None:
        if fault.kind in _WORKER_SIGNALS:
            worker = next((w for w in workers if w.rank == fault.rank and w.exit_code is None), None)
            if worker is None:
                return None
            sig = _WORKER_SIGNALS[fault.kind]
            try:
                os.kill(worker.pid, sig)
            except ProcessLookupError:
                return None
            return f"rank {fault.rank} (pid {worker.pid})"
        if fault.kind is FaultKind.PAUSE_ETCD:
            return self.etcd.pause(fault.seconds)
        if fault.kind is FaultKind.KILL_ETCD:
            return self.etcd.kill(fault.seconds)
        if fault.kind is FaultKind.RESTORE_MACHINE:
            capacity = self.cluster.restore_machine()
            if capacity is None:
                return "no machine limit (--max-nodes): nothing to restore"
            return f"a machine ({capacity.machines} of {capacity.max_nodes} now usable)"
        if fault.kind in (FaultKind.KILL_NODE, FaultKind.FREEZE_NODE):
            assert fault.node is not None
            node = state.slots[int(fault.node)] if fault.node.isdigit() else fault.node
            freeze = fault.kind is FaultKind.FREEZE_NODE
            pids = self.cluster.freeze_node(node) if freeze else self.cluster.kill_node(node)
            return f"{node} ({len(pids)} processes)" if pids else None
        pid = self.kill_controller()
        return f"controller (pid {pid})" if pid else None


def handled(state: JobState) -> int:
    """Failures the controller has acted on (each restart, counted or not)."""
    return state.restarts + state.infra_restarts
