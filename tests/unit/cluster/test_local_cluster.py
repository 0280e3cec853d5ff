"""LocalCluster's view of its nodes: a node it started is alive until its agent is gone, even in
the instant its agent is still inside execve (a loaded host showed that window as a dead node, and
the controller replaced every node of a job before it joined)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stalwart.cluster.local import LocalCluster
from stalwart.processes import spawn


def cluster(tmp_path: Path) -> LocalCluster:
    return LocalCluster("j", "127.0.0.1:1", tmp_path, tmp_path)


def test_a_node_is_alive_while_its_process_runs_with_its_name(tmp_path: Path) -> None:
    proc = spawn(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "--node", "node-0"],
        die_with_parent=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        c = cluster(tmp_path)
        assert c._alive(proc.pid, "node-0")
        # Past execve (until then the command line reads empty and any name passes).
        for _ in range(6000):
            if psutil.Process(proc.pid).cmdline():
                break
            time.sleep(0.01)
        assert not c._alive(proc.pid, "node-1")  # a reused pid is some other process
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    assert not cluster(tmp_path)._alive(proc.pid, "node-0")


def test_an_agent_inside_execve_is_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In execve the command line reads empty: the process is there, its arguments not yet."""

    class InExec:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def status(self) -> str:
            return psutil.STATUS_RUNNING

        def cmdline(self) -> list[str]:
            return []

    monkeypatch.setattr(psutil, "Process", InExec)
    assert cluster(tmp_path)._alive(12345, "node-0")
