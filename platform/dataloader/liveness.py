"""Is a process (pid + start time, so a reused pid does not count) still alive? Same node only."""

from __future__ import annotations

import psutil


def start_ms(pid: int) -> int:
    """The process's start time in milliseconds since the epoch; 0 if it is gone."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except psutil.Error:
        return 0


def alive(pid: int, started_ms: int) -> bool:
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if started_ms and int(proc.create_time() * 1000) != started_ms:
            return False
        return proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False
