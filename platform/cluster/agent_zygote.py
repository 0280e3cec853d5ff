"""The local cluster's side of the agent zygote (stalwart.cli.zygote): node agents started by fork.

A local node used to cost a cold `stalwart agent` (the platform's imports) and then its fork server
(torch's): about 3 CPU-seconds per node, a fifth of the end-to-end suite and seconds of a hot-swap on
a loaded machine. The zygote imports both once per cluster and forks each node's agent, which forks
its fork server from itself: a node then costs two forks. Wherever the zygote cannot serve (it died,
it is not ready in time, `STALWART_AGENT_ZYGOTE=0`), the node's agent starts cold, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from stalwart.processes import PipeLines, spawn, stop_process

ZYGOTE_ENV = "STALWART_AGENT_ZYGOTE"  # "0": every agent starts cold
READY_WAIT_SECONDS = 60.0  # a cold agent would spend this importing; past it, agents start cold
REPLY_WAIT_SECONDS = 10.0


class StartAgent(BaseModel):
    """One node's agent: its `stalwart` arguments, environment and log file."""

    args: list[str]
    env: dict[str, str]
    log: str


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

    def start_agent(self, request: StartAgent) -> int | None:
        """The forked agent's pid, or None: start it cold."""
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
