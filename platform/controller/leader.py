"""At most one active controller per job: an etcd key held under the leader's lease."""

from __future__ import annotations

import os
import socket
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
        self._last_refresh = 0.0

    def acquire(self, timeout: float, interval: float = 0.2) -> bool:
        """Become the leader, waiting up to `timeout` for a previous leader's lease to lapse."""
        deadline = time.monotonic() + timeout
        while True:
            lease = self.store.lease(self.ttl)
            if self.store.create(self.key, self.identity, lease=lease):
                self._lease, self._last_refresh = lease, time.monotonic()
                return True
            lease.revoke()
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)

    def keep(self) -> None:
        """Renew our lease about three times per TTL; raises LeaseLost if leadership lapsed."""
        if self._lease is None:
            raise LeaseLost("not the leader")
        if time.monotonic() - self._last_refresh >= self.ttl / 3:
            self._lease.refresh()
            self._last_refresh = time.monotonic()

    @property
    def guard(self) -> dict[str, str]:
        """A commit condition: our writes land only while we still hold leadership."""
        return {self.key: self.identity}

    def release(self) -> None:
        if self._lease is not None:
            self._lease.revoke()
            self._lease = None
