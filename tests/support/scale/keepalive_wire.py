"""etcd's LeaseKeepAlive stream spoken directly over HTTP/2, for the node simulator.

etcd sees exactly what an agent's long-lived keep-alive stream sends (gRPC messages
`LeaseKeepAliveRequest{ID}` on one `/etcdserverpb.Lease/LeaseKeepAlive` stream, one per node per
interval, each answered by a `LeaseKeepAliveResponse{ID, TTL}`), but without Python gRPC's cost of
one awaited operation per message (about 140 us of CPU per keep-alive in grpc.aio on this machine,
1.4 cores at 10,000 nodes a second): the renewals of many nodes go out in one write, and replies are
parsed from the bytes as they come. What it needs of HTTP/2 and no more: the preface and SETTINGS,
one request stream (literal HPACK headers), DATA both ways with flow control, PING and SETTINGS
acknowledgements, and the end of the stream (trailers, RST_STREAM, GOAWAY, a closed connection),
after which the owner opens another.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pyetcd.etcdrpc import rpc_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
STREAM = 1  # the one request stream of the connection
BIG_WINDOW = 2**31 - 1
WINDOW_REFILL = 2**30  # received bytes after which our receive windows are topped up again
PATH = "/etcdserverpb.Lease/LeaseKeepAlive"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK header field, literal without indexing, new name (RFC 7541 6.2.2); short strings."""
    n, v = name.encode(), value.encode()
    assert len(n) < 127 and len(v) < 127
    return b"\x00" + bytes((len(n),)) + n + bytes((len(v),)) + v


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def keepalive_message(lease_id: int) -> bytes:
    """One gRPC message: not compressed, its length, then LeaseKeepAliveRequest{ID} (field 1, varint)."""
    body = b"\x08" + _varint(lease_id)
    return b"\x00" + len(body).to_bytes(4, "big") + body


class KeepAliveWire:
    """One connection to etcd holding one LeaseKeepAlive stream. `on_reply(lease_id, ttl)` for every
    answer, from the reading task; `broken` once the stream ended (the owner opens another)."""

    def __init__(self, host: str, port: int, on_reply: Callable[[int, int], None]) -> None:
        self.host, self.port, self.on_reply = host, port, on_reply
        self.broken = False
        self.why: str | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending = bytearray()  # sent by the owner, waiting for flow-control window
        self._conn_window = 65_535
        self._stream_window = 65_535
        self._initial_window = 65_535
        self._max_frame = 16_384
        self._received = 0
        self._inbox = bytearray()

    async def open(self) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self._writer = writer
        settings = SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + BIG_WINDOW.to_bytes(4, "big")
        headers = b"".join(
            _literal(k, v)
            for k, v in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", PATH),
                (":authority", f"{self.host}:{self.port}"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        writer.write(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, (BIG_WINDOW - 65_535).to_bytes(4, "big"))
            + frame(HEADERS, END_HEADERS, STREAM, headers)
        )
        self._reader_task = asyncio.create_task(self._read(reader))

    def send(self, lease_ids: list[int]) -> None:
        """Renew these leases: their messages go out now, as far as etcd's flow-control window allows."""
        self._pending += b"".join(keepalive_message(i) for i in lease_ids)
        self._flush()

    def _flush(self) -> None:
        if self._writer is None or self.broken:
            return
        out = bytearray()
        while self._pending:
            n = min(len(self._pending), self._conn_window, self._stream_window, self._max_frame)
            if n <= 0:
                break
            out += frame(DATA, 0, STREAM, bytes(self._pending[:n]))
            del self._pending[:n]
            self._conn_window -= n
            self._stream_window -= n
        if out:
            self._writer.write(bytes(out))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                head = await reader.readexactly(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await reader.readexactly(length) if length else b""
                if kind == DATA:
                    self._on_data(payload, flags)
                    if flags & END_STREAM:
                        return self._end("etcd ended the stream")
                elif kind == HEADERS and flags & END_STREAM:
                    return self._end("etcd ended the stream (trailers)")
                elif kind == SETTINGS and not flags & ACK:
                    self._on_settings(payload)
                elif kind == PING and not flags & ACK:
                    self._write(frame(PING, ACK, 0, payload))
                elif kind == WINDOW_UPDATE:
                    increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                    if stream == 0:
                        self._conn_window += increment
                    else:
                        self._stream_window += increment
                    self._flush()
                elif kind in (RST_STREAM, GOAWAY):
                    return self._end(f"etcd sent {'RST_STREAM' if kind == RST_STREAM else 'GOAWAY'}")
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._end(f"connection lost: {type(exc).__name__}")
        except asyncio.CancelledError:
            self._end("closed")

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload) - 5, 6):
            ident, value = int.from_bytes(payload[i : i + 2], "big"), int.from_bytes(payload[i + 2 : i + 6], "big")
            if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                self._stream_window += value - self._initial_window
                self._initial_window = value
            elif ident == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self._write(frame(SETTINGS, ACK, 0))
        self._flush()

    def _on_data(self, payload: bytes, flags: int) -> None:
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        inbox = self._inbox
        inbox += payload
        start = 0
        while len(inbox) - start >= 5:
            size = int.from_bytes(inbox[start + 1 : start + 5], "big")
            if len(inbox) - start - 5 < size:
                break
            reply = pb.LeaseKeepAliveResponse.FromString(bytes(inbox[start + 5 : start + 5 + size]))
            start += 5 + size
            self.on_reply(reply.ID, reply.TTL)
        del inbox[:start]
        self._received += len(payload)
        if self._received >= WINDOW_REFILL:
            refill = self._received.to_bytes(4, "big")
            self._write(frame(WINDOW_UPDATE, 0, 0, refill) + frame(WINDOW_UPDATE, 0, STREAM, refill))
            self._received = 0

    def _write(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    def _end(self, why: str) -> None:
        if not self.broken:
            self.broken, self.why = True, why
        if self._writer is not None:
            self._writer.close()

    def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        self._end("closed")
