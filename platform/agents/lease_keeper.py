"""The agent's lease keeper: holds the node's lease and writes its heartbeat record.

Liveness is the lease alone: every heartbeat interval the keeper sends one keep-alive message on the
lease's long-lived stream (stalwart.store.keepalive), which costs etcd no write. The heartbeat record
is built every interval too (the agent's metrics and metric window follow it) but put into etcd only
when the write rule says so (stalwart.store.heartbeat_budget): at once when something the controller
acts on changed, otherwise at most once per progress interval (the heartbeat interval for any job of
up to a few hundred nodes, longer for bigger ones).

It runs on its own thread: starting or stopping workers can take seconds on a loaded machine, and a
lease must never lapse because of that.

etcd out of reach (restarting, paused, starved) is ridden out for `faultTolerance.etcdOutageSeconds`:
the workers keep training, and the keeper retries each interval. A lease that lapsed meanwhile (etcd
expires leases by its own clock: a pause longer than the TTL does it) is not a verdict on this node:
if the job still counts on it (it is in the job's slots or standbys), the keeper takes a new lease and
registers again, same node, same workers, same generation. A lease revoked before its TTL ran out was
revoked on purpose (the controller fenced this node), and a node the job has replaced is fenced too:
either way it must stop acting for the job. Past the outage limit the agent stops its workers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Lease, LeaseLost, Store, StoreUnavailable
from stalwart.store.heartbeat_budget import HeartbeatGate, progress_phase
from stalwart.store.records import Heartbeat, JobState, NodeRegistration

FENCED_EXIT = 3  # the node was replaced: its lease was revoked, or the job no longer lists it
ETCD_LOST_EXIT = 4  # etcd stayed out of reach past faultTolerance.etcdOutageSeconds


class Fenced(Exception):
    """The node's lease is gone (it was replaced), or etcd stayed out of reach too long."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class LeaseKeeper:
    def __init__(
        self,
        store: Store,
        job: str,
        node: str,
        ttl: int,
        interval: float,
        build: Callable[[float], Heartbeat],
        log: ContextLogger,
        *,
        outage_limit: float,
        progress_interval: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`build(now)` makes the heartbeat; it must not block for long. `progress_interval`: the
        longest an unchanged heartbeat waits to be written (heartbeat_budget.job_progress_interval;
        None: the heartbeat interval, a write every beat)."""
        self.store, self.job, self.node = store, job, node
        self.ttl, self.interval, self.outage_limit = ttl, interval, outage_limit
        every = interval if progress_interval is None else progress_interval
        self.gate = HeartbeatGate(interval, every, progress_phase(node, every))
        self.written = 0  # heartbeat records put into etcd
        self.build = build
        self.log = log
        self.clock = clock
        self.lease: Lease | None = None
        self.fenced: Fenced | None = None  # set once, from the keeper's thread
        self.rejoined = 0  # times the node registered again after its lease lapsed
        self._registration: Callable[[int], NodeRegistration] | None = None
        self._renewed_at = 0.0  # when the last renewal that held was sent: the lease outlives it by the TTL
        self._away_since: float | None = None  # etcd stopped answering (None: it answers)
        self._now = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def etcd_away(self) -> bool:
        """etcd did not answer the last heartbeat."""
        return self._away_since is not None

    def join(self, registration: Callable[[int], NodeRegistration]) -> Lease:
        """Take a lease and put the node's registration under it (`registration(lease_id)`); the same
        registration is put again under a new lease if this one lapses while etcd is away."""
        self._registration = registration
        self._renewed_at = self.clock()
        lease = self.store.lease(self.ttl)
        self.store.put(keys.node_registration(self.job, self.node), registration(lease.id), lease=lease)
        self.lease = lease
        return lease

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def beat_now(self) -> None:
        """Beat now instead of at the next interval (the workers' state changed): the heartbeat is
        written at once if what changed is something the controller acts on."""
        self._now.set()

    def _loop(self) -> None:
        while not self._stop.is_set() and self.fenced is None:
            self._now.wait(timeout=self.interval)
            self._now.clear()
            if self._stop.is_set():
                return
            self.beat()

    def beat(self) -> None:
        """One heartbeat: renew the lease (or take a new one), then put the heartbeat under it if the
        write rule says it is due. Never raises: the outcome is in `fenced`, `etcd_away` and the log."""
        now = self.clock()
        try:
            lease = self.lease or self._rejoin(now)
            if lease is None:
                return  # fenced
            try:
                lease.refresh()
            except LeaseLost:
                if self.clock() < self._renewed_at + self.ttl:
                    # Renewed less than a TTL ago, so it did not lapse: it was revoked, which the
                    # controller does to a node it replaced.
                    self._fence(FENCED_EXIT, "node lease revoked; this node has been replaced")
                    return
                self.lease = None
                lease = self._rejoin(now)
                if lease is None:
                    return
            self._renewed_at = now
            beat = self.build(now)
            if self.gate.due(beat, now):
                self.store.put(keys.node_heartbeat(self.job, self.node), beat, lease=lease)
                self.gate.wrote(beat, now)
                self.written += 1
        except StoreUnavailable as exc:
            self._unreachable(now, exc)
            return
        if self._away_since is not None:
            self.log.info("etcd is back", fields={"after": round(now - self._away_since, 1)})
            self._away_since = None

    def _rejoin(self, now: float) -> Lease | None:
        """Our lease lapsed without being revoked (etcd was away, or this machine too slow to renew
        it): register again under a new lease if the job still counts on this node."""
        state = self.store.get(keys.job_state(self.job), JobState)
        if state is None or (self.node not in state.slots and self.node not in state.standbys):
            self._fence(FENCED_EXIT, "node lease lapsed, and the job no longer lists this node (it was replaced)")
            return None
        assert self._registration is not None, "join() first"
        lease = self.store.lease(self.ttl)
        self.store.put(keys.node_registration(self.job, self.node), self._registration(lease.id), lease=lease)
        self.lease = lease
        self.gate.forget()  # the heartbeat went with the old lease: write the next one at once
        self.rejoined += 1
        self.log.warning(
            "node lease lapsed while heartbeats could not reach etcd; registered again under a new lease",
            fields={"lease": f"{lease.id:x}", "silent": round(now - self._renewed_at, 1)},
        )
        return lease

    def _unreachable(self, now: float, exc: StoreUnavailable) -> None:
        if self._away_since is None:
            self._away_since = now
            self.log.warning(
                "etcd unreachable; the workers keep training",
                fields={"error": str(exc), "limit_seconds": self.outage_limit},
            )
        away = self.clock() - self._away_since  # after the failed call: it may have waited for its timeout
        if away > self.outage_limit:
            self._fence(
                ETCD_LOST_EXIT,
                f"etcd unreachable for {away:.0f}s, longer than faultTolerance.etcdOutageSeconds "
                f"({self.outage_limit:g}s): stopping this node's workers ({exc})",
            )

    def _fence(self, code: int, reason: str) -> None:
        self.fenced = Fenced(code, reason)

    def stop(self, revoke: bool) -> None:
        """Stop heartbeating; with `revoke`, give the lease back so the controller sees the node go at
        once, not after the TTL."""
        self._stop.set()
        self._now.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if revoke and self.lease is not None and self.fenced is None:
            try:
                self.lease.revoke()
            except (StoreUnavailable, LeaseLost):
                pass
