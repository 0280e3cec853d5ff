"""A doorbell for the shadow loader: a named pipe beside its segment that clients write a byte to.

The loader's work arrives through shared memory (a request, a batch taken, a lane released), which
nothing announces: polling it every 10 ms cost an idle loader about 2% of a core, on every node. A
client now rings after each change, and the loader sleeps in `select` on the pipe until it rings or
its owner check is due. Ringing never blocks and never fails a client: with no loader listening (not
started, restarting) or a pipe already full of rings, the byte is dropped and the loader sees the
change at its next round, as before.
"""

from __future__ import annotations

import errno
import os
import select
import stat
from pathlib import Path

SUFFIX = ".bell"


def bell_path(segment_path: Path) -> Path:
    return segment_path.with_name(segment_path.name + SUFFIX)


def ring(path: Path) -> None:
    """Wake the loader listening on `path`, if one is."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # ENXIO: nobody listens; ENOENT: no loader made it yet
    try:
        os.write(fd, b"\0")
    except OSError:
        pass  # EAGAIN: rung plenty already
    finally:
        os.close(fd)


class Doorbell:
    """The loader's side. Opened read-write, so the pipe never reads as closed between clients."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            if not stat.S_ISFIFO(os.stat(path).st_mode):
                raise OSError(errno.EEXIST, "exists and is not a named pipe", str(path)) from None
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)

    def wait(self, timeout: float) -> bool:
        """Sleep until rung or `timeout` seconds; whether it rang. Every ring so far is consumed."""
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return False
        try:
            while os.read(self._fd, 4096):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        os.close(self._fd)
