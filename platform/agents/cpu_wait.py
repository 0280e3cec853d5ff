"""How long the calling thread has waited for a CPU: ready to run while other processes held every core.

Linux keeps it per thread (the scheduler's run delay, the second field of /proc/self/task/TID/schedstat,
in nanoseconds); elsewhere, or where the kernel keeps no scheduler statistics, there is no answer.
StepTimer reads it around each phase, so that the straggler scores can leave it out of a rank's own
work: on a host with more runnable processes than cores, which rank a core goes to first after a
collective is the scheduler's choice, and a rank that waited for it is not a slow rank.

Light on purpose (a training process imports it and reads it a few times a step): one open file per
thread, kept in the thread's own storage, and one pread per call, the only system call (the thread's
and the process's ids, each a system call, are read once per thread; a forked child forgets the
parent's files).
"""

from __future__ import annotations

import os
import threading


class _Schedstat:
    """A thread's schedstat, open while the thread (and its thread-local storage) lives."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        try:
            self.fd = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1  # none to read

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


_opened = threading.local()  # .file: this thread's _Schedstat


def cpu_wait() -> float | None:
    """Seconds this thread has spent runnable but not running since it started (None: not known)."""
    file: _Schedstat | None = getattr(_opened, "file", None)
    if file is None:
        file = _opened.file = _Schedstat()
    if file.fd < 0:
        return None
    try:
        return int(os.pread(file.fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _forget_in_child() -> None:
    """A forked child's thread is not its parent's: its file names the parent's thread (closed here)."""
    global _opened
    _opened = threading.local()


os.register_at_fork(after_in_child=_forget_in_child)
