"""Process hygiene: children die with their parent, groups stop together, and the orphan check works."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
from support.orphans import tagged_processes

from stalwart.processes import kill_session, spawn, stop_process, wait_for

SLEEPER = [sys.executable, "-c", "import time\nfor _ in range(600): time.sleep(0.1)"]


def test_the_orphan_check_sees_a_tagged_process() -> None:
    """Seen as soon as its environment can be read: spawn's trampoline execs the command, and in the
    middle of that exec /proc shows no environment (under load the moment lasts: failed a fresh clone)."""
    proc = spawn(SLEEPER)
    try:
        assert wait_for(lambda: proc.pid in {p.pid for p in tagged_processes()}, 60)
    finally:
        stop_process(proc, grace=2)
    assert proc.pid not in {p.pid for p in tagged_processes()}


def test_a_child_dies_with_its_parent() -> None:
    # The parent spawns a child with `spawn` and prints its pid; then we SIGKILL the parent.
    code = (
        "import sys, time\n"
        "from stalwart.processes import spawn\n"
        f"p = spawn({SLEEPER!r})\n"
        "print(p.pid, flush=True)\n"
        "for _ in range(600): time.sleep(0.1)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert psutil.pid_exists(child)
        parent.kill()
        parent.wait()
        assert wait_for(
            lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, 10
        )
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_stop_process_takes_the_whole_group() -> None:
    code = f"import subprocess, time\nsubprocess.Popen({SLEEPER!r})\nfor _ in range(600): time.sleep(0.1)\n"
    proc = spawn([sys.executable, "-c", code])
    assert wait_for(lambda: len(psutil.Process(proc.pid).children(recursive=True)) >= 1, 60)
    grandchildren = psutil.Process(proc.pid).children(recursive=True)
    stop_process(proc, grace=2)
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in grandchildren)


def test_kill_session_kills_a_whole_local_node() -> None:
    proc = spawn(SLEEPER, new_session=True, die_with_parent=False)
    try:
        assert os.getsid(proc.pid) == proc.pid
        killed = kill_session(proc.pid)
        assert proc.pid in killed
        proc.wait(timeout=10)  # kill_session reaps it (the return code is then lost to Popen)
        assert not psutil.pid_exists(proc.pid)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
