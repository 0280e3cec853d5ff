"""Which processes this test session started: every process the suite starts inherits
STALWART_TEST_SESSION, so a live one carrying this session's value at the end is an orphan.
(psutil reads a process's environment as it was at exec: an xdist worker still carries the
controller's tag, its children carry the worker's.)"""

from __future__ import annotations

import os
import uuid

import psutil

SESSION_TAG = "STALWART_TEST_SESSION"
# In the environment of a pytest worker's rank host (support.ranks) and so of its fork server: the
# server forks its spares whenever it likes, in the middle of another test's `stalwart run`.
RANK_HOST_MARK = "STALWART_TEST_RANK_HOST"
if "PYTEST_XDIST_WORKER" in os.environ:
    # Each xdist worker checks its own children only (they all inherit the controller's tag).
    os.environ[SESSION_TAG] = uuid.uuid4().hex
else:
    os.environ.setdefault(SESSION_TAG, uuid.uuid4().hex)


def cmdline(p: psutil.Process) -> str:
    """A process's command line, or '' once it is gone (it may exit between listing and asking)."""
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def tagged_processes() -> list[psutil.Process]:
    """Live processes (other than this one) started under this test session."""
    return _tagged(with_rank_host=True)


def started_since(before: set[int]) -> list[psutil.Process]:
    """This session's live processes whose pids are not in `before`, less the rank host's: what a
    command run in between left behind."""
    return [p for p in _tagged(with_rank_host=False) if p.pid not in before]


def _tagged(with_rank_host: bool) -> list[psutil.Process]:
    tag = os.environ[SESSION_TAG]
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            env = p.environ()
            if env.get(SESSION_TAG) == tag and (with_rank_host or RANK_HOST_MARK not in env):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out
