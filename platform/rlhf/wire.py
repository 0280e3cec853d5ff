"""Framing on the data plane's TCP connections: a JSON header and an optional binary payload.

    4 bytes   header length (big-endian)
    8 bytes   payload length
    header    UTF-8 JSON object
    payload   raw bytes (the actor's weights), never parsed as anything but bytes

The reader says what it accepts (`Limits`): the sizes are checked against them before anything else
is read, so a wrong peer (or a port scanner) is refused at once, and nothing is allocated from a size
the peer claims: buffers grow with the bytes that actually arrive, a chunk at a time. A Hello is read
under `HELLO` (a few KiB, no payload, a short deadline for the whole message), requests under
`REQUEST` (no payload: no request carries one) and replies under what their request allows.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any

_PREFIX = struct.Struct("!IQ")
MAX_HEADER = 64 << 20  # a take of many groups is a few MiB of JSON at most
MAX_PAYLOAD = 16 << 30
CHUNK = 1 << 20  # the most one read allocates ahead of the bytes it got


@dataclass(frozen=True)
class Limits:
    """What a reader accepts: the largest header and payload, and how long the whole message may take
    (None: no deadline of its own, the socket's timeout applies to each read)."""

    header: int = MAX_HEADER
    payload: int = MAX_PAYLOAD
    seconds: float | None = None


HELLO = Limits(header=4096, payload=0, seconds=10.0)  # before authentication: a Hello is < 1 KiB of JSON
REQUEST = Limits(payload=0)  # an authenticated client's request: JSON only
REPLY = Limits(payload=0)  # a reply that carries no payload (every one but the weights')


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (between or inside a message)."""


class ProtocolError(ConnectionError):
    """The peer does not speak this protocol (bad sizes, bad JSON)."""


class MessageTooLarge(ProtocolError):
    """The peer announced a header or payload beyond what this reader accepts."""


class MessageTimeout(ProtocolError):
    """The message did not arrive whole within its deadline (a peer that connects and never speaks)."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"message too large: header {len(data)} bytes, payload {len(payload)} bytes")
    sock.sendall(_PREFIX.pack(len(data), len(payload)) + data)
    if len(payload):
        sock.sendall(payload)


class _Reader:
    """Reads from one socket within an optional deadline for the whole message."""

    def __init__(self, sock: socket.socket, seconds: float | None) -> None:
        self.sock = sock
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.seconds = seconds

    def read(self, n: int) -> bytearray:
        """Exactly n bytes; the buffer grows by at most CHUNK beyond what has arrived."""
        buf = bytearray()
        while len(buf) < n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise MessageTimeout(f"no whole message within {self.seconds:.0f}s ({len(buf)} of {n} bytes)")
                self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(min(n - len(buf), CHUNK))
            except TimeoutError:
                if self.deadline is None:
                    raise
                continue  # the deadline check above says what happened
            if not chunk:
                raise ConnectionClosed("the peer closed the connection")
            buf += chunk
        return buf


def recv(sock: socket.socket, limits: Limits = Limits()) -> tuple[dict[str, Any], bytes]:
    """One message, refused (MessageTooLarge) before its body is read if its sizes exceed `limits`."""
    reader = _Reader(sock, limits.seconds)
    header_len, payload_len = _PREFIX.unpack(reader.read(_PREFIX.size))
    if header_len > limits.header or payload_len > limits.payload:
        raise MessageTooLarge(
            f"refusing a message of {header_len} + {payload_len} bytes "
            f"(this side accepts {limits.header} + {limits.payload})"
        )
    try:
        header = json.loads(reader.read(header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("the header is not a JSON object")
    payload = bytes(reader.read(payload_len)) if payload_len else b""
    return header, payload
