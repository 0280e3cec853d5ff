"""The agent's side of the fork server (stalwart.agents.warm_start): workers skip the torch import.

One server per node, started with the agent, so that the first generation's workers are forked from
it too: a node pays torch's import once in its life instead of once per worker and per restart. A
server that dies is started again after a pause; until it is ready, or wherever it cannot be used (a
command that is not `python script.py`, an environment that torch reads at import and that differs
from the server's, no subreaper support), workers start cold. An agent forked from the local
cluster's agent zygote, which has imported torch, forks its first server from itself instead
(`prefork_server`): that node pays no import at all.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from stalwart.agents import warm_start
from stalwart.agents.warm_start import LaunchRequest, warm_eligible
from stalwart.processes import (
    AdoptedProcess,
    ChildProcess,
    PipeLines,
    become_subreaper,
    die_with_parent,
    spawn,
    stop_process,
)
from stalwart.spec import Role

RESTART_DELAY_SECONDS = 3.0
# A launch waits this long for the server to finish its imports: a cold worker would spend the same
# time importing, and the wait saves a whole import per worker. Past it, the worker starts cold.
READY_WAIT_SECONDS = 60.0
# The shadow loader imports less than a worker: it waits only for a server that is about to be ready
# (one forked from the agent). A check's rank imports torch as a worker does, so it waits as long as a
# worker would (READY_WAIT_SECONDS): a rank started cold would spend that time importing torch itself.
HELPER_READY_WAIT_SECONDS = 1.0
REPLY_WAIT_SECONDS = 10.0
SPARE_EXIT_WAIT_SECONDS = 5.0
# torch reads these when it is imported (TORCH_LOGS, PYTORCH_*, TORCHDYNAMO_*, ...), and Python its
# own at start-up (PYTHONPATH, PYTHONHASHSEED, ...): a worker whose environment sets them differently
# from the server's must start cold to see them.
IMPORT_TIME_ENV_PREFIXES = ("TORCH_", "PYTORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "PYTHON")
# Less those torch reads when it compiles, not when it is imported: it writes its default for this one
# back into os.environ, so a process that compiled once would otherwise differ from one that did not.
USE_TIME_ENV = frozenset({"TORCHINDUCTOR_CACHE_DIR"})


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV_PREFIXES) and k not in USE_TIME_ENV}


def warm_imports(roles: list[Role]) -> list[str]:
    """The modules the fork server imports beyond its own list: every forkable role's `warmImports`."""
    return sorted({m for r in roles if warm_eligible(r.command) for m in r.warm_imports})


def warm_size(roles: list[Role]) -> int:
    """The most workers a node of this job starts whose command can be forked from the server; 0
    (no server, no torch import for nothing) when no role's can, e.g. a relay's `python -m ...`."""
    return max((r.processes_per_node for r in roles if warm_eligible(r.command)), default=0)


class PreforkedServer(AdoptedProcess):
    """A fork server this process forked from itself (see `prefork_server`): our own child, with
    Popen's pipes."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        super().__init__(pid)
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout


_preforked: PreforkedServer | None = None


def prefork_server() -> None:
    """Fork this process's fork server now, from this process: called by an agent forked from the
    agent zygote (stalwart.cli.zygote), which has imported torch already, before the agent starts
    a thread (a fork of a process with gRPC threads is not safe). The server waits for its spare
    count, which only the job's spec gives; the agent's WarmPool takes it instead of starting one."""
    global _preforked
    to_server, from_agent = os.pipe()
    to_agent, from_server = os.pipe()
    agent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the server: never returns into the agent's code
        code = 1
        try:
            os.dup2(to_server, 0)
            os.dup2(from_server, 1)
            for fd in (to_server, from_agent, to_agent, from_server):
                os.close(fd)
            # What serve() reads and writes: the pipes, not the agent's streams; unbuffered, as a
            # started server's (PYTHONUNBUFFERED): its workers inherit them, and a worker killed
            # mid-run must have written what it printed.
            sys.stdin = open(0, closefd=False)
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
            os.setpgid(0, 0)  # its own process group, as a spawned server has
            die_with_parent()
            if os.getppid() == agent:
                code = warm_start.serve_when_sized(agent)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(to_server)
    os.close(from_server)
    _preforked = PreforkedServer(pid, os.fdopen(from_agent, "wb"), os.fdopen(to_agent, "rb"))


def _take_preforked() -> PreforkedServer | None:
    global _preforked
    server, _preforked = _preforked, None
    return server


class WarmPool:
    def __init__(self, size: int, enabled: bool = True, log: Path | None = None, imports: Sequence[str] = ()) -> None:
        """`size` 0 or `enabled` False: every worker starts cold. Enabling it makes this process a
        child subreaper (the forked workers become its children). A server this process forked
        already (`prefork_server`) is the first server, else one is started. `imports`: modules the
        server imports before it forks (the roles' warmImports)."""
        self.enabled = enabled and size > 0 and become_subreaper()
        self.size = size
        self.imports = list(imports)
        self.log = log
        self.spares: set[int] = set()  # the server's spares (our children once adopted), not yet handed out
        self.server: subprocess.Popen[bytes] | PreforkedServer | None = None
        self._lines: PipeLines | None = None
        self.ready = False
        self._start_after = 0.0
        # The agent's loop launches workers; its check and shadow-loader threads launch helpers.
        self._lock = threading.RLock()
        preforked = _take_preforked()
        if preforked is not None:
            self._adopt(preforked)
        self._env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}

    def maintain(self) -> None:
        """Start the server (again, after a pause, if it died); notice when it is ready."""
        with self._lock:
            self._maintain()

    def _maintain(self) -> None:
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
                    [
                        sys.executable,
                        "-m",
                        "stalwart.agents.warm_start",
                        "--spares",
                        str(self.size),
                        *(["--imports", ",".join(self.imports)] if self.imports else []),
                    ],
                    env=self._env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                )
                assert self.server.stdout is not None
                self._lines = PipeLines(self.server.stdout.fileno())
            finally:
                if not isinstance(stderr, int):
                    stderr.close()
        if self.server is not None and not self.ready:
            self.ready = self._reply(0.0) == "ready"
        elif self.server is not None:
            self._reply(0.0)  # the spares it announced while we asked for nothing

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> ChildProcess | None:
        """A forked worker running `argv`, or None (start it cold)."""
        if not warm_eligible(argv):
            return None
        return self._launch(argv, env, cwd, log, READY_WAIT_SECONDS)

    def launch_module(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        log: Path,
        ready_wait: float = HELPER_READY_WAIT_SECONDS,
    ) -> ChildProcess | None:
        """One of the agent's helpers, `python -m module args`, forked, or None (start it cold).
        `ready_wait`: how long to wait for a server that is still starting.

        Not for a role's command: a node whose roles fork nothing has no server (warm_size)."""
        return self._launch([sys.executable, "-m", module, *args], env, Path.cwd(), log, ready_wait)

    def _launch(
        self, argv: list[str], env: dict[str, str], cwd: Path, log: Path, ready_wait: float
    ) -> ChildProcess | None:
        if not self.enabled or import_time_env(env) != import_time_env(self._env):
            return None
        with self._lock:
            return self._request(LaunchRequest(argv=argv, env=env, cwd=str(cwd), log=str(log)), ready_wait)

    def _request(self, request: LaunchRequest, ready_wait: float) -> ChildProcess | None:
        self._maintain()
        if self.server is None or self.server.stdin is None:
            return None
        if not self.ready:
            self.ready = self._reply(ready_wait) == "ready"
            if not self.ready:
                return None
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
        assert self._lines is not None
        return self._lines.read(timeout)

    def _adopt(self, server: PreforkedServer) -> None:
        """Use a pre-forked server (told its spare count), or end it when we fork no workers."""
        assert server.stdin is not None and server.stdout is not None
        if not self.enabled:
            server.stdin.close()  # it exits: no request will come
            stop_process(server, grace=1.0)
            return
        try:
            server.stdin.write(f"spares {self.size} {','.join(self.imports)}".rstrip().encode() + b"\n")
            server.stdin.flush()
        except OSError:
            stop_process(server, grace=1.0)
            return
        self.server, self._lines = server, PipeLines(server.stdout.fileno())

    def _discard(self) -> None:
        if self.server is not None:
            stop_process(self.server, grace=1.0)
        self._reap_spares()
        self.server, self._lines, self.ready = None, None, False
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
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self.server is not None:
            if self.server.stdin is not None:
                try:
                    self.server.stdin.close()  # it leaves its loop and exits
                except OSError:
                    pass
            stop_process(self.server, grace=1.0)
        self._reap_spares()
        self.server, self._lines, self.ready = None, None, False
