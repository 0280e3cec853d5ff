"""Watches outlive etcd going away (issue 16): a real etcd is killed and started again on its port
with its data; every watch is created again from where it stopped, and a change made before it was
back is delivered, once."""

from __future__ import annotations

import signal
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
