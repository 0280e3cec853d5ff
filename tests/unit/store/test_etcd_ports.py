"""etcd's ports: a first start that finds one taken moves to new ports; a restart keeps its own."""

from __future__ import annotations

import socket
from pathlib import Path

from stalwart.store import Store
from stalwart.store.etcd_server import EtcdServer


def test_a_first_start_on_a_taken_port_moves_and_serves(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "data")
    with socket.socket() as taken:  # another program's server on the port etcd was given
        taken.bind(("127.0.0.1", server.client_port))
        taken.listen()
        given = server.client_port
        with server:
            assert server.client_port != given
            store = Store(server.endpoint)
            try:
                store.ping()
            finally:
                store.close()


def test_a_restart_keeps_its_ports(tmp_path: Path) -> None:
    with EtcdServer(tmp_path / "data") as server:
        endpoint = server.endpoint
        server.stop()
        server.start()
        assert server.endpoint == endpoint
        store = Store(endpoint)
        try:
            store.ping()
        finally:
            store.close()
