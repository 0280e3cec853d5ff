"""Leader election between operator replicas, on the etcd the platform already requires.

The standby replica does not start kopf at all until it leads (like controller-runtime's leader
election), and the leader stops kopf and exits at once when its lease lapses, so Kubernetes
restarts it as a standby. Why etcd and not kopf's peering: peering needs two more CRDs and is a
priority-based pause, not a lease; why not a coordination.k8s.io Lease: etcd is there anyway, its
transactions are atomic, and every controller commit is already fenced by an etcd lease per job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from stalwart.logs import get_logger
from stalwart.store import keys
from stalwart.store.client import Lease, LeaseLost, Store

log = get_logger("stalwart.operator.election")


def leader_key(operator_name: str) -> str:
    return keys.operator_leader(operator_name)


class OperatorLeadership:
    def __init__(
        self, store: Store, operator_name: str, identity: str, ttl: int = 10
    ) -> None:
        self.store = store
        self.key = leader_key(operator_name)
        self.identity = identity
        self.ttl = ttl
        self._lease: Lease | None = None
        self._released = threading.Event()
        self.lost = threading.Event()
        self._keeper: threading.Thread | None = None
        self.on_lost: Callable[[], None] | None = None

    def holder(self) -> str | None:
        raw = self.store.get_raw(self.key)
        return None if raw is None else raw.decode()

    def acquire(self, stop: threading.Event, interval: float = 1.0) -> bool:
        """Block until this replica leads (True) or `stop` is set (False)."""
        announced = False
        while not stop.is_set():
            try:
                lease = self.store.lease(self.ttl)
                if self.store.create(self.key, self.identity, lease=lease):
                    self._lease = lease
                    self._keeper = threading.Thread(
                        target=self._keep, name="operator-leadership", daemon=True
                    )
                    self._keeper.start()
                    log.info(
                        "leading", fields={"identity": self.identity, "key": self.key}
                    )
                    return True
                lease.revoke()
                if not announced:
                    log.info(
                        "standing by",
                        fields={"identity": self.identity, "leader": self.holder()},
                    )
                    announced = True
            except Exception as exc:  # noqa: BLE001 - etcd unreachable: keep trying, the lease decides
                log.warning("election attempt failed", fields={"error": str(exc)})
            stop.wait(interval)
        return False

    def _keep(self) -> None:
        while not self._released.wait(timeout=self.ttl / 3):
            try:
                assert self._lease is not None
                self._lease.refresh()
            except LeaseLost:
                log.error("leadership lost", fields={"identity": self.identity})
                self.lost.set()
                if self.on_lost is not None:
                    self.on_lost()
                return
            except Exception:  # noqa: BLE001, S112 - a blip: retry; if it lasts, the lease lapses and we learn it
                continue

    def release(self) -> None:
        self._released.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        if self._lease is not None:
            try:
                self._lease.revoke()
            except Exception:  # noqa: BLE001, S110 - gone already; the TTL ends it anyway
                pass
            self._lease = None
