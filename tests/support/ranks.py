"""Run a script as N real ranks on loopback with the torchrun environment, for multi-rank tests.

The ranks are forked by `rank_host.py` from the product's fork server (torch imported once per
world, not once per rank); the test sees each rank as a process it can wait for and signal."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from stalwart.net import free_port
from stalwart.processes import AdoptedProcess, spawn, stop_process

HOST = Path(__file__).with_name("rank_host.py")
HOST_READY_SECONDS = 300.0  # the fork server's imports, on a loaded machine
HOST_EXIT_SECONDS = 30.0  # once its ranks have ended: it closes the fork server (1 s at most) and exits


def torchrun_base_env() -> dict[str, str]:
    """This process's environment plus what every rank of a test world shares."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}


class RankProcess(AdoptedProcess):
    """One rank: not our child (the host's), so its exit code comes from the host, not from waitpid."""

    def __init__(self, pid: int, world: RankWorld) -> None:
        super().__init__(pid)
        self._world = world

    def poll(self) -> int | None:
        self.returncode = self._world.exits.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._world.exited(self.pid, timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        code = self.poll()
        assert code is not None  # exited: the host reported its code
        return code


class RankWorld:
    """The host process and what it reports: its ranks' pids, then their exit codes."""

    def __init__(self, script: Path, args: list[str], world: int, cwd: Path) -> None:
        with open(cwd / "rank-host.log", "ab") as log:
            self.host = spawn(
                [sys.executable, str(HOST), str(world), str(free_port()), str(cwd), str(script), *args],
                env=torchrun_base_env(),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        self.exits: dict[int, int] = {}
        self._changed = threading.Condition()
        self.ranks = [RankProcess(pid, self) for pid in self._read_pids(cwd)]
        threading.Thread(target=self._read_exits, name=f"rank-host-{self.host.pid}", daemon=True).start()

    def _read_pids(self, cwd: Path) -> list[int]:
        assert self.host.stdout is not None
        ready = select.select([self.host.stdout], [], [], HOST_READY_SECONDS)[0]
        line = self.host.stdout.readline().decode() if ready else ""
        if not line.startswith("pids "):
            stop_process(self.host, grace=2)
            raise AssertionError(f"the rank host started no ranks: {(cwd / 'rank-host.log').read_text()[-3000:]}")
        return [int(p) for p in line.split()[1:]]

    def _read_exits(self) -> None:
        assert self.host.stdout is not None
        for raw in self.host.stdout:
            fields = raw.decode().split()
            if len(fields) == 3 and fields[0] == "exit":
                with self._changed:
                    self.exits[int(fields[1])] = int(fields[2])
                    self._changed.notify_all()
        with self._changed:  # the host is gone: a rank it never reported died with it
            for rank in self.ranks:
                self.exits.setdefault(rank.pid, -signal.SIGKILL)
            self._changed.notify_all()
        self.host.wait()

    def exited(self, pid: int, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while pid not in self.exits:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def stop(self) -> None:
        """Stop what still runs; a host whose ranks have all ended closes its fork server and exits."""
        for rank in self.ranks:
            stop_process(rank, grace=2)
        try:
            self.host.wait(timeout=HOST_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            stop_process(self.host, grace=5)


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
