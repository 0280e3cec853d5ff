"""A data-plane channel's server: threaded TCP, one authenticated connection per client.

The first message of a connection is a Hello naming the channel and carrying the job's data-plane
token, read under `wire.HELLO` (a few KiB, no payload, a short deadline); anything else, a wrong
token or silence closes the connection. Then each request gets one reply. A request that fails
validation gets an ErrorReply and the connection stays; one that breaks the framing (too large for
a request, which carries no payload, or not JSON) gets an ErrorReply and the connection closes: the
stream can no longer be trusted, and only that client is affected. A closed connection tells the
channel (the relay gives the client's leases back).

Connections are capped before any thread starts for them: at most `max_greeting` waiting for their
Hello and `max_connections` in all; one over either cap is closed at once (a client retries).
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


MAX_CONNECTIONS = 1024  # per server: every rank of every role that talks to it, with room to spare
MAX_GREETING = 64  # connections not yet authenticated, per server


class _TCPServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], handler: type[socketserver.BaseRequestHandler], admit: Callable[[], bool]
    ):
        self._admit = admit
        super().__init__(address, handler)

    def verify_request(self, request: object, client_address: object) -> bool:
        """Refused here, a connection never gets a thread (the caller closes it)."""
        return self._admit()


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
        max_connections: int = MAX_CONNECTIONS,
        max_greeting: int = MAX_GREETING,
        greeting: wire.Limits = wire.HELLO,
    ) -> None:
        if not 0 < max_greeting <= max_connections:
            raise ValueError(f"need 0 < max_greeting ({max_greeting}) <= max_connections ({max_connections})")
        self.channel = channel
        self.max_connections = max_connections
        self.max_greeting = max_greeting
        self._greeting_limits = greeting
        self._open = 0  # connections with a thread
        self._greeting = 0  # of which not yet authenticated
        self.refused = 0  # connections closed at once for a cap
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

        self._server = _TCPServer((host, port), _Handler, self._admit)
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

    @property
    def connections(self) -> tuple[int, int]:
        """(open connections, of which waiting for their Hello)."""
        with self._lock:
            return self._open, self._greeting

    # -- one connection ------------------------------------------------------------------------------
    def _admit(self) -> bool:
        with self._lock:
            if self._open >= self.max_connections or self._greeting >= self.max_greeting:
                self.refused += 1
                return False
            self._open += 1
            self._greeting += 1
            return True

    def _serve(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        try:
            self._serve_admitted(sock, peer)
        finally:
            with self._lock:
                self._open -= 1

    def _serve_admitted(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            hello = self._greet(sock)
        except (ConnectionError, OSError, ValidationError, RequestRefused) as exc:
            self.log.warning("connection refused", fields={"peer": f"{peer[0]}:{peer[1]}", "why": str(exc)[:200]})
            return
        finally:
            with self._lock:
                self._greeting -= 1
        client = f"{hello.client}#{next(self._ids)}"
        with self._lock:
            self._clients[client] = sock
        try:
            while True:
                try:
                    header, payload = wire.recv(sock, wire.REQUEST)
                except wire.ProtocolError as exc:
                    self._refuse_framing(sock, client, exc)
                    return
                reply, out = self._dispatch(client, header, payload)
                wire.send(sock, reply.model_dump(mode="json"), out)
        except (ConnectionError, OSError):
            pass  # the client went away; its leases go back below
        finally:
            with self._lock:
                self._clients.pop(client, None)
            if self._on_disconnect is not None:
                self._on_disconnect(client)

    def _refuse_framing(self, sock: socket.socket, client: str, exc: wire.ProtocolError) -> None:
        """Say why, then close: the rest of the stream cannot be framed any more."""
        self.log.warning("request refused, connection closed", fields={"client": client, "why": str(exc)[:200]})
        try:
            wire.send(sock, ErrorReply(error=f"connection closed: {exc}").model_dump())
        except OSError:
            pass

    def _greet(self, sock: socket.socket) -> Hello:
        header, _ = wire.recv(sock, self._greeting_limits)
        hello = Hello.model_validate(header)
        if hello.channel != self.channel:
            wire.send(
                sock, ErrorReply(error=f"this is the {self.channel!r} channel, not {hello.channel!r}").model_dump()
            )
            raise RequestRefused(f"{hello.client} asked for channel {hello.channel!r}")
        if not hmac.compare_digest(hello.token.encode(), self._token.encode()):
            wire.send(sock, ErrorReply(error="wrong data-plane token").model_dump())
            raise RequestRefused(f"{hello.client} sent a wrong token")
        sock.settimeout(None)  # authenticated: requests may be long polls, and idle time is the client's
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
