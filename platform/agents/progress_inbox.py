"""The agent's end of the worker SDK's socket: a non-blocking Unix datagram socket."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from pydantic import ValidationError

from stalwart.store.records import ProgressReport


class ProgressInbox:
    def __init__(self) -> None:
        # Unix socket paths are limited to ~108 bytes, so it lives in a short temp dir, not the run dir.
        self._dir = tempfile.mkdtemp(prefix="stw-")
        self.path = str(Path(self._dir) / "progress.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.setblocking(False)

    def drain(self, limit: int = 10_000) -> list[ProgressReport]:
        """Every report waiting now (bounded), skipping malformed datagrams."""
        out: list[ProgressReport] = []
        for _ in range(limit):
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                break
            for line in data.split(b"\n"):  # a datagram holds one report or several (the worker SDK's round)
                try:
                    out.append(ProgressReport.loads(line))
                except ValidationError:
                    continue
        return out

    def close(self) -> None:
        self._sock.close()
        for p in (self.path,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            os.rmdir(self._dir)
        except OSError:
            pass
