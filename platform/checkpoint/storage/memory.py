"""Host memory on this node, with a copy on a peer node: one lost node never loses both copies.

Writes go to the local node's memory store and to the peer's; reads prefer the local one and fall
back to the peer when the local store is gone (the node was lost) or lacks the object, then to the
job's other nodes (`nodes`): a standby that took a lost node's ranks holds none of their bytes, but
the lost node's peer does.

Every request carries the job's token (STALWART_CHECKPOINT_TOKEN unless one is given).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading

from stalwart.checkpoint.memory_auth import TOKEN_ENV, auth_headers, token_from_env
from stalwart.checkpoint.storage.base import ObjectWriter, Storage, StorageError

log = logging.getLogger("stalwart.checkpoint")

CHUNK = 32 << 20  # small writes are gathered up to this before a PUT
DIRECT = 1 << 20  # a write this large is sent as it is, without a copy
PUT_MAX = 64 << 20  # the largest body of one PUT


class StoreRefused(StorageError):
    """The store turned the caller away (its token): a configuration error, never a lost node."""


class _Endpoint:
    def __init__(self, address: str, namespace: str, token: str | None) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.host, self.port = host, int(port)
        self.namespace = namespace.strip("/")
        self._local = threading.local()
        self._auth = auth_headers(token)

    def request(
        self, method: str, path: str, body: bytes | memoryview | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """One request on this thread's kept-alive connection (a load makes hundreds of small
        ranged reads: a connection each would cost more than the bytes); a stale one is retried."""
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            try:
                if conn is None:
                    conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # see memory_server
                conn.request(method, path, body=body, headers={**self._auth, **(headers or {})})
                resp = conn.getresponse()
                status, data = resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                if conn is not None:
                    conn.close()
                self._local.conn = None
                if attempt or isinstance(exc, ConnectionRefusedError):
                    if body is not None and not isinstance(exc, ConnectionRefusedError):
                        self.request("GET", "/dirs?prefix=/")  # a refused body closes the connection: was it the token?
                    raise StorageError(f"memory store {self.address} unreachable: {exc}") from exc
                continue
            if status in (401, 403):
                how = "no token" if not self._auth else "a token it does not accept"
                raise StoreRefused(
                    f"memory store {self.address} refused {method} with {how} (HTTP {status}): "
                    f"the job's token is in {TOKEN_ENV}"
                )
            return status, data
        raise AssertionError("unreachable")

    def obj(self, path: str) -> str:
        return f"/o/{self.namespace}/{path}" if self.namespace else f"/o/{path}"


class _TeeWriter(ObjectWriter):
    def __init__(self, storage: MemoryStorage, path: str) -> None:
        self.s = storage
        self.path = path
        self.pos = 0
        self.buf = bytearray()
        self.flushed = 0

    def _put(self, body: memoryview) -> None:
        for ep in self.s.endpoints:
            code, answer = ep.request("PUT", ep.obj(self.path), body, {"X-Offset": str(self.flushed)})
            if code != 200:
                raise StorageError(
                    f"memory store {ep.address}: PUT {self.path} answered {code} {answer.decode(errors='replace')}"
                )
        self.s._count_written(len(body))
        self.flushed += len(body)

    def _flush(self) -> None:
        if not self.buf and self.flushed:
            return
        self._put(memoryview(self.buf))
        self.buf.clear()

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        if len(view) >= DIRECT:  # a tensor's bytes: straight from the staging buffer
            self._flush()
            for i in range(0, len(view), PUT_MAX):
                self._put(view[i : i + PUT_MAX])
        else:
            self.buf += view
            if len(self.buf) >= CHUNK:
                self._flush()
        self.pos += len(view)
        return len(view)

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        self._flush()

    def abort(self) -> None:
        self.buf.clear()


class MemoryStorage(Storage):
    tier_rank = 10
    name = "memory"
    coalesce_gap = 1 << 20  # a request through Python's HTTP stack costs about as much as copying 1 MiB

    def __init__(
        self,
        local: str,
        peer: str | None,
        namespace: str,
        nodes: list[str] | None = None,
        *,
        token: str | None = None,
    ) -> None:
        super().__init__()
        token = token or token_from_env()
        self.endpoints = [_Endpoint(local, namespace, token)] + ([_Endpoint(peer, namespace, token)] if peer else [])
        written = {local, peer}
        self.readers = self.endpoints + [_Endpoint(n, namespace, token) for n in nodes or [] if n not in written]
        self.namespace = namespace
        self._holders: dict[str, _Endpoint] = {}
        self._down: set[str] = set()

    def _order(self, path: str) -> list[_Endpoint]:
        """The store that last answered for this object (else its folder) first; stores that did
        not answer at all last."""
        with self._lock:
            holder = self._holders.get(path) or self._holders.get(path.rpartition("/")[0])
            down = set(self._down)
        first = [ep for ep in self.readers if ep is holder]
        return (
            first
            + [ep for ep in self.readers if ep is not holder and ep.address not in down]
            + [ep for ep in self.readers if ep is not holder and ep.address in down]
        )

    def _first(self, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """Ask the local store, then the peer, then the other nodes; the first that has it answers.

        A load after a node loss asks for hundreds of ranges, mostly held by the lost node's peer:
        the store that answered for an object is asked first next time, and a store that did not
        answer at all (its node is gone; on a real network its address may hang until a timeout)
        is asked last."""
        last: tuple[int, bytes] = (404, b"")
        errors = []
        for ep in self._order(path):
            try:
                code, body = ep.request(method, path if path.startswith("/dirs") else ep.obj(path), headers=headers)
            except StoreRefused:
                raise
            except StorageError as exc:
                errors.append(str(exc))
                with self._lock:
                    self._down.add(ep.address)
                continue
            with self._lock:
                self._down.discard(ep.address)
            if code in (200, 206):
                with self._lock:
                    self._holders[path] = self._holders[path.rpartition("/")[0]] = ep
                return code, body
            last = (code, body)
        if errors and last[0] == 404 and len(errors) == len(self.readers):
            raise StorageError("; ".join(errors))
        return last

    def open_writer(self, path: str) -> ObjectWriter:
        return _TeeWriter(self, path)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        code, body = self._first("GET", path, {"Range": f"bytes={offset}-{offset + length - 1}"})
        if code not in (200, 206) or len(body) != length:
            raise StorageError(f"memory:{path}: bytes {offset}..{offset + length} not available (HTTP {code})")
        self._count_read(length)
        return body

    def write_bytes(self, path: str, data: bytes) -> None:
        w = self.open_writer(path)
        w.write(data)
        w.close()

    def read_bytes(self, path: str) -> bytes | None:
        code, body = self._first("GET", path)
        if code not in (200, 206):
            return None
        self._count_read(len(body))
        return body

    def list_dirs(self) -> list[str]:
        prefix = f"{self.namespace.strip('/')}/" if self.namespace.strip("/") else ""
        names: set[str] = set()
        for ep in self.readers:
            try:
                code, body = ep.request("GET", f"/dirs?prefix={prefix}")
            except StoreRefused:
                raise
            except StorageError:
                continue  # a lost node: its peer still answers
            if code == 200:
                try:
                    listed = json.loads(body)
                except ValueError:
                    listed = None
                if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
                    # Not a memory store's answer (another program on that port): as if the node were lost.
                    log.warning("not a memory store's answer", extra={"context": {"store": ep.address}})
                    continue
                names.update(listed)
        return sorted(names)

    def delete_dir(self, name: str) -> None:
        for ep in self.endpoints:
            try:
                ep.request("DELETE", f"/dirs/{ep.namespace + '/' if ep.namespace else ''}{name}")
            except StorageError:
                pass
