"""Framing on the data plane's TCP connections: a JSON header and an optional binary payload.

    4 bytes   header length (big-endian)
    8 bytes   payload length
    header    UTF-8 JSON object
    payload   raw bytes (the actor's weights), never parsed as anything but bytes

Sizes are checked before anything is read, so a wrong peer (or a port scanner) is refused at once.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_PREFIX = struct.Struct("!IQ")
MAX_HEADER = 64 << 20  # a take of many groups is a few MiB of JSON at most
MAX_PAYLOAD = 16 << 30


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (between or inside a message)."""


class ProtocolError(ConnectionError):
    """The peer does not speak this protocol (bad sizes, bad JSON)."""


def send(sock: socket.socket, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER or len(payload) > MAX_PAYLOAD:
        raise ProtocolError(f"message too large: header {len(data)} bytes, payload {len(payload)} bytes")
    sock.sendall(_PREFIX.pack(len(data), len(payload)) + data)
    if len(payload):
        sock.sendall(payload)


def _read(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionClosed("the peer closed the connection")
        got += k
    return buf


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    header_len, payload_len = _PREFIX.unpack(_read(sock, _PREFIX.size))
    if header_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
        raise ProtocolError(f"refusing a message of {header_len} + {payload_len} bytes")
    try:
        header = json.loads(_read(sock, header_len))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"the header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError("the header is not a JSON object")
    payload = bytes(_read(sock, payload_len)) if payload_len else b""
    return header, payload
