"""Ports chosen for a server that binds them later (`stalwart.net.free_port`): outside the kernel's
ephemeral range, never one that is held, and never the same for two processes choosing at once."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart import net


def test_a_chosen_port_is_below_the_ephemeral_range_and_bindable() -> None:
    ports = net.chosen_port_range()
    low = int(net.EPHEMERAL_RANGE_FILE.read_text().split()[0])
    assert ports and ports.stop <= low
    port = net.free_port()
    assert port in ports
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))  # without SO_REUSEADDR: nothing held it, nothing lingers on it
        server.listen()


def test_a_held_port_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "PORT_CURSOR_FILE", tmp_path / "cursor")
    first = net.free_port()
    (tmp_path / "cursor").write_text(str(first - net.chosen_port_range().start - 1))  # first comes next again
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        assert net.free_port() != first


def test_processes_choosing_at_once_get_different_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "PORT_CURSOR_FILE", tmp_path / "cursor")
    code = (
        "import sys; from pathlib import Path; from stalwart import net; "
        "net.PORT_CURSOR_FILE = Path(sys.argv[1]); print(*(net.free_port() for _ in range(50)))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cursor")], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    chosen = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert all(proc.returncode == 0 for proc in procs)
    assert len(chosen) == 200 and len(set(chosen)) == 200


def test_without_a_shared_cursor_a_process_takes_its_own_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "PORT_CURSOR_FILE", Path("/proc/no-such-folder/cursor"))
    chosen = [net.free_port() for _ in range(20)]
    assert len(set(chosen)) == 20 and all(p in net.chosen_port_range() for p in chosen)


def test_too_few_ports_below_the_ephemeral_range_leaves_the_choice_to_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    monkeypatch.setattr(net, "EPHEMERAL_RANGE_FILE", tmp_path / "range")
    assert not net.chosen_port_range()
    assert 0 < net.free_port() < 65536


def test_an_address_that_is_not_this_machines_is_an_error() -> None:
    with pytest.raises(OSError):
        net.free_port("192.0.2.1")  # TEST-NET-1
