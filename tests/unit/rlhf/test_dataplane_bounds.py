"""The data plane bounded before it is authenticated: the framing fuzzed, and a channel server on
loopback attacked as a hostile peer on the pod network would (huge claimed sizes, silence, floods),
its memory (RSS, psutil) and threads measured around it while an authenticated client keeps working."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from stalwart.rlhf import wire
from stalwart.rlhf.messages import Message, Stats
from stalwart.rlhf.server import ChannelServer

TOKEN = "secret"
MIB = 1 << 20
PREFIX = struct.Struct("!IQ")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
headers = st.dictionaries(st.text(max_size=12), json_values, max_size=6)


def eventually(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------ the framing
@settings(max_examples=100, deadline=None)
@given(header=headers, payload=st.binary(max_size=4096))
def test_any_header_and_payload_come_back_as_sent(header: dict[str, object], payload: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, header, payload)
        assert wire.recv(b, wire.Limits(payload=len(payload))) == (header, payload)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048), limits=st.sampled_from([wire.HELLO, wire.REQUEST, wire.Limits()]))
def test_arbitrary_bytes_give_a_message_within_the_limits_or_a_protocol_error(data: bytes, limits: wire.Limits) -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        try:
            header, payload = wire.recv(b, limits)
        except ConnectionError:  # ConnectionClosed, ProtocolError, MessageTooLarge, MessageTimeout
            return
        assert isinstance(header, dict)
        assert len(json.dumps(header)) <= max(limits.header, 2 * len(data)) and len(payload) <= limits.payload


@settings(max_examples=100, deadline=None)
@given(header_len=st.integers(0, 2**32 - 1), payload_len=st.integers(0, 2**64 - 1), body=st.binary(max_size=64))
def test_claimed_sizes_never_allocate_more_than_what_arrives(header_len: int, payload_len: int, body: bytes) -> None:
    """Whatever sizes the prefix claims, reading allocates what arrived (and one chunk), not the claim."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(PREFIX.pack(header_len, payload_len) + body)
        a.shutdown(socket.SHUT_WR)
        tracemalloc.start()
        try:
            wire.recv(b, wire.Limits(header=wire.MAX_HEADER, payload=wire.MAX_PAYLOAD))
        except ConnectionError:
            pass
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert peak < 4 * MIB


def test_a_claim_beyond_the_limits_is_refused_before_the_body_is_read() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(PREFIX.pack(100, 16 << 30))
        with pytest.raises(wire.MessageTooLarge, match="accepts 4096 \\+ 0"):
            wire.recv(b, wire.HELLO)


def test_a_message_that_does_not_arrive_within_its_deadline_times_out() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(PREFIX.pack(100, 0) + b"{")  # then nothing more
        with pytest.raises(wire.MessageTimeout):
            wire.recv(b, wire.Limits(header=4096, payload=0, seconds=0.2))


# ------------------------------------------------------------------------------------ the server
class Ack(BaseModel):
    ok: bool = True


def _handle(client: str, message: Message, payload: bytes) -> tuple[BaseModel, bytes]:
    return Ack(), b""


def channel_server(greeting_seconds: float) -> Iterator[ChannelServer]:
    greeting = wire.Limits(header=4096, payload=0, seconds=greeting_seconds)
    srv = ChannelServer("relay", _handle, token=TOKEN, max_connections=32, max_greeting=8, greeting=greeting)
    yield srv.start()
    srv.close()


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    yield from channel_server(greeting_seconds=1.0)


@pytest.fixture
def patient_server() -> Iterator[ChannelServer]:
    """Silent peers are not timed out while the test holds them (so the cap alone bounds them)."""
    yield from channel_server(greeting_seconds=600.0)


def dial(srv: ChannelServer) -> socket.socket:
    return socket.create_connection((srv.host, srv.port), timeout=30)


def authenticated(srv: ChannelServer, name: str = "actor-0") -> socket.socket:
    sock = dial(srv)
    wire.send(sock, {"op": "hello", "client": name, "channel": "relay", "token": TOKEN})
    assert wire.recv(sock, wire.REPLY)[0] == {"ok": True}
    return sock


def served(sock: socket.socket) -> bool:
    """One request answered on this authenticated connection."""
    wire.send(sock, Stats().model_dump())
    return wire.recv(sock, wire.REPLY)[0] == {"ok": True}


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed this connection (read to its end; an ErrorReply may come first)."""
    sock.settimeout(30)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def test_a_hello_claiming_a_huge_payload_or_header_is_closed_unread(server: ChannelServer) -> None:
    for claim in (PREFIX.pack(200, 16 << 30), PREFIX.pack(64 << 20, 0)):
        with dial(server) as sock:
            sock.sendall(claim)
            assert closed_by_server(sock)
    eventually(lambda: server.connections == (0, 0), "both connections are gone")


def test_a_peer_that_never_speaks_is_closed_at_the_greeting_deadline(server: ChannelServer) -> None:
    with dial(server) as silent, dial(server) as trickle:
        trickle.sendall(PREFIX.pack(50, 0) + b'{"op"')  # part of a Hello, then nothing
        eventually(lambda: server.connections == (2, 2), "both wait for their Hello")
        assert closed_by_server(silent) and closed_by_server(trickle)
    eventually(lambda: server.connections == (0, 0), "both connections are gone")


def test_connections_beyond_the_greeting_cap_are_closed_without_a_thread(patient_server: ChannelServer) -> None:
    server = patient_server
    with authenticated(server) as client:
        threads = threading.active_count()
        flood = [dial(server) for _ in range(40)]
        try:
            eventually(lambda: server.refused >= 40 - server.max_greeting, "the flood beyond the cap is refused")
            assert server.connections[1] <= server.max_greeting
            assert threading.active_count() <= threads + server.max_greeting
            assert served(client)  # the authenticated client is not affected
        finally:
            for sock in flood:
                sock.close()
        eventually(lambda: server.connections == (1, 0), "only the client is left")
        with authenticated(server, "rollout-0") as late:  # once the flood is gone, new clients get in
            assert served(late)


def test_an_authenticated_peers_oversized_or_malformed_request_closes_only_its_connection(
    server: ChannelServer,
) -> None:
    with authenticated(server, "actor-0") as good:
        for bad in (PREFIX.pack(10, 1 << 30) + b"{}" * 5, PREFIX.pack(9, 0) + b"not json!"):
            with authenticated(server, "rollout-0") as sock:
                sock.sendall(bad)
                header, _ = wire.recv(sock, wire.REPLY)
                assert header["error"].startswith("connection closed")
                assert closed_by_server(sock)
            assert served(good)


def test_a_request_that_fails_validation_keeps_the_connection(server: ChannelServer) -> None:
    with authenticated(server) as sock:
        wire.send(sock, {"op": "lease", "stage": "nowhere"})
        assert "bad lease request" in wire.recv(sock, wire.REPLY)[0]["error"]
        assert served(sock)


def test_hostile_connections_leave_the_servers_memory_and_threads_bounded(patient_server: ChannelServer) -> None:
    """Unauthenticated connections claiming 16 GiB payloads or 64 MiB headers, and 200 that never
    speak: the server's RSS stays within a few MiB and its threads within the greeting cap, and an
    authenticated client is served throughout."""
    me, server = psutil.Process(), patient_server
    with authenticated(server) as client:
        rss, threads = me.memory_info().rss, me.num_threads()
        claims = [PREFIX.pack(200, 16 << 30), PREFIX.pack(64 << 20, 0), PREFIX.pack(200, 1 << 30)] * 3
        for claim in claims:
            with dial(server) as sock:
                sock.sendall(claim + b"x" * 4096)
                assert closed_by_server(sock)
        silent = [dial(server) for _ in range(200)]
        try:
            eventually(lambda: server.refused >= 200 - server.max_greeting, "the silent flood beyond the cap")
            assert me.num_threads() <= threads + server.max_greeting
            assert me.memory_info().rss - rss < 8 * MIB
            assert served(client)
        finally:
            for sock in silent:
                sock.close()
        eventually(lambda: server.connections == (1, 0), "only the client is left")
        assert me.memory_info().rss - rss < 8 * MIB
