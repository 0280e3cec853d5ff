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


def test_a_node_s_identity_is_its_pid_and_start_time(tmp_path: Path) -> None:
    """A forked agent has its zygote's command line: the start time written with its pid tells it from
    a process that reused the pid."""
    proc = spawn([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        c = cluster(tmp_path)
        pid_file = tmp_path / "nodes" / "node-0" / "agent.pid"
        pid_file.parent.mkdir(parents=True)
        pid_file.write_text(f"{proc.pid} {psutil.Process(proc.pid).create_time()!r}")
        assert c._pid("node-0") == proc.pid and c._alive(proc.pid, "node-0")
        pid_file.write_text(f"{proc.pid} 12.5")  # another process, long gone, had this pid
        assert not c._alive(proc.pid, "node-0")
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_under_a_machine_limit_a_node_waits_for_a_free_machine_and_a_killed_one_takes_its_machine(
    tmp_path: Path,
) -> None:
    """`stalwart run --max-nodes 2`: with both machines taken a third node is not started (as a pod stays
    Pending); a node killed as a machine keeps its machine out of the pool after it is stopped, until one
    is restored."""
    c = cluster(tmp_path)
    c.limit_machines(2)
    machine = spawn(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "--node", "node-1"],
        die_with_parent=True,
        new_session=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    try:
        for name, pid in (("node-0", 1), ("node-1", machine.pid)):  # two machines taken
            (tmp_path / "nodes" / name).mkdir(parents=True)
            (tmp_path / "nodes" / name / "agent.pid").write_text(str(pid))
        c.start_node("node-2")
        assert not (tmp_path / "nodes" / "node-2").exists()  # nothing started: no machine free

        assert c.kill_node("node-1")  # the machine dies with its node
        machine.wait()
        c.stop_node("node-1")  # the controller lets the dead node go: its machine does not come back
        capacity = c.capacity()
        assert capacity is not None and (capacity.max_nodes, capacity.lost, capacity.machines) == (2, 1, 1)
        c.start_node("node-2")
        assert not (tmp_path / "nodes" / "node-2").exists()

        restored = c.restore_machine()
        assert restored is not None and restored.machines == 2
        assert LocalCluster("j", "127.0.0.1:1", tmp_path, tmp_path).capacity() == restored  # in the run folder
    finally:
        if machine.poll() is None:
            machine.kill()
            machine.wait()


def test_without_a_machine_limit_the_cluster_has_no_capacity_record(tmp_path: Path) -> None:
    assert cluster(tmp_path).capacity() is None


def test_free_machines_counts_what_neither_a_live_node_nor_a_lost_machine_holds(tmp_path: Path) -> None:
    """What lets an elastic role shrink: 0 once every machine is lost or held by a live node."""
    c = cluster(tmp_path)
    assert c.free_machines() is None  # no limit: a replacement always comes
    c.limit_machines(2)
    assert c.free_machines() == 2
    machines = {
        name: spawn(
            [sys.executable, "-c", "import sys; sys.stdin.read()", "--node", name],
            die_with_parent=True,
            new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
        )
        for name in ("node-0", "node-1")
    }
    try:
        for name, proc in machines.items():
            (tmp_path / "nodes" / name).mkdir(parents=True)
            (tmp_path / "nodes" / name / "agent.pid").write_text(str(proc.pid))
        assert c.free_machines() == 0
        c.kill_node("node-1")  # its machine is lost with it, dead pid file or not
        machines["node-1"].wait()
        assert c.free_machines() == 0
        c.restore_machine()
        assert c.free_machines() == 1
    finally:
        for proc in machines.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
