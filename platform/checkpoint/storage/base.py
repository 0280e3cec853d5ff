"""What the checkpoint engine needs from a place to keep bytes: streamed writes, ranged reads.

Paths are '/'-separated and relative to the storage's root (a folder, a bucket prefix, a memory
namespace). Every implementation counts the bytes it reads, so tests and benchmarks can check that
a resharded load reads only what it needs.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod


class StorageError(RuntimeError):
    """A storage operation failed; the message names the storage, the path and the cause."""


class ObjectWriter(ABC):
    """A file being written. Nothing is visible to readers of a checkpoint until its commit marker."""

    @abstractmethod
    def write(self, data: bytes | memoryview) -> int: ...

    @abstractmethod
    def tell(self) -> int: ...

    @abstractmethod
    def close(self) -> None:
        """Finish and make durable (fsync, complete the multipart upload...)."""

    @abstractmethod
    def abort(self) -> None:
        """Throw away what was written."""


class Storage(ABC):
    #: smaller is faster; loading prefers the fastest tier that has the newest checkpoint
    tier_rank: int = 100
    name: str = "storage"
    #: concurrent ranged reads worth issuing: a disk gains little from more, S3 hides latency with them
    read_parallelism: int = 4
    #: where a request costs more than reading past a gap of up to this many bytes, a load merges
    #: ranged reads of one file that lie this close into one (None: every range is its own read)
    coalesce_gap: int | None = None

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.bytes_written = 0

    def _count_read(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def _count_written(self, n: int) -> None:
        with self._lock:
            self.bytes_written += n

    @abstractmethod
    def open_writer(self, path: str) -> ObjectWriter: ...

    @abstractmethod
    def read_range(self, path: str, offset: int, length: int) -> bytes: ...

    def read_range_into(self, path: str, offset: int, out: memoryview) -> None:
        """Read len(out) bytes at `offset` into `out` (a tier that can, avoids the copy)."""
        out[:] = self.read_range(path, offset, len(out))

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a small object in one go, atomically where the medium allows."""

    @abstractmethod
    def read_bytes(self, path: str) -> bytes | None:
        """A small object, or None if it does not exist."""

    @abstractmethod
    def list_dirs(self) -> list[str]:
        """Top-level folder names (one per checkpoint)."""

    @abstractmethod
    def delete_dir(self, name: str) -> None: ...

    def describe(self, path: str = "") -> str:
        return f"{self.name}:{path}"
