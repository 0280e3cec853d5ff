"""Starting and stopping child processes so that none outlives its owner.

Two mechanisms: PR_SET_PDEATHSIG (the kernel kills a child when the thread that started it dies),
and each child in its own process group, so that stopping it also stops whatever it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

# A child must die with the thread that started it. PR_SET_PDEATHSIG does that, but setting it from
# a preexec_fn runs Python (and gRPC's at-fork handlers) between fork and exec, which aborts children
# of a process with live gRPC threads. So a tiny trampoline sets it, checks the parent is still
# there (closing the race), and execs the real command: the setting survives exec.
_TRAMPOLINE = (
    "import ctypes,os,sys\n"
    "ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(137)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = subprocess.STDOUT,
    die_with_parent: bool = True,
    new_session: bool = False,
    stdin: int | None = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (or session), killed with us unless told otherwise."""
    command = list(argv)
    if die_with_parent:
        command = [sys.executable, "-S", "-c", _TRAMPOLINE, str(os.getpid()), *command]
    return subprocess.Popen(
        command,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
        process_group=None if new_session else 0,
    )


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int | None:
    """SIGTERM the child's process group, wait up to `grace`, then SIGKILL it and every descendant."""
    if proc.poll() is not None:
        return proc.returncode
    kids = descendants(proc.pid)
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    kill_all(kids)
    return proc.returncode


def kill_all(procs: Sequence[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(procs), timeout=5)


def _session(sid: int) -> list[psutil.Process]:
    members: list[psutil.Process] = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return members


def kill_session(sid: int) -> list[int]:
    """SIGKILL every process in session `sid` (a local 'node'); returns the pids signalled."""
    victims = _session(sid)
    kill_all(victims)
    return [p.pid for p in victims]


def signal_session(sid: int, sig: int) -> list[int]:
    """Send `sig` to every process in session `sid`; returns the pids signalled."""
    out = []
    for p in _session(sid):
        try:
            p.send_signal(sig)
            out.append(p.pid)
        except psutil.NoSuchProcess:
            continue
    return out


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    """Poll predicate() until true or `timeout` seconds pass. Bounded by design."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
