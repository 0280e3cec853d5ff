"""The agent's side of the fork server (stalwart.agents.warm_start): workers skip the torch import.

One server per node, started with the agent, so that the first generation's workers are forked from
it too: a node pays torch's import once in its life instead of once per worker and per restart. A
server that dies is started again after a pause; until it is ready, or wherever it cannot be used (a
command that is not `python script.py`, an environment that torch reads at import and that differs
from the server's, no subreaper support), workers start cold.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from stalwart.agents.warm_start import LaunchRequest, warm_eligible
from stalwart.processes import AdoptedProcess, ChildProcess, become_subreaper, spawn, stop_process
from stalwart.spec import Role

RESTART_DELAY_SECONDS = 3.0
# A launch waits this long for the server to finish its imports: a cold worker would spend the same
# time importing, and the wait saves a whole import per worker. Past it, the worker starts cold.
READY_WAIT_SECONDS = 60.0
REPLY_WAIT_SECONDS = 10.0
SPARE_EXIT_WAIT_SECONDS = 5.0
# torch reads these when it is imported (TORCH_LOGS, PYTORCH_*, TORCHDYNAMO_*, ...), and Python its
# own at start-up (PYTHONPATH, PYTHONHASHSEED, ...): a worker whose environment sets them differently
# from the server's must start cold to see them.
IMPORT_TIME_ENV_PREFIXES = ("TORCH_", "PYTORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "PYTHON")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV_PREFIXES)}


def warm_size(roles: list[Role]) -> int:
    """The most workers a node of this job starts whose command can be forked from the server; 0
    (no server, no torch import for nothing) when no role's can, e.g. a relay's `python -m ...`."""
    return max((r.processes_per_node for r in roles if warm_eligible(r.command)), default=0)


class WarmPool:
    def __init__(self, size: int, enabled: bool = True, log: Path | None = None) -> None:
        """`size` 0 or `enabled` False: every worker starts cold. Enabling it makes this process a
        child subreaper (the forked workers become its children)."""
        self.enabled = enabled and size > 0 and become_subreaper()
        self.size = size
        self.log = log
        self.spares: set[int] = set()  # the server's spares (our children once adopted), not yet handed out
        self.server: subprocess.Popen[bytes] | None = None
        self.ready = False
        self._buffer = b""
        self._start_after = 0.0
        self._env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}

    def maintain(self) -> None:
        """Start the server (again, after a pause, if it died); notice when it is ready."""
        if not self.enabled:
            return
        if self.server is not None and self.server.poll() is not None:
            self._discard()  # it died: a new one after the pause
        if self.server is None and time.monotonic() >= self._start_after:
            stderr: IO[bytes] | int = subprocess.DEVNULL
            if self.log is not None:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                stderr = open(self.log, "ab")  # closed below, once the server holds it
            try:
                self.server = spawn(
                    [sys.executable, "-m", "stalwart.agents.warm_start", "--spares", str(self.size)],
                    env=self._env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                )
            finally:
                if not isinstance(stderr, int):
                    stderr.close()
        if self.server is not None and not self.ready:
            self.ready = self._reply(0.0) == "ready"
        elif self.server is not None:
            self._reply(0.0)  # the spares it announced while we asked for nothing

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> ChildProcess | None:
        """A forked worker running `argv`, or None (start it cold)."""
        if not self.enabled or not warm_eligible(argv) or import_time_env(env) != import_time_env(self._env):
            return None
        self.maintain()
        if self.server is None or self.server.stdin is None:
            return None
        if not self.ready:
            self.ready = self._reply(READY_WAIT_SECONDS) == "ready"
            if not self.ready:
                return None
        request = LaunchRequest(argv=argv, env=env, cwd=str(cwd), log=str(log))
        try:
            self.server.stdin.write(request.model_dump_json().encode() + b"\n")
            self.server.stdin.flush()
        except (BrokenPipeError, OSError):
            self._discard()
            return None
        reply = self._reply(REPLY_WAIT_SECONDS)
        if reply is None or not reply.isdigit() or int(reply) <= 0:
            self._discard()  # a server that does not answer is of no use: a new one starts later
            return None
        self.spares.discard(int(reply))  # a spare now runs the worker
        return AdoptedProcess(int(reply))

    def _reply(self, timeout: float) -> str | None:
        """The server's next answer within `timeout` seconds, noting the spares it announces on the way."""
        deadline = time.monotonic() + timeout
        while (line := self._read_line(max(0.0, deadline - time.monotonic()))) is not None:
            if not line.startswith("spare "):
                return line
            self.spares.add(int(line.split()[1]))
        return None

    def _read_line(self, timeout: float) -> str | None:
        """One line from the server, waiting up to `timeout` seconds; None if none came."""
        assert self.server is not None and self.server.stdout is not None
        fd = self.server.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None  # it exited
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()

    def _discard(self) -> None:
        if self.server is not None:
            stop_process(self.server, grace=1.0)
        self._reap_spares()
        self.server, self.ready, self._buffer = None, False, b""
        self._start_after = time.monotonic() + RESTART_DELAY_SECONDS

    def _reap_spares(self) -> None:
        """Once the server is gone its spares exit (their pipes close): wait for them, our children."""
        if self.server is not None:
            while self._reply(0.0) is not None:  # spares it announced that we have not read of yet
                pass
        for pid in self.spares:
            spare = AdoptedProcess(pid)
            try:
                spare.wait(timeout=SPARE_EXIT_WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                spare.kill()
                spare.wait(timeout=SPARE_EXIT_WAIT_SECONDS)
        self.spares.clear()

    def close(self) -> None:
        if self.server is not None:
            if self.server.stdin is not None:
                try:
                    self.server.stdin.close()  # it leaves its loop and exits
                except OSError:
                    pass
            stop_process(self.server, grace=1.0)
        self._reap_spares()
        self.server, self.ready = None, False
