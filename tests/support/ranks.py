"""Run a script as N real ranks on loopback with the torchrun environment, for multi-rank tests.

The ranks are forked by `rank_host.py` from the product's fork server (torch imported once per
test process, not once per rank or world); the test sees each rank as a process it can wait for
and signal."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from stalwart.agents.warm_pool import import_time_env
from stalwart.health.collective_runner import WORKER_MODULE
from stalwart.net import free_port
from stalwart.processes import AdoptedProcess, spawn, stop_process
from support.orphans import RANK_HOST_MARK

HOST = Path(__file__).with_name("rank_host.py")
HOST_READY_SECONDS = 300.0  # the fork server's imports, on a loaded machine
HOST_EXIT_SECONDS = 30.0  # at the end of its stdin: it stops its ranks, closes its fork server and exits


def torchrun_base_env() -> dict[str, str]:
    """This process's environment plus what every rank of a test world shares."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}


class RankProcess(AdoptedProcess):
    """One rank: not our child (the host's), so its exit code comes from the host, not from waitpid."""

    def __init__(self, pid: int, host: RankHost) -> None:
        super().__init__(pid)
        self._host = host

    def poll(self) -> int | None:
        self.returncode = self._host.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._host.exited(self.pid, timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        code = self.poll()
        assert code is not None  # exited: the host reported its code
        return code


class RankHost:
    """The host process (rank_host.py) and what it reports: each world's pids, then exit codes."""

    def __init__(self) -> None:
        self.log = Path(tempfile.mkdtemp(prefix="stalwart-rank-host-")) / "rank-host.log"
        with open(self.log, "ab") as log:
            self.proc = spawn(
                [sys.executable, str(HOST), str(self.log.with_name("fork-server.log"))],
                env={**torchrun_base_env(), RANK_HOST_MARK: "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self.exits: dict[int, int] = {}
        self._started: set[int] = set()
        self._pids: queue.Queue[list[int]] = queue.Queue()
        self._changed = threading.Condition()
        self._start_lock = threading.Lock()
        threading.Thread(target=self._read, name=f"rank-host-{self.proc.pid}", daemon=True).start()

    def start(self, script: Path, args: list[str], world: int, cwd: Path) -> list[RankProcess]:
        """`world` ranks of `python script args` in `cwd` (rank R logs to cwd/rank-R.log)."""
        request = {"world": world, "port": free_port(), "cwd": str(cwd), "script": str(script), "args": args}
        request["env"] = torchrun_base_env()  # this test's, as a rank started here would get it
        return self._request(request)

    def start_module(self, module: str, env: dict[str, str], log: Path) -> RankProcess:
        """`python -m module` with exactly `env`, forked as an agent forks its check ranks."""
        [rank] = self._request({"module": module, "env": env, "log": str(log)})
        return rank

    def _request(self, request: dict[str, object]) -> list[RankProcess]:
        with self._start_lock:  # one request at a time: the next `pids` line is its
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            try:
                pids = self._pids.get(timeout=HOST_READY_SECONDS)
            except queue.Empty:
                pids = []
            if not pids:
                raise AssertionError(f"the rank host started nothing: {self.log.read_text()[-3000:]}")
            with self._changed:
                for pid in pids:  # a pid the kernel reused: its old exit is not this rank's
                    self.exits.pop(pid, None)
                self._started.update(pids)
        return [RankProcess(pid, self) for pid in pids]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            fields = raw.decode().split()
            if fields[:1] == ["pids"]:
                self._pids.put([int(p) for p in fields[1:]])
            elif len(fields) == 3 and fields[0] == "exit":
                with self._changed:
                    self.exits[int(fields[1])] = int(fields[2])
                    self._changed.notify_all()
        with self._changed:  # the host is gone: a rank it never reported died with it
            for pid in self._started:
                self.exits.setdefault(pid, -signal.SIGKILL)
            self._changed.notify_all()
        self._pids.put([])  # a world waiting for its pids gets none
        self.proc.wait()

    def exited(self, pid: int, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self.exits:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """End of stdin: it stops what still runs, closes its fork server and exits."""
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=HOST_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            stop_process(self.proc, grace=5)
        shutil.rmtree(self.log.parent, ignore_errors=True)


_host: RankHost | None = None
_host_lock = threading.Lock()


def shared_host() -> RankHost:
    """This test process's rank host, started on first use (again if it died)."""
    global _host
    with _host_lock:
        if _host is None or not _host.alive():
            _host = RankHost()
        return _host


def close_shared_host() -> None:
    """Called at the end of the test session (tests/conftest.py), before the check for orphans."""
    global _host
    with _host_lock:
        if _host is not None:
            _host.close()
            _host = None


def forked_check_rank(env: dict[str, str], log: Path) -> RankProcess:
    """A collective-check rank forked by this test process's rank host (a `RankStarter`): the checks'
    tests pay torch's import once per pytest worker, not once per rank. The host's fork server has
    the base environment's PYTHON* settings: the rank takes them, or it would have to start cold."""
    return shared_host().start_module(WORKER_MODULE, {**env, **import_time_env(torchrun_base_env())}, log)


class RankWorld:
    """One world's ranks, forked by this test process's rank host."""

    def __init__(self, script: Path, args: list[str], world: int, cwd: Path) -> None:
        self.ranks = shared_host().start(script, args, world, cwd)

    def stop(self) -> None:
        """Stop what still runs (the host reports their exits)."""
        for rank in self.ranks:
            stop_process(rank, grace=2)


def run_ranks(script: Path, args: list[str], world: int, cwd: Path, timeout: float = 180) -> list[dict]:  # type: ignore[type-arg]
    """Run to completion; return each rank's results/rank-R.json. Fails with the logs if a rank fails."""
    results_dir = Path(args[1]) / "results"  # args: SCENARIO ROOT ...
    for old in results_dir.glob("rank-*.json") if results_dir.exists() else []:
        old.unlink()
    ranks = RankWorld(script, [*args], world, cwd)
    try:
        codes = [p.wait(timeout=timeout) for p in ranks.ranks]
    finally:
        ranks.stop()
    if any(codes):
        logs = "\n".join((cwd / f"rank-{r}.log").read_text()[-3000:] for r in range(world))
        raise AssertionError(f"ranks exited {codes}:\n{logs}")
    return [json.loads((results_dir / f"rank-{r}.json").read_text()) for r in range(world)]
