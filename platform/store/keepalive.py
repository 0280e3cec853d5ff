"""One lease's long-lived LeaseKeepAlive stream: a keep-alive is one message on an open stream.

The client's `Lease.refresh` opens a new bidirectional stream for every renewal (stream set-up,
one message, teardown): at 10,000 agents renewing every second that is 10,000 streams a second for
etcd and most of each agent's etcd CPU. Here the lease keeps one stream open and sends a
`LeaseKeepAliveRequest` on it per renewal; etcd answers each with the lease's new TTL (0: the lease
is gone). A stream that broke (etcd restarted, a connection dropped) or that did not answer within
the client's deadline (etcd paused) is closed and a new one opened at the next renewal, so a renewal
never waits on a dead stream for longer than one deadline.

Errors come out as the client's: `grpc.RpcError` (the store translates it, and logs in again when
etcd says the token lapsed) or `KeepAliveFailed` for a renewal that got no answer in time (the
store's lease turns it into StoreUnavailable).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import grpc
from pyetcd.etcdrpc import rpc_pb2 as pb

_CLOSE = None  # ends the request iterator: gRPC then half-closes the stream


class KeepAliveFailed(RuntimeError):
    """etcd did not answer a renewal within the deadline, or closed the stream."""


class _Stream:
    """One opened LeaseKeepAlive call: its requests go in a queue, a thread reads its replies."""

    def __init__(self, stub: Any, credentials: Any, metadata: Any) -> None:
        self.requests: queue.Queue[pb.LeaseKeepAliveRequest | None] = queue.Queue()
        self.replies: queue.Queue[pb.LeaseKeepAliveResponse | BaseException] = queue.Queue()
        # No deadline: the stream lives as long as the lease; each renewal has its own (`keep_alive`).
        self.call = stub.LeaseKeepAlive(iter(self.requests.get, _CLOSE), credentials=credentials, metadata=metadata)
        self.thread = threading.Thread(target=self._read, name="lease-keepalive", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for reply in self.call:
                self.replies.put(reply)
            self.replies.put(EOFError("etcd closed the keep-alive stream"))
        except grpc.RpcError as exc:
            self.replies.put(exc)

    def close(self) -> None:
        self.requests.put(_CLOSE)
        self.call.cancel()


class KeepAliveStream:
    """Renews one lease over one stream, opened at the first renewal and again after a failure."""

    def __init__(self, client: Any, lease_id: int, timeout: float) -> None:
        """`client`: the pyetcd client whose channel, credentials and token metadata the stream uses."""
        self._client = client
        self.lease_id = lease_id
        self.timeout = timeout
        self._stream: _Stream | None = None
        self._lock = threading.Lock()  # one renewal at a time: replies are matched in order
        self.opened = 0  # streams opened so far (1 while nothing broke)

    def keep_alive(self) -> int:
        """Renew the lease; returns the TTL etcd granted (0: the lease expired or was revoked).
        A stream that broke since the last renewal is replaced and the renewal sent again on the new
        one. Raises grpc.RpcError when a new stream breaks too, KeepAliveFailed when etcd did not
        answer in time or closed it; either way the stream is closed and the next call opens another."""
        with self._lock:
            fresh = self._stream is None
            stream = self._open()
            reply = self._send(stream)
            if isinstance(reply, BaseException) and not fresh:
                stream = self._open()  # it broke while idle (etcd restarted, a connection dropped)
                reply = self._send(stream)
            if isinstance(reply, EOFError):
                raise KeepAliveFailed(str(reply))
            if isinstance(reply, BaseException):
                raise reply
            return int(reply.TTL)

    def _open(self) -> _Stream:
        if self._stream is None:
            client = self._client
            self._stream = _Stream(client.leasestub, client.call_credentials, client.metadata)
            self.opened += 1
        return self._stream

    def _send(self, stream: _Stream) -> pb.LeaseKeepAliveResponse | BaseException:
        """One renewal on `stream`: its reply, or why there is none (the stream is then dropped)."""
        stream.requests.put(pb.LeaseKeepAliveRequest(ID=self.lease_id))
        try:
            reply = stream.replies.get(timeout=self.timeout)
        except queue.Empty:
            self._drop(stream)
            raise KeepAliveFailed(f"no keep-alive answer within {self.timeout:g}s") from None
        if isinstance(reply, BaseException):
            self._drop(stream)
        return reply

    def _drop(self, stream: _Stream) -> None:
        stream.close()
        if self._stream is stream:
            self._stream = None

    def close(self) -> None:
        """Close the stream (the lease is revoked, lost, or no longer ours); renewing opens another."""
        with self._lock:
            if self._stream is not None:
                self._drop(self._stream)
