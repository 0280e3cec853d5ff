"""The etcd-backed store: typed records, leases, watches and compare-and-swap transactions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc
import pyetcd
from pyetcd.events import DeleteEvent, PutEvent

from stalwart.store.records import Record

R = TypeVar("R", bound=Record)


class StoreUnavailable(RuntimeError):
    """etcd did not answer; the message says where we tried."""


class LeaseLost(RuntimeError):
    """Our lease expired: whatever we held under it (a node, a leadership) is gone."""


@contextmanager
def _translate_errors(endpoint: str) -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        raise StoreUnavailable(f"etcd at {endpoint} did not answer ({code}): {exc}") from None
    except pyetcd.exceptions.ConnectionFailedError:
        raise StoreUnavailable(f"cannot reach etcd at {endpoint}") from None
    except pyetcd.exceptions.ConnectionTimeoutError:
        raise StoreUnavailable(f"etcd at {endpoint} timed out") from None
    except pyetcd.exceptions.Etcd3Exception as exc:
        raise StoreUnavailable(f"etcd at {endpoint} failed: {type(exc).__name__} {exc}") from None


class Lease:
    def __init__(self, store: Store, inner: pyetcd.Lease) -> None:
        self._store = store
        self._inner = inner

    @property
    def id(self) -> int:
        return int(self._inner.id)

    def refresh(self) -> None:
        """Renew the lease; raises LeaseLost if it already expired (etcd answers TTL 0)."""
        with _translate_errors(self._store.endpoint):
            responses = self._inner.refresh()
        if not responses or responses[0].TTL <= 0:
            raise LeaseLost(f"lease {self.id:x} has expired")

    def revoke(self) -> None:
        with _translate_errors(self._store.endpoint):
            self._inner.revoke()


class Store:
    """A thin, typed face on an etcd client. One per process; safe to share between threads."""

    def __init__(self, endpoint: str, timeout: float = 5.0) -> None:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint must be HOST:PORT, got {endpoint!r}")
        self.endpoint = endpoint
        self._client = pyetcd.client(host=host, port=int(port), timeout=timeout)
        # The client benches an endpoint for 5 minutes after one failed call; with a single etcd
        # endpoint that turns a blip into an outage. Retry it at once instead.
        for ep in self._client.endpoints.values():
            ep.time_retry = 0.0
        self._watches: list[int] = []

    # -- plain values ------------------------------------------------------------------------
    def get_raw(self, key: str) -> bytes | None:
        with _translate_errors(self.endpoint):
            value, _ = self._client.get(key)
        return value

    def get(self, key: str, cls: type[R]) -> R | None:
        raw = self.get_raw(key)
        return None if raw is None else cls.loads(raw)

    def get_with_revision(self, key: str, cls: type[R]) -> tuple[R | None, int]:
        """The record and its mod revision (0 when absent), for compare-and-swap."""
        with _translate_errors(self.endpoint):
            value, meta = self._client.get(key)
        if value is None:
            return None, 0
        return cls.loads(value), int(meta.mod_revision)

    def get_prefix_raw(self, prefix: str) -> list[tuple[str, bytes]]:
        with _translate_errors(self.endpoint):
            items = list(self._client.get_prefix(prefix))
        return [(meta.key.decode(), value) for value, meta in items]

    def list_keys(self, prefix: str) -> list[str]:
        """The keys under a prefix, without their values (cheap on prefixes holding big records)."""
        with _translate_errors(self.endpoint):
            items = list(self._client.get_prefix(prefix, keys_only=True))
        return [meta.key.decode() for _, meta in items]

    def get_prefix(self, prefix: str, cls: type[R]) -> list[R]:
        return [cls.loads(v) for _, v in self.get_prefix_raw(prefix)]

    def put(self, key: str, value: Record | str, lease: Lease | None = None) -> None:
        data = value if isinstance(value, str) else value.dumps()
        with _translate_errors(self.endpoint):
            self._client.put(key, data, lease=lease.id if lease else None)

    def delete(self, key: str) -> None:
        with _translate_errors(self.endpoint):
            self._client.delete(key)

    def delete_prefix(self, prefix: str) -> None:
        with _translate_errors(self.endpoint):
            self._client.delete_prefix(prefix)

    # -- leases and transactions ---------------------------------------------------------------
    def lease(self, ttl: int) -> Lease:
        with _translate_errors(self.endpoint):
            return Lease(self, self._client.lease(ttl))

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke someone else's lease (fencing a node that stopped answering): its keys vanish
        now, and its holder's next renewal fails, so it stops acting for the job."""
        with _translate_errors(self.endpoint):
            self._client.revoke_lease(lease_id)

    def create(self, key: str, value: Record | str, lease: Lease | None = None) -> bool:
        """Put only if the key does not exist. True if we created it."""
        data = value if isinstance(value, str) else value.dumps()
        tx = self._client.transactions
        with _translate_errors(self.endpoint):
            ok, _ = self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, data, lease=lease.id if lease else None)],
                failure=[],
            )
        return bool(ok)

    def commit(
        self,
        puts: dict[str, Record | str],
        *,
        expect_value: dict[str, str] | None = None,
        expect_revision: dict[str, int] | None = None,
        deletes: list[str] | None = None,
    ) -> bool:
        """Write (and delete) several keys atomically, only if the expectations hold (values equal, mod
        revisions equal).

        This is how two writers that could race (two controllers, a controller and an operator) stay
        consistent: the loser's commit returns False and it re-reads.
        """
        tx = self._client.transactions
        compare = [tx.value(k) == v for k, v in (expect_value or {}).items()]
        compare += [tx.mod(k) == rev for k, rev in (expect_revision or {}).items()]
        success = [tx.put(k, v if isinstance(v, str) else v.dumps()) for k, v in puts.items()]
        success += [tx.delete(k) for k in deletes or []]
        with _translate_errors(self.endpoint):
            ok, _ = self._client.transaction(compare=compare, success=success, failure=[])
        return bool(ok)

    # -- watches -------------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, callback: Callable[[str, bytes | None], None]) -> int:
        """Call callback(key, value) for every change under prefix; value is None for a delete."""

        def on_response(response: object) -> None:
            events = getattr(response, "events", None)
            if events is None:  # a watch error (e.g. the server went away): nothing to deliver
                return
            for event in events:
                if isinstance(event, PutEvent):
                    callback(event.key.decode(), event.value)
                elif isinstance(event, DeleteEvent):
                    callback(event.key.decode(), None)

        with _translate_errors(self.endpoint):
            watch_id = self._client.add_watch_prefix_callback(prefix, on_response)
        self._watches.append(watch_id)
        return watch_id

    def ping(self) -> None:
        with _translate_errors(self.endpoint):
            self._client.status()

    def close(self) -> None:
        for watch_id in self._watches:
            try:
                self._client.cancel_watch(watch_id)
            except Exception:  # the server may be gone already; closing must not fail
                pass
        self._watches.clear()
        self._client.close()
