"""A client's connection to one data-plane channel, re-found through etcd whenever it breaks.

Every request is safe to send again (see relay.py), so a broken connection is simply re-made, with
whatever server the channel's key names by then, and the request retried. A client waits for the
channel's server at most `give_up_after` seconds per call, then fails with a message saying what it
waited for: a role that cannot reach its peers must end, so its supervisor sees it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from stalwart.logs import ContextLogger, get_logger
from stalwart.rlhf import wire
from stalwart.rlhf.endpoints import DataPlaneEndpoint, EndpointDirectory
from stalwart.rlhf.messages import Hello, Message
from stalwart.store.client import StoreUnavailable

REPLY_MARGIN = 30.0  # seconds a reply may take beyond the request's own wait before the server counts as hung
HELLO_REPLY = wire.Limits(header=4096, payload=0)  # {"ok": true} or an ErrorReply


class DataPlaneUnavailable(RuntimeError):
    """The channel's server did not answer within the give-up time."""


class RemoteError(RuntimeError):
    """The server refused the request; its message says why."""


class ChannelFinished(RuntimeError):
    """The channel's server marked its work over (the actor finished): nothing more will come."""


class Connection:
    def __init__(
        self,
        directory: EndpointDirectory,
        channel: str,
        client: str,
        *,
        token: str = "",
        give_up_after: float = 600.0,
        on_connect: Callable[[Connection], None] | None = None,
        log: ContextLogger | None = None,
    ) -> None:
        self.directory = directory
        self.channel = channel
        self.client = client
        self._token = token
        self.give_up_after = give_up_after
        self._on_connect = on_connect
        self.log = log or get_logger("stalwart.rlhf.client", channel=channel, client=client)
        self._sock: socket.socket | None = None
        self.endpoint: DataPlaneEndpoint | None = None
        self.reconnects = 0

    def call(
        self,
        request: Message,
        payload: bytes = b"",
        *,
        wait: float = 0.0,
        patience: float | None = None,
        reply: wire.Limits = wire.REPLY,
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request and return the reply's header and payload (RemoteError if refused).

        `patience` bounds how long this call waits for a server (default: give_up_after); `reply` is
        what the reply may hold (default: JSON, no payload)."""
        patience = self.give_up_after if patience is None else patience
        failing_since: float | None = None
        while True:
            sock = self._sock or self._connect(patience)
            try:
                sock.settimeout(wait + REPLY_MARGIN)
                wire.send(sock, request.model_dump(mode="json"), payload)
                header, data = wire.recv(sock, reply)
            except wire.MessageTooLarge as exc:
                self._drop()  # the reply is beyond what this request allows: asking again would not change it
                raise RemoteError(f"{self.channel}: {exc}") from None
            except (ConnectionError, OSError) as exc:
                self._drop()
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > patience:
                    raise DataPlaneUnavailable(
                        f"the {self.channel} channel of job {self.directory.job} kept failing for "
                        f"{patience:.0f}s: {exc}"
                    ) from None
                self.log.warning("data-plane connection lost", fields={"error": str(exc)[:200]})
                continue
            if "error" in header:
                raise RemoteError(f"{self.channel}: {header['error']}")
            return header, data

    def close(self) -> None:
        self._drop()

    # -- connecting -----------------------------------------------------------------------------------
    def _connect(self, patience: float) -> socket.socket:
        start = time.monotonic()
        delay = 0.05
        last = "no endpoint published yet"
        while True:
            try:
                endpoint = self.directory.lookup(self.channel)
            except StoreUnavailable as exc:
                endpoint, last = None, str(exc)
            if endpoint is not None and endpoint.finished:
                raise ChannelFinished(f"the {self.channel} channel of job {self.directory.job} has finished")
            if endpoint is not None:
                try:
                    sock = self._open(endpoint)
                except RemoteError:
                    raise
                except (ConnectionError, OSError) as exc:
                    last = f"{endpoint.target}: {exc}"
                else:
                    self._sock, self.endpoint = sock, endpoint
                    self.reconnects += 1
                    self.log.info(
                        "data-plane connected",
                        fields={"endpoint": endpoint.target, "incarnation": endpoint.incarnation},
                    )
                    if self._on_connect is not None:
                        self._on_connect(self)
                    return self._sock
            if time.monotonic() - start >= patience:
                raise DataPlaneUnavailable(
                    f"no {self.channel} server of job {self.directory.job} answered for {patience:.0f}s (last: {last})"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _open(self, endpoint: DataPlaneEndpoint) -> socket.socket:
        sock = socket.create_connection((endpoint.address, endpoint.port), timeout=REPLY_MARGIN)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.send(sock, Hello(client=self.client, channel=self.channel, token=self._token).model_dump())
            header, _ = wire.recv(sock, HELLO_REPLY)
        except BaseException:
            sock.close()
            raise
        if "error" in header:
            sock.close()
            raise RemoteError(f"{self.channel} at {endpoint.target} refused us: {header['error']}")
        return sock

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
