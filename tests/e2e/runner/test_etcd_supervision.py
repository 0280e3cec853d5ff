"""`stalwart run` rides out an etcd outage (issue 16): a real etcd killed with SIGKILL is started
again on the same port with its data; the runner says so in one line each way, and gives up only
after its limit."""

from __future__ import annotations

import signal
from pathlib import Path

from stalwart.runner.etcd_outage import EtcdOutage
from stalwart.store import Store, StoreUnavailable
from stalwart.store.etcd_server import EtcdServer


def test_a_killed_etcd_is_started_again_with_its_data_and_a_long_outage_gives_up(tmp_path: Path) -> None:
    notes: list[str] = []
    now = [0.0]
    with EtcdServer(tmp_path / "etcd") as etcd:
        store = Store(etcd.endpoint, timeout=2.0)
        try:
            store.put("/stalwart/v1/probe", "kept")
            outage = EtcdOutage(etcd, notes.append, limit=30.0, clock=lambda: now[0])
            assert etcd.proc is not None
            etcd.proc.send_signal(signal.SIGKILL)
            etcd.proc.wait(timeout=30)
            try:
                store.ping()
                raise AssertionError("etcd answered after SIGKILL")
            except StoreUnavailable as exc:
                assert outage.failed(exc)  # restarts it
            assert store.get_raw("/stalwart/v1/probe") == b"kept"
            outage.answered()
            assert [n.split(" (")[0].split(";")[0] for n in notes] == [
                "etcd unreachable",
                "etcd exited",
                "etcd is back after 0.0s",
            ]
            unreachable = StoreUnavailable("paused")
            assert outage.failed(unreachable) and outage.since == 0.0
            now[0] = 31.0
            assert not outage.failed(unreachable)
            assert notes[-1] == outage.gave_up
            assert outage.gave_up == (
                "etcd unreachable for 31s, longer than faultTolerance.etcdOutageSeconds (30s): the job was stopped"
            )
        finally:
            store.close()


def test_a_kill_etcd_fault_keeps_etcd_down_for_its_length(tmp_path: Path) -> None:
    """`--inject kill-etcd:seconds=S`: the runner starts etcd again only once S has passed."""
    held = [True]
    with EtcdServer(tmp_path / "etcd") as etcd:
        store = Store(etcd.endpoint, timeout=2.0)
        try:
            outage = EtcdOutage(etcd, lambda _: None, limit=30.0, may_restart=lambda: not held[0])
            assert etcd.proc is not None
            etcd.proc.send_signal(signal.SIGKILL)
            etcd.proc.wait(timeout=30)
            gone = StoreUnavailable("refused")
            assert outage.failed(gone) and etcd.proc.poll() is not None  # still down
            held[0] = False
            assert outage.failed(gone) and etcd.proc.poll() is None  # started again
            store.ping()
        finally:
            store.close()
