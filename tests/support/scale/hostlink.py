"""How the bench and the simulated cluster reach the node-simulator processes: one JSON object per
line over a Unix socket, request then reply. Not part of the control plane: the controller only
ever sees these processes through the `Cluster` interface and the agents' etcd keys."""

from __future__ import annotations

import json
import socket
import threading
import zlib
from typing import Any


class HostError(RuntimeError):
    """A simulator process answered with an error, or not at all."""


def host_for(node: str, hosts: int) -> int:
    """Which simulator process holds `node`: a stable hash, so every caller agrees without asking."""
    return zlib.crc32(node.encode()) % hosts


class HostLink:
    """A blocking client for one simulator process; safe to share between threads."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: Any = None

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self._sock, self._reader = sock, sock.makefile("rb")

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        with self._lock:
            try:
                if self._sock is None:
                    self._connect()
                assert self._sock is not None
                self._sock.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
                line = self._reader.readline()
            except OSError as exc:
                self.close_unlocked()
                raise HostError(f"simulator at {self.path} did not answer {op!r}: {exc}") from None
            if not line:
                self.close_unlocked()
                raise HostError(f"simulator at {self.path} closed the connection during {op!r}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise HostError(f"simulator at {self.path} refused {op!r}: {reply['error']}")
        return reply

    def close_unlocked(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._reader = None, None

    def close(self) -> None:
        with self._lock:
            self.close_unlocked()
