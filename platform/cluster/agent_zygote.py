"""The local cluster's side of the agent zygote (stalwart.cli.zygote): node agents, and the ranks of
the collective checks, started by fork.

A local node used to cost a cold `stalwart agent` (the platform's imports) and then its fork server
(torch's): about 3 CPU-seconds per node, a fifth of the end-to-end suite and seconds of a hot-swap on
a loaded machine. The zygote imports both once per cluster and forks each node's agent, which forks
its fork server from itself: a node then costs two forks. Wherever the zygote cannot serve (it died,
it is not ready in time, `STALWART_AGENT_ZYGOTE=0`), the node's agent starts cold, as before.

The pre-flight and stop-time checks' ranks import torch too (2.5 CPU-seconds each, a check of 4
ranks 10): the zygote forks them as well. They are its children, not their requester's, so each
writes its exit code to a file for the requester (ZygoteChild).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psutil
from pydantic import BaseModel

from stalwart.processes import AdoptedProcess, PipeLines, spawn, stop_process, wait_for

ZYGOTE_ENV = "STALWART_AGENT_ZYGOTE"  # "0": every agent starts cold; a path: attach to a shared zygote
READY_WAIT_SECONDS = 60.0  # a cold agent would spend this importing; past it, agents start cold
REPLY_WAIT_SECONDS = 10.0


class ForkRequest(BaseModel):
    """One process to fork, with its environment and log file: a node's agent (`stalwart ARGS`) when
    `entry` is empty, else `entry` (`module:function`, returning an exit code) with ARGS as its
    command line, dying with the zygote and writing its exit code to `exit_file`."""

    args: list[str]
    env: dict[str, str]
    log: str
    entry: str = ""
    exit_file: str = ""


class ZygoteSession(BaseModel):
    """What a cluster attaching to a shared zygote sends first: its session zygote takes the folder
    and log, and refuses a session whose import-time environment differs from the imports it has."""

    cwd: str
    log: str
    env: dict[str, str]


def running(proc: psutil.Process | None) -> bool:
    """A process that is not our child is running: its pid, with its start time, and not a zombie."""
    try:
        return (
            proc is not None and proc.is_running() and proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        )
    except psutil.NoSuchProcess:
        return False


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


class ZygoteChild(AdoptedProcess):
    """A process the zygote forked for us, with Popen's interface. It is not our child: it is running
    while its pid has its start time (a zombie has exited), and its exit code is what it wrote to its
    exit file (-SIGKILL if it died without writing one)."""

    def __init__(self, pid: int, exit_file: Path) -> None:
        super().__init__(pid)
        self.exit_file = exit_file
        self._proc = _process(pid)

    def poll(self) -> int | None:
        if self.returncode is None and not running(self._proc):
            try:
                self.returncode = int(self.exit_file.read_text())
            except (OSError, ValueError):
                self.returncode = -signal.SIGKILL
        return self.returncode


class ZygoteLink(Protocol):
    """Our end of a zygote: request lines out, reply lines in."""

    pid: int  # the zygote that forks for us (its forks' parent)
    lines: PipeLines

    def alive(self) -> bool: ...

    def send(self, line: bytes) -> bool: ...

    def close(self) -> None: ...


class SpawnedZygote:
    """A zygote of our own, our child: its stdin and stdout are the link."""

    def __init__(self, log: Path, env: dict[str, str]) -> None:
        with open(log, "ab") as out:
            self.proc = spawn(
                [sys.executable, "-m", "stalwart.cli.zygote"],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
            )
        assert self.proc.stdout is not None
        self.pid = self.proc.pid
        self.lines = PipeLines(self.proc.stdout.fileno())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: bytes) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # it exits; the agents it forked live on
            except OSError:
                pass
        stop_process(self.proc, grace=2.0)


class AttachedZygote:
    """A session zygote of a shared zygote: a connection to it is the link, and closing the
    connection ends it (its check ranks with it), as closing a spawned zygote's stdin does."""

    def __init__(self, sock: socket.socket, pid: int, lines: PipeLines) -> None:
        self.sock, self.pid, self.lines = sock, pid, lines
        self._proc = _process(pid)

    @classmethod
    def connect(cls, path: str, session: ZygoteSession) -> AttachedZygote | str:
        """The attached link, or why there is none."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(REPLY_WAIT_SECONDS)
            sock.connect(path)
            sock.sendall(session.model_dump_json().encode() + b"\n")
            sock.setblocking(True)
        except OSError as exc:
            sock.close()
            return f"cannot reach it ({exc})"
        lines = PipeLines(sock.fileno())
        reply = lines.read(REPLY_WAIT_SECONDS) or "no answer"
        word, _, pid = reply.partition(" ")
        if word != "ready" or not pid.isdigit():
            sock.close()
            return reply
        return cls(sock, int(pid), lines)

    def alive(self) -> bool:
        return not self.lines.closed and running(self._proc)

    def send(self, line: bytes) -> bool:
        try:
            self.sock.sendall(line)
            return True
        except OSError:
            return False

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        wait_for(lambda: not running(self._proc), 2.0)  # it exits at once, its check ranks with it


class AgentZygote:
    """Started on the first request, by the process that owns the cluster (it dies with it; the
    agents it forked do not: each leads its own session, as a cold agent does)."""

    def __init__(self, log: Path, env: Callable[[], dict[str, str]]) -> None:
        self.log = log
        self.env = env  # the zygote's environment, made when it starts
        setting = os.environ.get(ZYGOTE_ENV, "1")
        self.enabled = setting != "0"
        self.shared = setting if os.sep in setting else None  # a shared zygote's socket
        self._link: ZygoteLink | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._link is not None and self._link.alive()

    @property
    def pid(self) -> int | None:
        """The process that forks for us (the parent of what it forks), once started."""
        return self._link.pid if self._link is not None else None

    def start_agent(self, request: ForkRequest) -> int | None:
        """The forked agent's pid, or None: start it cold."""
        return self._fork(request)

    def start_entry(self, entry: str, env: dict[str, str], log: Path) -> ZygoteChild | None:
        """`entry` forked by a zygote that is already running (one started from a short-lived thread
        would die with it: PR_SET_PDEATHSIG), or None: start it cold."""
        if not self.running:
            return None
        exit_file = log.with_name(log.name + ".exit")
        exit_file.unlink(missing_ok=True)
        pid = self._fork(ForkRequest(args=[], env=env, log=str(log), entry=entry, exit_file=str(exit_file)))
        return ZygoteChild(pid, exit_file) if pid is not None else None

    def _fork(self, request: ForkRequest) -> int | None:
        with self._lock:
            if not self.enabled or not self._ensure_started():
                return None
            assert self._link is not None
            if not self._link.send(request.model_dump_json().encode() + b"\n"):
                self._give_up()
                return None
            reply = self._link.lines.read(REPLY_WAIT_SECONDS)
            if reply is None or not reply.isdigit() or int(reply) <= 0:
                self._give_up()
                return None
            return int(reply)

    def _ensure_started(self) -> bool:
        if self.running:
            return True
        self.close()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        env = self.env()
        if self.shared is not None:
            attached = AttachedZygote.connect(self.shared, ZygoteSession(cwd=os.getcwd(), log=str(self.log), env=env))
            if not isinstance(attached, str):
                self._link = attached
                return True
            with open(self.log, "a") as log:
                log.write(f"stalwart agent zygote: not attached to {self.shared}: {attached}; starting our own\n")
            self.shared = None  # one try: from now on, a zygote of our own
        spawned = SpawnedZygote(self.log, env)
        self._link = spawned
        reply = spawned.lines.read(READY_WAIT_SECONDS)
        if reply is None or reply.split(" ")[0] != "ready":
            self._give_up()
            return False
        return True

    def _give_up(self) -> None:
        """A zygote that failed once is not trusted again: every later agent starts cold."""
        self.enabled = False
        self.close()

    def close(self) -> None:
        if self._link is not None:
            self._link.close()
        self._link = None
