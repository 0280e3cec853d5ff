"""The etcd-backed store: typed records, leases, watches and compare-and-swap transactions."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd import utils as etcd_utils
from pyetcd import watch as etcd_watch

from stalwart.store.etcd_auth import PLAIN, EtcdAuth
from stalwart.store.keepalive import KeepAliveFailed, KeepAliveStream
from stalwart.store.prefix_watch import Changes, PrefixWatch, Resync, Watches
from stalwart.store.records import Record

R = TypeVar("R", bound=Record)
T = TypeVar("T")

# Prefix reads come in pages of at most this many keys, all at the first page's revision (one
# consistent snapshot). A page whose reply would pass the client's 4 MiB limit is asked for again
# at half the size, so a prefix of any size is read whatever its records weigh.
PAGE_KEYS = 1000
MIN_PAGE_KEYS = 1
# etcd refuses a transaction with more operations than this (--max-txn-ops, 128 by default).
MAX_TXN_OPS = 128


_COMPACTED = object()  # a page asked at a revision etcd has compacted since


class ReplyTooLarge(RuntimeError):
    """One key's value alone is over the client's reply limit: no page can carry it."""


class StoreUnavailable(RuntimeError):
    """etcd did not answer; the message says where we tried."""


class StoreAccessDenied(StoreUnavailable):
    """etcd answered but refused us: no credentials, wrong ones, or too few rights. A subclass of
    StoreUnavailable, so whoever rides out an unreachable etcd stops the same way, with this message."""


class LeaseLost(RuntimeError):
    """Our lease expired: whatever we held under it (a node, a leadership) is gone."""


def _status(exc: BaseException) -> tuple[grpc.StatusCode | None, str]:
    """The gRPC status behind an error (pyetcd replaces UNAVAILABLE by its own exception, whose
    context still holds the RpcError with the reason: refused, a failed TLS handshake, ...)."""
    for candidate in (exc, exc.__context__):
        if isinstance(candidate, grpc.RpcError) and hasattr(candidate, "code"):
            details = candidate.details() if hasattr(candidate, "details") else ""
            return candidate.code(), str(details or "")
    return None, ""


def _refusal(endpoint: str, auth: EtcdAuth, code: grpc.StatusCode | None, details: str) -> StoreAccessDenied | None:
    """etcd's auth errors as one line that says what to change (None: not an auth error)."""
    if auth.user:
        who = f"user {auth.user}"
    elif auth.cert is not None:
        who = f"the certificate {auth.cert}"
    else:
        who = "a client without credentials"
    if "user name is empty" in details or (code == grpc.StatusCode.UNAUTHENTICATED and not auth.user):
        return StoreAccessDenied(
            f"etcd at {endpoint} wants credentials and took none from us ({auth.describe()}): give a user "
            "(STALWART_ETCD_USER and _PASSWORD) or, where etcd checks client certificates, a certificate "
            "(STALWART_ETCD_CERT and _KEY)"
        )
    if "authentication failed" in details:
        return StoreAccessDenied(f"etcd at {endpoint} refused {who}: wrong user name or password")
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        return StoreAccessDenied(f"etcd at {endpoint} refused {who}: {details}")
    return None


@contextmanager
def _translate_errors(endpoint: str, auth: EtcdAuth = PLAIN) -> Iterator[None]:
    try:
        yield
    except grpc.RpcError as exc:
        code, details = _status(exc)
        refused = _refusal(endpoint, auth, code, details)
        if refused is not None:
            raise refused from None
        raise StoreUnavailable(f"etcd at {endpoint} did not answer ({code}): {details or exc}") from None
    except pyetcd.exceptions.ConnectionFailedError as exc:
        _, details = _status(exc)
        reason = f" ({auth.describe()}): {details}" if details else ""
        raise StoreUnavailable(f"cannot reach etcd at {endpoint}{reason}") from None
    except pyetcd.exceptions.ConnectionTimeoutError:
        raise StoreUnavailable(f"etcd at {endpoint} timed out") from None
    except pyetcd.exceptions.Etcd3Exception as exc:
        raise StoreUnavailable(f"etcd at {endpoint} failed: {type(exc).__name__} {exc}") from None


class _Token(grpc.AuthMetadataPlugin):  # type: ignore[misc]  # grpc ships no types
    """The etcd auth token, sent with every call; replaced when we log in again."""

    def __init__(self) -> None:
        self.value: str | None = None

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("token", self.value),) if self.value else (), None)


class Lease:
    """A lease, renewed over one long-lived keep-alive stream (store/keepalive.py)."""

    def __init__(self, store: Store, inner: pyetcd.Lease) -> None:
        self._store = store
        self._inner = inner
        self._keepalive = KeepAliveStream(store._client, int(inner.id), store.timeout)
        store._leases.add(self)

    @property
    def id(self) -> int:
        return int(self._inner.id)

    @property
    def streams_opened(self) -> int:
        """Keep-alive streams opened for this lease: 1 while none broke."""
        return self._keepalive.opened

    def refresh(self) -> None:
        """Renew the lease; raises LeaseLost if it already expired (etcd answers TTL 0), and
        StoreUnavailable if etcd did not answer."""
        try:
            ttl = self._store._call(self._keepalive.keep_alive)
        except KeepAliveFailed as exc:
            raise StoreUnavailable(f"etcd at {self._store.endpoint} did not renew lease {self.id:x}: {exc}") from None
        if ttl <= 0:
            self.close()
            raise LeaseLost(f"lease {self.id:x} has expired")

    def revoke(self) -> None:
        self.close()
        self._store._call(self._inner.revoke)

    def close(self) -> None:
        """Close its keep-alive stream (the lease is lost, revoked, or given up)."""
        self._keepalive.close()
        self._store._leases.discard(self)


# etcd sends a watcher that fell behind (a resumed watch, a slow reader) up to 1,000 revisions in one
# response: 1,000 heartbeats of 5 KB pass the 4 MiB that a reply may otherwise be, and a watch that
# cannot take its batch breaks and resumes from the same revision, forever (seen at 10,000 nodes).
# Watches get a channel of their own with this limit; reads keep 4 MiB and are paged.
WATCH_REPLY_BYTES = 256 << 20


class _Client(pyetcd.MultiEndpointEtcd3Client):  # type: ignore[misc]  # pyetcd ships no types
    """pyetcd's client, with its watches on a channel of their own that takes large batches."""

    def __init__(self, watch_channel: Callable[[], grpc.Channel], **kwargs: Any) -> None:
        self._watch_channel_factory = watch_channel
        self._watch_channel: grpc.Channel | None = None
        super().__init__(**kwargs)

    def get_watcher(self) -> Any:
        if self._watch_channel is None:
            self._watch_channel = self._watch_channel_factory()
        return etcd_watch.Watcher(
            etcdrpc.WatchStub(self._watch_channel),
            timeout=self.timeout,
            call_credentials=self.call_credentials,
            metadata=self.metadata,
        )

    def close(self) -> None:
        super().close()
        if self._watch_channel is not None:
            self._watch_channel.close()
            self._watch_channel = None


class Store:
    """A thin, typed face on an etcd client. One per process; safe to share between threads."""

    def __init__(self, endpoint: str, timeout: float = 5.0, auth: EtcdAuth | None = None) -> None:
        """`auth`: how we prove ourselves to etcd; None reads STALWART_ETCD_* (etcd_auth.py), so a
        process started with those variables (an agent in a pod) needs no flag of its own. Nothing
        is sent here: an etcd that is down now is met at the first call, not at construction."""
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"etcd endpoint must be HOST:PORT, got {endpoint!r}")
        self.endpoint = endpoint
        self.timeout = timeout
        self.auth = EtcdAuth.from_env() if auth is None else auth
        if self.auth.tls:
            files = self.auth.channel_files()
            credentials = grpc.ssl_channel_credentials(files["CA"], files.get("key"), files.get("certificate"))
            channel = pyetcd.Endpoint(host, int(port), secure=True, creds=credentials)
        else:
            channel = pyetcd.Endpoint(host, int(port), secure=False)
        # The client benches an endpoint for 5 minutes after one failed call; with a single etcd
        # endpoint that turns a blip into an outage. Retry it at once instead.
        channel.time_retry = 0.0
        options = [("grpc.max_receive_message_length", WATCH_REPLY_BYTES)]

        def watch_channel() -> grpc.Channel:
            if self.auth.tls:
                return grpc.secure_channel(f"{host}:{port}", credentials, options=options)
            return grpc.insecure_channel(f"{host}:{port}", options=options)

        self._client = _Client(watch_channel, endpoints=[channel], timeout=timeout)
        # etcd users: we log in ourselves (pyetcd would once, in its constructor, and keep that token
        # for good), so a token that lapsed (etcd restarted, or its TTL passed) is renewed by logging
        # in again. It travels as call credentials, which gRPC sends over TLS only.
        self._token = _Token()
        self._login_lock = threading.Lock()
        if self.auth.user:
            self._client.call_credentials = grpc.metadata_call_credentials(self._token)
        self._watches = Watches(self)
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()  # their keep-alive streams close with the store

    def _login(self, stale: str | None) -> None:
        with self._login_lock:
            if self._token.value != stale:  # another thread logged in meanwhile
                return
            request = pyetcd.etcdrpc.AuthenticateRequest(name=self.auth.user, password=self.auth.read_password())
            try:
                response = self._client.authstub.Authenticate(request, self._client.timeout)
            except grpc.RpcError as exc:
                code, details = _status(exc)
                if code == grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in details:
                    self._token.value = ""  # this etcd has auth off: there is no token to send
                    return
                raise
            self._token.value = response.token

    def _call(self, fn: Callable[[], T]) -> T:
        """One etcd call, its errors translated; with an etcd user, logged in first, and once more
        when etcd says our token is no longer valid."""
        with _translate_errors(self.endpoint, self.auth):
            if not self.auth.user:
                return fn()
            if self._token.value is None:
                self._login(None)
            try:
                return fn()
            except grpc.RpcError as exc:
                if _status(exc)[0] != grpc.StatusCode.UNAUTHENTICATED:
                    raise
                self._login(self._token.value)
            return fn()

    # -- plain values ------------------------------------------------------------------------
    def get_raw(self, key: str) -> bytes | None:
        value: bytes | None
        value, _ = self._call(lambda: self._client.get(key))
        return value

    def get(self, key: str, cls: type[R]) -> R | None:
        raw = self.get_raw(key)
        return None if raw is None else cls.loads(raw)

    def get_with_revision(self, key: str, cls: type[R]) -> tuple[R | None, int]:
        """The record and its mod revision (0 when absent), for compare-and-swap."""
        value, meta = self._call(lambda: self._client.get(key))
        if value is None:
            return None, 0
        return cls.loads(value), int(meta.mod_revision)

    def get_prefix_raw(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every key under `prefix` with its value, in key order, read in pages (one snapshot)."""
        return self.read_prefix(prefix)[0]

    def read_prefix(self, prefix: str, *, keys_only: bool = False) -> tuple[list[tuple[str, bytes]], int]:
        """Every key under `prefix` (with its value unless `keys_only`) and the revision they were
        read at, in pages of at most PAGE_KEYS keys that each stay under the client's reply limit.
        A watch started from that revision + 1 misses nothing (prefix_mirror.py)."""
        end = etcd_utils.prefix_range_end(etcd_utils.to_bytes(prefix))
        start, revision, page = etcd_utils.to_bytes(prefix), 0, PAGE_KEYS
        out: list[tuple[str, bytes]] = []
        while True:
            response = self._call(partial(self._range_page, start, end, page, revision, keys_only))
            if response is _COMPACTED:  # etcd compacted the snapshot away between two pages: again
                start, revision, out = etcd_utils.to_bytes(prefix), 0, []
                continue
            if response is None:  # the page's reply would pass the client's limit: ask for less
                if page <= MIN_PAGE_KEYS:
                    raise ReplyTooLarge(f"a value under {prefix} is over the client's reply limit")
                page = max(MIN_PAGE_KEYS, page // 2)
                continue
            revision = revision or int(response.header.revision)
            out.extend((kv.key.decode(), kv.value) for kv in response.kvs)
            if not response.more or not response.kvs:
                return out, revision
            start = response.kvs[-1].key + b"\0"

    def _range_page(self, start: bytes, end: bytes, limit: int, revision: int, keys_only: bool) -> Any:
        """One Range; None when its reply is over the client's receive limit."""
        try:
            return self._client.get_range_response(
                start, end, limit=limit, revision=revision or None, keys_only=keys_only
            )
        except grpc.RpcError as exc:
            code = _status(exc)[0]
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return None
            if code == grpc.StatusCode.OUT_OF_RANGE and revision:
                return _COMPACTED
            raise

    def list_keys(self, prefix: str) -> list[str]:
        """The keys under a prefix, without their values (cheap on prefixes holding big records)."""
        return [key for key, _ in self.read_prefix(prefix, keys_only=True)[0]]

    def first_key(self, start: str, end: str) -> str | None:
        """The first key in [start, end), or None: one small Range, whatever the range holds."""
        response = self._call(lambda: self._client.get_range_response(start, end, limit=1, keys_only=True))
        return response.kvs[0].key.decode() if response.kvs else None

    def get_prefix(self, prefix: str, cls: type[R]) -> list[R]:
        return [cls.loads(v) for _, v in self.get_prefix_raw(prefix)]

    def put(self, key: str, value: Record | str, lease: Lease | None = None) -> int:
        """Returns the revision the put created (the key's mod revision)."""
        data = value if isinstance(value, str) else value.dumps()
        response = self._call(lambda: self._client.put(key, data, lease=lease.id if lease else None))
        return int(response.header.revision)

    def delete(self, key: str) -> None:
        self._call(lambda: self._client.delete(key))

    def delete_prefix(self, prefix: str) -> None:
        self._call(lambda: self._client.delete_prefix(prefix))

    # -- leases and transactions ---------------------------------------------------------------
    def lease(self, ttl: int) -> Lease:
        return Lease(self, self._call(lambda: self._client.lease(ttl)))

    def revoke_lease(self, lease_id: int) -> None:
        """Revoke someone else's lease (fencing a node that stopped answering): its keys vanish
        now, and its holder's next renewal fails, so it stops acting for the job."""
        self._call(lambda: self._client.revoke_lease(lease_id))

    def create(self, key: str, value: Record | str, lease: Lease | None = None) -> bool:
        """Put only if the key does not exist. True if we created it."""
        data = value if isinstance(value, str) else value.dumps()
        tx = self._client.transactions
        ok, _ = self._call(
            lambda: self._client.transaction(
                compare=[tx.version(key) == 0],
                success=[tx.put(key, data, lease=lease.id if lease else None)],
                failure=[],
            )
        )
        return bool(ok)

    def put_batch(self, puts: dict[str, Record | str]) -> int:
        """Up to MAX_TXN_OPS keys in one unconditional transaction; returns its revision."""
        if not 0 < len(puts) <= MAX_TXN_OPS:
            raise ValueError(f"a batch holds 1 to {MAX_TXN_OPS} puts, got {len(puts)}")
        tx = self._client.transactions
        success = [tx.put(k, v if isinstance(v, str) else v.dumps()) for k, v in puts.items()]
        _, responses = self._call(lambda: self._client.transaction(compare=[], success=success, failure=[]))
        return int(responses[0].response_put.header.revision)

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
        ok, _ = self._call(lambda: self._client.transaction(compare=compare, success=success, failure=[]))
        return bool(ok)

    # -- watches -------------------------------------------------------------------------------
    def watch_prefix(self, prefix: str, callback: Callable[[str, bytes | None], None]) -> PrefixWatch:
        """Call callback(key, value) for every change under prefix; value is None for a delete. The
        watch outlives etcd restarts and pauses, and misses no change meanwhile (prefix_watch.py)."""
        return self._watches.add(prefix, lambda key, value, _revision: callback(key, value))

    def watch_prefix_from(self, prefix: str, callback: Changes, resync: Resync) -> PrefixWatch:
        """A watch that starts from `resync()`'s revision (a read of the whole prefix) and reads it
        again through `resync` when etcd compacted the changes it missed; callback(key, value,
        mod_revision) for every change. What prefix_mirror.PrefixMirror is built on."""
        return self._watches.add(prefix, callback, resync)

    def ping(self) -> None:
        self._call(self._client.status)

    def auth_service(self) -> Any:
        """etcd's Auth service (users, roles, turning auth on), raw gRPC, for setup and tests."""
        return self._client.authstub

    def close(self) -> None:
        self._watches.close()
        for lease in list(self._leases):
            lease.close()
        self._client.close()
