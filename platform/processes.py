"""Starting and stopping child processes so that none outlives its owner.

Two mechanisms: PR_SET_PDEATHSIG (the kernel kills a child when the thread that started it dies),
and each child in its own process group, so that stopping it also stops whatever it started.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

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
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (or session), killed with us unless told otherwise.
    `pass_fds` stay open in the child (a listening socket handed over, say)."""
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
        pass_fds=tuple(pass_fds),
    )


class ChildProcess(Protocol):
    """What the agent needs of a worker process: a Popen, or a child adopted from the fork server."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def die_with_parent() -> None:
    """From now on the kernel SIGKILLs this process when its parent (thread) dies. Check the parent
    afterwards: one that died before this call has left us with a new parent, and no signal comes."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def become_subreaper() -> bool:
    """Orphans of our descendants become our children (Linux). The fork server's workers are its
    grandchildren: this is how they become the agent's own children, which it waits for like any."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class AdoptedProcess:
    """A child this process did not start itself (an orphan reparented to us, a subreaper), with
    Popen's interface: `returncode` is the exit code, or -N for a signal, as Popen's is."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours (never adopted, or reaped elsewhere): gone to us
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


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


def stop_process(proc: ChildProcess, grace: float = 5.0) -> int | None:
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


class PipeLines:
    """Lines from a pipe, each waited for within a bound: a peer that says nothing (or exits) never
    blocks its reader. `closed` tells an ended pipe from a quiet one."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.closed = False
        self._buffer = b""

    def read(self, timeout: float | None) -> str | None:
        """The next line (stripped) within `timeout` seconds (None: however long it takes); None if
        none came or the pipe closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.closed or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                self.closed = True  # it exited
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()
