"""A data-plane channel's server: threaded TCP, one authenticated connection per client.

The first message of a connection is a Hello naming the channel and carrying the job's data-plane
token; anything else, or a wrong token, closes the connection. Then each request gets one reply. A
bad request gets an ErrorReply and the connection stays; a closed connection tells the channel (the
relay gives the client's leases back).
"""

from __future__ import annotations

import hmac
import itertools
import socket
import socketserver
import threading
from collections.abc import Callable

from pydantic import BaseModel, ValidationError

from stalwart.logs import ContextLogger, get_logger
from stalwart.rlhf import wire
from stalwart.rlhf.messages import REQUESTS, ErrorReply, Hello, Message

Handler = Callable[[str, Message, bytes], tuple[BaseModel, bytes]]


class RequestRefused(ValueError):
    """A handler refuses a request; the client gets the message as an ErrorReply."""


class _TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128


class ChannelServer:
    def __init__(
        self,
        channel: str,
        handle: Handler,
        *,
        token: str = "",
        host: str = "127.0.0.1",
        port: int = 0,
        on_disconnect: Callable[[str], None] | None = None,
        log: ContextLogger | None = None,
    ) -> None:
        self.channel = channel
        self._handle = handle
        self._token = token
        self._on_disconnect = on_disconnect
        self.log = log or get_logger("stalwart.rlhf.server", channel=channel)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._clients: dict[str, socket.socket] = {}
        outer = self

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request, self.client_address)

        self._server = _TCPServer((host, port), _Handler)
        self._thread: threading.Thread | None = None

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def clients(self) -> list[str]:
        with self._lock:
            return list(self._clients)

    def start(self) -> ChannelServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name=f"{self.channel}-server", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            clients = list(self._clients.values())
        for sock in clients:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- one connection ------------------------------------------------------------------------------
    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = self._greet(sock, peer)
        except (ConnectionError, OSError, ValidationError, RequestRefused) as exc:
            self.log.warning("connection refused", fields={"peer": f"{peer[0]}:{peer[1]}", "why": str(exc)[:200]})
            return
        client = f"{hello.client}#{next(self._ids)}"
        with self._lock:
            self._clients[client] = sock
        try:
            while True:
                header, payload = wire.recv(sock)
                reply, out = self._dispatch(client, header, payload)
                wire.send(sock, reply.model_dump(mode="json"), out)
        except (ConnectionError, OSError):
            pass  # the client went away; its leases go back below
        finally:
            with self._lock:
                self._clients.pop(client, None)
            if self._on_disconnect is not None:
                self._on_disconnect(client)

    def _greet(self, sock: socket.socket, peer: tuple[str, int]) -> Hello:
        header, _ = wire.recv(sock)
        hello = Hello.model_validate(header)
        if hello.channel != self.channel:
            wire.send(
                sock, ErrorReply(error=f"this is the {self.channel!r} channel, not {hello.channel!r}").model_dump()
            )
            raise RequestRefused(f"{hello.client} asked for channel {hello.channel!r}")
        if not hmac.compare_digest(hello.token.encode(), self._token.encode()):
            wire.send(sock, ErrorReply(error="wrong data-plane token").model_dump())
            raise RequestRefused(f"{hello.client} sent a wrong token")
        wire.send(sock, {"ok": True})
        return hello

    def _dispatch(self, client: str, header: dict[str, object], payload: bytes) -> tuple[BaseModel, bytes]:
        op = header.get("op")
        model = REQUESTS.get(op) if isinstance(op, str) else None
        if model is None or model is Hello:
            return ErrorReply(error=f"unknown request {op!r} on the {self.channel!r} channel"), b""
        try:
            return self._handle(client, model.model_validate(header), payload)
        except ValidationError as exc:
            return ErrorReply(error=f"bad {op} request: {exc}"), b""
        except (RequestRefused, ValueError) as exc:
            return ErrorReply(error=str(exc)), b""
