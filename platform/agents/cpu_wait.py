"""How long the calling thread has waited for a CPU: ready to run while other processes held every core.

Linux keeps it per thread (the scheduler's run delay, the second field of /proc/self/task/TID/schedstat,
in nanoseconds); elsewhere, or where the kernel keeps no scheduler statistics, there is no answer.
StepTimer reads it around each phase, so that the straggler scores can leave it out of a rank's own
work: on a host with more runnable processes than cores, which rank a core goes to first after a
collective is the scheduler's choice, and a rank that waited for it is not a slow rank.

Light on purpose (a training process imports it): one open file per thread, one pread per call.
"""

from __future__ import annotations

import os
import threading

_files: dict[tuple[int, int], int] = {}  # (pid, thread id) -> its schedstat, open (-1: none to read)


def cpu_wait() -> float | None:
    """Seconds this thread has spent runnable but not running since it started (None: not known)."""
    key = (os.getpid(), threading.get_native_id())  # a forked child's threads are not its parent's
    fd = _files.get(key)
    if fd is None:
        try:
            fd = os.open(f"/proc/self/task/{key[1]}/schedstat", os.O_RDONLY)
        except OSError:
            fd = -1
        _files[key] = fd
    if fd < 0:
        return None
    try:
        return int(os.pread(fd, 128, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
