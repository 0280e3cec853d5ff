"""Starting and stopping child processes so that none outlives its owner.

Two mechanisms: PR_SET_PDEATHSIG (the kernel kills a child when the thread that started it dies),
and each child in its own process group, so that stopping it also stops whatever it started.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

import psutil

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stdout: IO[bytes] | int | None = None,
    stderr: IO[bytes] | int | None = subprocess.STDOUT,
    die_with_parent: bool = True,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (or session), killed with us unless told otherwise."""
    return subprocess.Popen(
        list(argv),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        preexec_fn=_die_with_parent if die_with_parent else None,
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


def kill_session(sid: int) -> list[int]:
    """SIGKILL every process in session `sid` (a local 'node'); returns the pids signalled."""
    victims: list[psutil.Process] = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                victims.append(p)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    kill_all(victims)
    return [p.pid for p in victims]


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:  # type: ignore[no-untyped-def]
    """Poll predicate() until true or `timeout` seconds pass. Bounded by design."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
