"""At most one active controller per job: an etcd key held under the leader's lease."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

from stalwart.store import keys
from stalwart.store.client import Lease, LeaseLost, Store


class Leadership:
    def __init__(self, store: Store, job: str, ttl: int = 5) -> None:
        self.store = store
        self.key = keys.job_leader(job)
        self.ttl = ttl
        self.identity = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lease: Lease | None = None
        self._lost = threading.Event()
        self._released = threading.Event()
        self._keeper: threading.Thread | None = None

    def acquire(self, timeout: float, interval: float = 0.2) -> bool:
        """Become the leader, waiting up to `timeout` for a previous leader's lease to lapse."""
        deadline = time.monotonic() + timeout
        while True:
            lease = self.store.lease(self.ttl)
            if self.store.create(self.key, self.identity, lease=lease):
                self._lease = lease
                self._keeper = threading.Thread(target=self._keep_alive, name="leader-keepalive", daemon=True)
                self._keeper.start()
                return True
            lease.revoke()
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    def _keep_alive(self) -> None:
        """Renew the lease three times per TTL, on its own thread: a slow step of the controller
        (stopping a node takes seconds) must not cost it its leadership."""
        while not self._released.wait(timeout=self.ttl / 3):
            try:
                assert self._lease is not None
                self._lease.refresh()
            except LeaseLost:
                self._lost.set()
                return
            except Exception:  # noqa: BLE001 - etcd unreachable: retry; the lease decides
                continue

    def keep(self) -> None:
        """Raises LeaseLost if leadership lapsed (the controller must stop acting at once)."""
        if self._lease is None or self._lost.is_set():
            raise LeaseLost("leadership lapsed")

    @property
    def guard(self) -> dict[str, str]:
        """A commit condition: our writes land only while we still hold leadership."""
        return {self.key: self.identity}

    def release(self) -> None:
        self._released.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:  # noqa: BLE001 - gone already; the TTL ends it anyway
                pass
            self._lease = None
