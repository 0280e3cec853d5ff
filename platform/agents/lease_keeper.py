"""The agent's lease keeper: holds the node's lease and renews it with every heartbeat.

It runs on its own thread: starting or stopping workers can take seconds on a loaded machine, and a
lease must never lapse because of that. A lease etcd no longer knows means the controller already
counted the node as lost: the node is fenced and must stop acting for the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Lease, LeaseLost, Store, StoreUnavailable
from stalwart.store.records import Heartbeat

ETCD_OUTAGE_LEASES = 3  # etcd unreachable for this many lease TTLs: the agent gives up


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
    ) -> None:
        """`build(now)` makes the heartbeat to send; it must not block for long."""
        self.store, self.job, self.node = store, job, node
        self.ttl, self.interval = ttl, interval
        self.build = build
        self.log = log
        self.lease: Lease | None = None
        self.fenced: Fenced | None = None  # set once, from the keeper's thread
        self._now = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etcd_lost_since: float | None = None

    def acquire(self) -> Lease:
        self.lease = self.store.lease(self.ttl)
        return self.lease

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def beat_now(self) -> None:
        """Send a heartbeat now instead of at the next interval (the workers' state changed)."""
        self._now.set()

    def _loop(self) -> None:
        assert self.lease is not None
        while not self._stop.is_set():
            self._now.wait(timeout=self.interval)
            self._now.clear()
            if self._stop.is_set():
                return
            now = time.time()
            beat = self.build(now)
            try:
                self.lease.refresh()
                self.store.put(keys.node_heartbeat(self.job, self.node), beat, lease=self.lease)
                self._etcd_lost_since = None
            except LeaseLost:
                self.fenced = Fenced(3, "node lease expired; this node has been replaced")
                return
            except StoreUnavailable as exc:
                self._etcd_lost_since = self._etcd_lost_since or now
                if now - self._etcd_lost_since > ETCD_OUTAGE_LEASES * self.ttl:
                    self.fenced = Fenced(4, f"etcd unreachable for too long: {exc}")
                    return

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
