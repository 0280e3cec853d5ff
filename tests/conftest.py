"""Shared fixtures: a real etcd per session, and a check that no process outlives the test run.

Every process the suite starts inherits STALWART_TEST_SESSION; at the end, any live process that
still carries this session's value is an orphan and fails the run.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from stalwart.store import Store
from stalwart.store.etcd_server import EtcdServer

REPO = Path(__file__).resolve().parent.parent
SESSION_TAG = "STALWART_TEST_SESSION"
os.environ.setdefault(SESSION_TAG, uuid.uuid4().hex)


def cmdline(p: psutil.Process) -> str:
    """A process's command line, or '' once it is gone (it may exit between listing and asking)."""
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def tagged_processes() -> list[psutil.Process]:
    """Live processes (other than this one) started under this test session."""
    tag = os.environ[SESSION_TAG]
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(SESSION_TAG) == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


@pytest.fixture(scope="session", autouse=True)
def no_orphans_at_the_end() -> Iterator[None]:
    """Requested first, so torn down last: after every other fixture has stopped its servers."""
    yield
    survivors = tagged_processes()
    if survivors:
        desc = [f"{p.pid} {cmdline(p)[:120]}" for p in survivors]
        for p in survivors:
            p.kill()
        pytest.fail("processes outlived the test run:\n" + "\n".join(desc))


@pytest.fixture(scope="session", autouse=True)
def example_shards() -> None:
    """The example job's token shards, built from the text shipped in examples/data (as `make demo` does)."""
    from stalwart.dataloader import build_shards

    out = REPO / "examples" / "data" / "shards"
    for source in ("stories", "logs"):
        if not (out / f"{source}-00000.stok").exists():
            build_shards([REPO / "examples" / "data" / f"{source}.txt"], out, prefix=source, overwrite=True)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    with EtcdServer(tmp_path_factory.mktemp("etcd") / "data") as server:
        yield server


@pytest.fixture
def store(etcd: EtcdServer) -> Iterator[Store]:
    s = Store(etcd.endpoint)
    yield s
    s.close()


@pytest.fixture
def stalwart_cmd() -> list[str]:
    return [sys.executable, "-m", "stalwart.cli.main"]
