"""In-memory stand-ins for the controller's unit tests: an etcd store, a cluster, a clock and a work
runner. They live here, never in platform/: production always talks to the real things.

`MemoryStore` honours the commit semantics of `stalwart.store.client.Store` (expected values,
expected mod revisions, a missing key's revision 0, leases whose keys vanish when revoked);
tests/unit/controller/test_memory_store.py runs the same contract against a real etcd.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from stalwart.cluster.base import Cluster, NodeInfo, PreflightVerdict
from stalwart.controller.core.work import Diagnosis as Finding
from stalwart.controller.core.work import Work, WorkKey, WorkResult
from stalwart.store.client import MAX_TXN_OPS, LeaseLost, StoreUnavailable
from stalwart.store.records import Record

R = TypeVar("R", bound=Record)


@dataclass
class _Entry:
    value: bytes
    mod_revision: int
    lease: int | None


class MemoryLease:
    def __init__(self, store: MemoryStore, lease_id: int) -> None:
        self._store = store
        self.id = lease_id

    def refresh(self) -> None:
        if self.id not in self._store._leases:
            raise LeaseLost(f"lease {self.id:x} has expired")

    def revoke(self) -> None:
        self._store.revoke_lease(self.id)


class MemoryStore:
    """The subset of `Store` the controller uses, in one process, thread-safe."""

    endpoint = "memory"

    def __init__(self) -> None:
        self._data: dict[str, _Entry] = {}
        self._revision = 1
        self._leases: set[int] = set()
        self._lease_ids = itertools.count(0x1000)
        self._lock = threading.RLock()
        self.commits = 0  # transactions that held
        self._watches: list[_MemoryWatch] = []
        self.prefix_reads: list[str] = []  # every prefix read whole (a watch's start included)

    def _changed(self, key: str, value: bytes | None) -> None:
        """Watches hear of a change at once, in the writer's thread: a test that writes, then
        ticks, finds the controller's view up to date (a real etcd's watch is milliseconds late)."""
        for watch in list(self._watches):
            if key.startswith(watch.prefix):
                watch.callback(key, value, self._revision)

    # -- plain values ----------------------------------------------------------------------------
    def get_raw(self, key: str) -> bytes | None:
        with self._lock:
            entry = self._data.get(key)
            return entry.value if entry else None

    def get(self, key: str, cls: type[R]) -> R | None:
        raw = self.get_raw(key)
        return None if raw is None else cls.loads(raw)

    def get_with_revision(self, key: str, cls: type[R]) -> tuple[R | None, int]:
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return None, 0
            return cls.loads(entry.value), entry.mod_revision

    def get_prefix_raw(self, prefix: str) -> list[tuple[str, bytes]]:
        return self.read_prefix(prefix)[0]

    def read_prefix(self, prefix: str, *, keys_only: bool = False) -> tuple[list[tuple[str, bytes]], int]:
        with self._lock:
            self.prefix_reads.append(prefix)
            items = [(k, b"" if keys_only else e.value) for k, e in sorted(self._data.items()) if k.startswith(prefix)]
            return items, self._revision

    def list_keys(self, prefix: str) -> list[str]:
        return [k for k, _ in self.read_prefix(prefix, keys_only=True)[0]]

    def first_key(self, start: str, end: str) -> str | None:
        with self._lock:
            return min((k for k in self._data if start <= k < end), default=None)

    def watch_prefix_from(
        self, prefix: str, callback: Callable[[str, bytes | None, int], None], resync: Callable[[], int]
    ) -> _MemoryWatch:
        with self._lock:
            resync()
            watch = _MemoryWatch(self, prefix, callback)
            self._watches.append(watch)
            return watch

    def get_prefix(self, prefix: str, cls: type[R]) -> list[R]:
        return [cls.loads(v) for _, v in self.get_prefix_raw(prefix)]

    def put(self, key: str, value: Record | str, lease: MemoryLease | None = None) -> int:
        with self._lock:
            self._put(key, value, lease.id if lease else None)
            return self._revision

    def put_batch(self, puts: dict[str, Record | str]) -> int:
        self.commit(puts)
        return self._revision

    def _put(self, key: str, value: Record | str, lease: int | None) -> None:
        if lease is not None and lease not in self._leases:
            raise StoreUnavailable(f"lease {lease:x} not found")
        self._revision += 1
        data = value if isinstance(value, str) else value.dumps()
        self._data[key] = _Entry(data.encode(), self._revision, lease)
        self._changed(key, data.encode())

    def delete(self, key: str) -> None:
        with self._lock:
            if self._data.pop(key, None) is not None:
                self._revision += 1
                self._changed(key, None)

    def delete_prefix(self, prefix: str) -> None:
        with self._lock:
            for key in [k for k in self._data if k.startswith(prefix)]:
                self.delete(key)

    # -- leases and transactions -----------------------------------------------------------------
    def lease(self, ttl: int) -> MemoryLease:
        with self._lock:
            lease_id = next(self._lease_ids)
            self._leases.add(lease_id)
            return MemoryLease(self, lease_id)

    def revoke_lease(self, lease_id: int) -> None:
        with self._lock:
            if lease_id not in self._leases:
                raise StoreUnavailable(f"lease {lease_id:x} not found")
            self._leases.discard(lease_id)
            for key in [k for k, e in self._data.items() if e.lease == lease_id]:
                self.delete(key)

    def create(self, key: str, value: Record | str, lease: MemoryLease | None = None) -> bool:
        with self._lock:
            if key in self._data:
                return False
            self._put(key, value, lease.id if lease else None)
            return True

    def commit(
        self,
        puts: dict[str, Record | str],
        *,
        expect_value: dict[str, str] | None = None,
        expect_revision: dict[str, int] | None = None,
        deletes: list[str] | None = None,
    ) -> bool:
        if len(puts) + len(deletes or []) > MAX_TXN_OPS:  # as etcd refuses it
            raise StoreUnavailable(f"etcd failed: too many operations in txn request ({len(puts)} puts)")
        with self._lock:
            for key, want in (expect_value or {}).items():
                entry = self._data.get(key)
                if entry is None or entry.value != want.encode():
                    return False
            for key, revision in (expect_revision or {}).items():
                entry = self._data.get(key)
                if (entry.mod_revision if entry else 0) != revision:
                    return False
            self._revision += 1  # one transaction, one revision, as in etcd
            for key, value in puts.items():
                data = value if isinstance(value, str) else value.dumps()
                self._data[key] = _Entry(data.encode(), self._revision, None)
                self._changed(key, data.encode())
            for key in deletes or []:
                if self._data.pop(key, None) is not None:
                    self._changed(key, None)
            self.commits += 1
            return True

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass


class _MemoryWatch:
    def __init__(self, store: MemoryStore, prefix: str, callback: Callable[[str, bytes | None, int], None]) -> None:
        self.store, self.prefix, self.callback = store, prefix, callback

    def cancel(self) -> None:
        with self.store._lock:
            if self in self.store._watches:
                self.store._watches.remove(self)


class FakeCluster(Cluster):
    """Nodes are names with an alive flag; every call is recorded. `on_start` may play the node's
    agent (register it in the store)."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {}
        self.calls: list[tuple[str, str]] = []
        self.failing: dict[str, list[str]] = {}  # node -> reasons its checks fail with
        self.on_start: Callable[[str], None] | None = None
        self.free: int | None = None  # what free_machines says (None: no limit)

    def start_node(self, name: str, role: str | None = None) -> None:
        self.calls.append(("start", name))
        self.nodes[name] = NodeInfo(name=name, alive=True)
        if self.on_start is not None:
            self.on_start(name)

    def stop_node(self, name: str) -> None:
        self.calls.append(("stop", name))
        self.nodes.pop(name, None)

    def kill(self, name: str) -> None:
        """The machine dies: the cluster reports it dead (its lease is the store's business)."""
        self.nodes[name] = NodeInfo(name=name, alive=False)

    def list_nodes(self) -> list[NodeInfo]:
        return sorted(self.nodes.values(), key=lambda n: n.name)

    def rendezvous(self, node: str) -> tuple[str, int]:
        return "127.0.0.1", 29500

    def free_machines(self) -> int | None:
        return self.free

    def preflight(self, nodes: list[str], procs_per_node: int) -> list[PreflightVerdict]:
        self.calls.append(("preflight", ",".join(nodes)))
        return [PreflightVerdict(node=n, passed=n not in self.failing, reasons=self.failing.get(n, [])) for n in nodes]

    def cordon(self, node: str, reason: str) -> None:
        self.calls.append(("cordon", node))

    def uncordon(self, node: str) -> None:
        self.calls.append(("uncordon", node))

    def called(self, what: str) -> list[str]:
        return [name for kind, name in self.calls if kind == what]


@dataclass
class FakeClock:
    now: float = 1_000_000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class ManualRunner:
    """Work is recorded when launched and finishes when the test says so."""

    clock: FakeClock
    launched: list[Work] = field(default_factory=list)
    running: dict[WorkKey, Work] = field(default_factory=dict)
    done: list[WorkResult] = field(default_factory=list)

    def launch(self, work: Work) -> None:
        if work.key not in self.running:
            self.launched.append(work)
            self.running[work.key] = work

    def in_flight(self) -> frozenset[WorkKey]:
        return frozenset(self.running)

    def take(self) -> list[WorkResult]:
        done, self.done = self.done, []
        return done

    def finish(
        self,
        key: WorkKey,
        *,
        verdicts: list[PreflightVerdict] | None = None,
        diagnosis: Finding | None = None,
        error: str | None = None,
    ) -> None:
        work = self.running.pop(key)
        self.done.append(WorkResult(work, self.clock.time(), verdicts=verdicts or [], diagnosis=diagnosis, error=error))

    def finish_checks(self, cluster: FakeCluster) -> None:
        """Every node check launched so far, answered by the fake cluster's verdicts."""
        from stalwart.controller.core.work import NodeChecks

        for key, work in list(self.running.items()):
            if isinstance(work, NodeChecks):
                self.finish(key, verdicts=cluster.preflight(list(work.nodes), work.procs))
