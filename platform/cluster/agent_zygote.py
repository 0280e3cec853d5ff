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
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
from pydantic import BaseModel

from stalwart.processes import AdoptedProcess, PipeLines, spawn, stop_process

ZYGOTE_ENV = "STALWART_AGENT_ZYGOTE"  # "0": every agent starts cold
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


class ZygoteChild(AdoptedProcess):
    """A process the zygote forked for us, with Popen's interface. It is not our child: it is running
    while its pid has its start time (a zombie has exited), and its exit code is what it wrote to its
    exit file (-SIGKILL if it died without writing one)."""

    def __init__(self, pid: int, exit_file: Path) -> None:
        super().__init__(pid)
        self.exit_file = exit_file
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._proc = None

    def _running(self) -> bool:
        try:
            return (
                self._proc is not None
                and self._proc.is_running()
                and self._proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
            )
        except psutil.NoSuchProcess:
            return False

    def poll(self) -> int | None:
        if self.returncode is None and not self._running():
            try:
                self.returncode = int(self.exit_file.read_text())
            except (OSError, ValueError):
                self.returncode = -signal.SIGKILL
        return self.returncode


class AgentZygote:
    """Started on the first request, by the process that owns the cluster (it dies with it; the
    agents it forked do not: each leads its own session, as a cold agent does)."""

    def __init__(self, log: Path, env: Callable[[], dict[str, str]]) -> None:
        self.log = log
        self.env = env  # the zygote's environment, made when it starts
        self.enabled = os.environ.get(ZYGOTE_ENV, "1") != "0"
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: PipeLines | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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
            assert self._proc is not None and self._proc.stdin is not None and self._lines is not None
            try:
                self._proc.stdin.write(request.model_dump_json().encode() + b"\n")
                self._proc.stdin.flush()
            except OSError:
                self._give_up()
                return None
            reply = self._lines.read(REPLY_WAIT_SECONDS)
            if reply is None or not reply.isdigit() or int(reply) <= 0:
                self._give_up()
                return None
            return int(reply)

    def _ensure_started(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self._proc = spawn(
                [sys.executable, "-m", "stalwart.cli.zygote"],
                env=self.env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self._proc.stdout is not None
        self._lines = PipeLines(self._proc.stdout.fileno())
        if self._lines.read(READY_WAIT_SECONDS) != "ready":
            self._give_up()
            return False
        return True

    def _give_up(self) -> None:
        """A zygote that failed once is not trusted again: every later agent starts cold."""
        self.enabled = False
        self.close()

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()  # it exits; the agents it forked live on
                except OSError:
                    pass
            stop_process(self._proc, grace=2.0)
        self._proc, self._lines = None, None
