"""One holder of a key at a time: the key lives under the holder's etcd lease, renewed on a thread
of its own, so a holder that dies or stalls past the TTL loses it and a standby takes over.

Used for the job controller (one active per job) and the Kubernetes operator (one active replica).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from stalwart.logs import get_logger
from stalwart.store.client import Lease, LeaseLost, Store

log = get_logger("stalwart.election")


class LeaseElection:
    def __init__(
        self,
        store: Store,
        key: str,
        ttl: int,
        *,
        identity: str | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.ttl = ttl
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.on_lost = on_lost
        self.lost = threading.Event()
        self._lease: Lease | None = None
        self._released = threading.Event()
        self._keeper: threading.Thread | None = None

    def try_acquire(self) -> bool:
        """One attempt: True if we hold the key now."""
        lease = self.store.lease(self.ttl)
        if self.store.create(self.key, self.identity, lease=lease):
            self._lease = lease
            self._keeper = threading.Thread(target=self._keep_alive, name="leader-keepalive", daemon=True)
            self._keeper.start()
            log.info("leading", fields={"key": self.key, "identity": self.identity})
            return True
        lease.revoke()
        return False

    def acquire(self, timeout: float, interval: float = 0.2) -> bool:
        """Become the holder, waiting up to `timeout` for a previous holder's lease to lapse."""
        deadline = time.monotonic() + timeout
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)
        return True

    def acquire_until(self, stop: threading.Event, interval: float = 1.0) -> bool:
        """Stand by until we hold the key (True) or `stop` is set (False); etcd outages are waited out."""
        announced = False
        while not stop.is_set():
            try:
                if self.try_acquire():
                    return True
                if not announced:
                    log.info(
                        "standing by", fields={"key": self.key, "identity": self.identity, "leader": self.holder()}
                    )
                    announced = True
            except Exception as exc:
                log.warning("election attempt failed", fields={"key": self.key, "error": str(exc)})
            stop.wait(interval)
        return False

    def holder(self) -> str | None:
        raw = self.store.get_raw(self.key)
        return None if raw is None else raw.decode()

    def _keep_alive(self) -> None:
        """Renew three times per TTL, on its own thread: a slow step of the holder (stopping a node
        takes seconds) must not cost it the key."""
        while not self._released.wait(timeout=self.ttl / 3):
            try:
                assert self._lease is not None
                self._lease.refresh()
            except LeaseLost:
                log.error("leadership lost", fields={"key": self.key, "identity": self.identity})
                self.lost.set()
                if self.on_lost is not None:
                    self.on_lost()
                return
            except Exception:
                continue

    def regain(self) -> bool:
        """After our lease lapsed (etcd was away longer than its TTL): take the key again if nobody
        else holds it. True if we lead again; raises StoreUnavailable if etcd is away."""
        if self._keeper is not None:
            self._keeper.join(timeout=self.ttl)  # it ended when the renewal failed
        self._lease = None
        if not self.try_acquire():
            return False
        self.lost.clear()
        return True

    def keep(self) -> None:
        """Raises LeaseLost if we no longer hold the key (the holder must stop acting at once)."""
        if self._lease is None or self.lost.is_set():
            raise LeaseLost("leadership lapsed")

    @property
    def guard(self) -> dict[str, str]:
        """A commit condition: our writes land only while we still hold the key."""
        return {self.key: self.identity}

    def release(self) -> None:
        self._released.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:
                pass
            self._lease = None
