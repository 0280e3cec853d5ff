"""Watches outlive etcd going away (issue 16): a real etcd is killed and started again on its port
with its data; every watch is created again from where it stopped, and a change made before it was
back is delivered, once."""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

from stalwart.processes import wait_for
from stalwart.store import Store
from stalwart.store.etcd_server import EtcdServer

PREFIXES = ("/stalwart/v1/jobs/j/nodes/node-0/command", "/stalwart/v1/jobs/j/state", "/stalwart/v1/jobs/j/x/")


def test_watches_resume_after_etcd_restarts_and_miss_nothing(tmp_path: Path) -> None:
    seen: list[tuple[str, bytes | None]] = []
    with EtcdServer(tmp_path / "etcd") as etcd:
        writer, watcher = Store(etcd.endpoint, timeout=30.0), Store(etcd.endpoint, timeout=30.0)
        try:
            watches = [watcher.watch_prefix(p, lambda k, v: seen.append((k, v))) for p in PREFIXES]
            writer.put(PREFIXES[0], "before")
            assert wait_for(lambda: len(seen) == 1, timeout=60)
            assert etcd.proc is not None
            etcd.proc.send_signal(signal.SIGKILL)
            etcd.proc.wait(timeout=30)
            etcd.start()  # same port, same data
            # Written at once: the watches may or may not be back yet; either way nothing is lost.
            writer.put(PREFIXES[1], "while-resuming")
            writer.put(PREFIXES[2] + "a", "x")
            writer.delete(PREFIXES[0])
            assert wait_for(lambda: len(seen) == 4, timeout=30), seen
            assert wait_for(lambda: all(w.resumed >= 1 for w in watches), timeout=30)
            writer.put(PREFIXES[1], "after")
            assert wait_for(lambda: len(seen) == 5, timeout=60)
            assert sorted(seen[1:4], key=str) == sorted(
                [(PREFIXES[1], b"while-resuming"), (PREFIXES[2] + "a", b"x"), (PREFIXES[0], None)], key=str
            )
            assert seen[0] == (PREFIXES[0], b"before") and seen[4] == (PREFIXES[1], b"after")
        finally:
            watcher.close()
            writer.close()


def test_a_restart_that_finds_its_port_taken_for_a_moment_tries_again(tmp_path: Path) -> None:
    """Restarted on its ports, etcd may find one held by a client that reconnected while nothing
    listened and was given that port as its own: the start tries again until the port is free."""
    with EtcdServer(tmp_path / "etcd") as etcd:
        assert etcd.proc is not None
        etcd.proc.send_signal(signal.SIGKILL)
        etcd.proc.wait(timeout=30)
        squatter = socket.socket()
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((etcd.host, etcd.client_port))
        squatter.listen()

        def release_once_refused() -> None:  # the state: etcd said the port was in use
            wait_for(lambda: etcd.log_path.read_text(errors="replace").count("address already in use") >= 1, 120)
            squatter.close()

        releaser = threading.Thread(target=release_once_refused)
        releaser.start()
        try:
            etcd.start(timeout=120)
        finally:
            releaser.join(timeout=130)
            squatter.close()
        store = Store(etcd.endpoint)
        try:
            store.put("/after-restart", "1")
            assert store.get_raw("/after-restart") == b"1"
        finally:
            store.close()
