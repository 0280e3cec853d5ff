"""Shared fixtures: a real etcd per session, the example's data when a test asks for it, and a
check that no process outlives the test run.

Tests live in `unit/<area>/` (in-process, or small helper processes: etcd, moto, a CLI call) and
`e2e/<area>/` (real jobs, agents, controllers, operators, multi-rank torch.distributed worlds, and
any test that waits out real time: a lease's TTL, a server's restart, a killed service's recovery);
each folder's tests carry the marker of the same name, so `-m unit` and `-m e2e` select them.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support.orphans import cmdline, tagged_processes
from support.paths import REPO
from support.ranks import close_shared_host

from stalwart.store import Store
from stalwart.store.etcd_server import EtcdServer

pytest_plugins = ["support.dataloader", "support.cli_invoke"]

# Tests assert behaviour, never timing: hypothesis's per-example deadline (200 ms) and its too-slow
# health check are timings, and fail a property test whenever the machine is busy.
settings.register_profile("stalwart", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("stalwart")

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    # Under `pytest -n`, workers run jobs with the same names at once: each gets its own folder of
    # shared-memory segments (the data loaders' and the memory tier's), inherited by what it starts.
    _shm = Path(os.environ.get("STALWART_SHM_DIR", "/dev/shm")) / f"stalwart-tests-{worker}"
    _shm.mkdir(parents=True, exist_ok=True)
    os.environ["STALWART_SHM_DIR"] = str(_shm)
    # xdist fixes COLUMNS=80 in its workers, and rich reads it once, when the CLI's console is made:
    # the CLI tests give their terminal width per invocation, as a serial run lets them.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
    # The workers are the parallelism: torch's intra-op threads on top of them oversubscribe the cores,
    # and its spinning OpenMP threads then make in-process training many times slower on a busy machine.
    # Set before anything imports torch (it reads the variable then); a job's workers get 1 anyway.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.relative_to(REPO / "tests").parts
        if parts[0] in ("unit", "e2e"):
            item.add_marker(parts[0])
        # `--dist loadgroup` (make test) keeps a module's tests on one worker when they share a run
        # (a module- or class-scoped fixture), so the run starts once; every other test goes alone.
        if item.get_closest_marker("xdist_group") is None and _uses_a_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(str(item.path.relative_to(REPO))))


def _uses_a_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("package", "module", "class") for defs in info.name2fixturedefs.values() for d in defs)


@pytest.fixture(scope="session", autouse=True)
def no_orphans_at_the_end() -> Iterator[None]:
    """Requested first, so torn down last: after every other fixture has stopped its servers."""
    yield
    close_shared_host()  # the multi-rank tests' host serves the whole session (support.ranks)
    survivors = tagged_processes()
    if survivors:
        desc = [f"{p.pid} {cmdline(p)[:120]}" for p in survivors]
        for p in survivors:
            p.kill()
        pytest.fail("processes outlived the test run:\n" + "\n".join(desc))


@pytest.fixture(scope="session")
def example_shards() -> None:
    """The example job's token shards, built from the text shipped in examples/data (as `make demo` does)."""
    from stalwart.dataloader import build_shards

    out = REPO / "examples" / "data" / "shards"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:  # xdist workers build them once, one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
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
