"""Starting a server on a port this process bound and hands over, instead of one chosen free: a port
chosen free and bound by the server a moment later can be taken by another process in between (seen
in a loaded test suite: an agent's memory store found its port in use, and the workers asked another
program for their checkpoints)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from stalwart.net import listen_on
from stalwart.processes import spawn


def spawn_listening(argv: Sequence[str], host: str, **kwargs: Any) -> tuple[subprocess.Popen[bytes], int]:
    """Start a server (`spawn`'s keywords) listening on `host`, on a port bound here and handed over
    as `--listen-fd FD` (appended to argv; the server takes it with stalwart.net.inherited_listener).
    Returns the process and its port."""
    with listen_on(host, 0) as listening:
        fd = listening.fileno()
        proc = spawn([*argv, "--listen-fd", str(fd)], pass_fds=[fd], **kwargs)
        return proc, int(listening.getsockname()[1])
