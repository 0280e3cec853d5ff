"""The diagnosis service as tests run it: its own process on a free loopback port, with a token."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from stalwart.handover import spawn_listening
from stalwart.processes import stop_process, wait_for
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV, new_token


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    token: str
    log: Path

    @property
    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


def start_service(tmp: Path, *args: str, token: str | None = None) -> Service:
    """Started and answering /healthz; `token` None makes one (the service refuses to start without)."""
    token = token or new_token()
    fd, name = tempfile.mkstemp(prefix="service-", suffix=".log", dir=tmp)
    log = Path(name)
    with os.fdopen(fd, "wb") as f:  # on a port bound here and handed over, as `stalwart run` does
        proc, port = spawn_listening(
            [sys.executable, "-m", "stalwart.diagnosis.service", "--host", "127.0.0.1", *args],
            "127.0.0.1",
            env={**os.environ, DIAGNOSIS_TOKEN_ENV: token},
            stdout=f,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return http.get(f"{url}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    with httpx.Client(timeout=1) as http:  # one client for the polls: each `httpx.get` builds a TLS context
        started = wait_for(up, 120, 0.2)
    if not started or proc.poll() is not None:
        stop_process(proc, grace=2)
        pytest.fail(f"the diagnosis service did not come up:\n{log.read_text()[-3000:]}")
    return Service(proc, url, token, log)


@contextmanager
def running_service(tmp: Path, *args: str) -> Iterator[Service]:
    service = start_service(tmp, *args)
    try:
        yield service
    finally:
        stop_process(service.proc, grace=10)


def worker_pids(service: Service) -> set[int]:
    """The service's diagnosis workers (spawned processes)."""
    kids = psutil.Process(service.proc.pid).children(recursive=True)
    return {p.pid for p in kids if "spawn_main" in " ".join(p.cmdline())}
