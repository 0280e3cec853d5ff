"""torch's rendezvous store as a warm worker serves it: on MASTER_ADDR only, and the script's own
env:// rendezvous finds it (torch's default listens on every interface)."""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist

from stalwart.agents import warm_start
from stalwart.net import bound_tcp_store, free_port, listen_on


def listening(port: int) -> list[str]:
    return [
        c.laddr.ip for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port
    ]


def test_listen_on_binds_one_address_and_refuses_every_interface() -> None:
    sock = listen_on("localhost", 0)
    try:
        assert sock.getsockname()[0] in ("127.0.0.1", "::1")
    finally:
        sock.close()
    for wildcard in ("0.0.0.0", "::", ""):
        with pytest.raises(ValueError, match="every interface"):
            listen_on(wildcard, 0)
    with pytest.raises(OSError):
        listen_on("192.0.2.1", 0)  # TEST-NET-1: not this machine's


def test_the_store_listens_on_master_addr_only() -> None:
    port = free_port()
    store = bound_tcp_store("127.0.0.1", port, 2, datetime.timedelta(seconds=30))
    try:
        assert listening(port) == ["127.0.0.1"]
        client = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
        client.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        del store


def test_a_warm_rank_0_serves_the_rendezvous_its_script_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(warm_start.AGENT_STORE_ENV, raising=False)
    monkeypatch.setattr(warm_start, "_rendezvous_store", None)
    warm_start.serve_rendezvous(dict(os.environ))
    assert os.environ[warm_start.AGENT_STORE_ENV] == "True" and listening(port) == ["127.0.0.1"]
    dist.init_process_group("gloo")  # env://, as an unmodified script does it
    try:
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 1.0 and listening(port) == ["127.0.0.1"]
    finally:
        dist.destroy_process_group()
        monkeypatch.setattr(warm_start, "_rendezvous_store", None)


def test_other_ranks_and_unusable_addresses_leave_torch_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(warm_start.AGENT_STORE_ENV, raising=False)
    monkeypatch.setattr(warm_start, "RENDEZVOUS_BIND_SECONDS", 0.0)  # a port that stays taken
    warm_start.serve_rendezvous({"RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"})
    assert warm_start.AGENT_STORE_ENV not in os.environ
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        warm_start.serve_rendezvous(
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        )
    assert warm_start.AGENT_STORE_ENV not in os.environ  # the script's own rendezvous reports the error
    assert "no rendezvous store on 127.0.0.1" in capsys.readouterr().err


def connected_to_itself() -> socket.socket:
    """What a rank polling a port nobody listens on can get: that port as its own, connected to itself."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.connect(sock.getsockname())
    return sock


def test_a_connection_to_itself_is_not_rank_0() -> None:
    with connected_to_itself() as itself:
        assert warm_start.connected_to_itself(itself)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as conn:
            assert not warm_start.connected_to_itself(conn)


def test_rank_0_binds_once_a_rank_connected_to_itself_lets_go(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(warm_start.AGENT_STORE_ENV, raising=False)
    monkeypatch.setattr(warm_start, "_rendezvous_store", None)
    blocker = connected_to_itself()
    port = blocker.getsockname()[1]
    tries: list[int] = []
    real = warm_start.bound_tcp_store

    def bind_then_let_go(*args: Any, **kwargs: Any) -> Any:
        tries.append(port)
        try:
            return real(*args, **kwargs)
        except OSError:
            warm_start.let_go(blocker)  # as wait_for_rendezvous does when it reached itself
            raise

    monkeypatch.setattr(warm_start, "bound_tcp_store", bind_then_let_go)
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    try:
        warm_start.serve_rendezvous(env)
        assert len(tries) == 2 and listening(port) == ["127.0.0.1"]
        assert os.environ[warm_start.AGENT_STORE_ENV] == "True"
    finally:
        blocker.close()
        monkeypatch.setattr(warm_start, "_rendezvous_store", None)
