"""Checksums for data files the loader does not write itself (Megatron .bin/.idx, Hugging Face files).

A sidecar holds one xxh3-64 per block of a file, computed once when the index is built; a reader verifies
exactly the blocks it touches, on first touch, so corruption is refused at any position without a full
scan at every (re)start. Sidecars and indexes are written atomically, under a lock, so ranks that open
the same source at once build it once.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from stalwart.dataloader.errors import ShardError

BLOCK_BYTES = 1 << 20
_CHUNK = 1 << 22


def file_digest(path: Path) -> str:
    """xxh3-64 of a whole file, streamed."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def block_sums(path: Path, block_bytes: int = BLOCK_BYTES) -> list[int]:
    out = []
    with open(path, "rb") as f:
        while chunk := f.read(block_bytes):
            out.append(xxhash.xxh3_64_intdigest(chunk))
    return out


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` plus a digest of itself, so a damaged sidecar is refused rather than trusted."""
    body = json.dumps(payload, sort_keys=True)
    doc = {"payload": payload, "xxh3": xxhash.xxh3_64_hexdigest(body.encode())}
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json_checked(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        payload, digest = doc["payload"], doc["xxh3"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(path, f"not a readable index/checksum file ({exc}); delete it to rebuild") from None
    if xxhash.xxh3_64_hexdigest(json.dumps(payload, sort_keys=True).encode()) != digest:
        raise ShardError(path, "index/checksum file is corrupted (its own xxh3 does not match); delete it to rebuild")
    return dict(payload)


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """An exclusive lock beside `path`: one process builds, the others wait and then read its result."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class CheckedBytes:
    """A read-only memory map of a file whose blocks are verified against their sums on first read."""

    def __init__(self, path: Path, sums: list[int], block_bytes: int) -> None:
        self.path = path
        self.block_bytes = block_bytes
        self._sums = sums
        self.size = path.stat().st_size
        if -(-self.size // block_bytes) != len(sums):
            raise ShardError(path, f"size {self.size} bytes does not match its checksum sidecar ({len(sums)} blocks)")
        self.data = np.memmap(path, dtype=np.uint8, mode="r") if self.size else np.zeros(0, np.uint8)
        self._verified = np.zeros(len(sums), dtype=bool)

    def check(self, lo: int, hi: int) -> None:
        """Verify every block overlapping bytes [lo, hi)."""
        bb = self.block_bytes
        for block in range(lo // bb, (hi - 1) // bb + 1):
            if self._verified[block]:
                continue
            got = xxhash.xxh3_64_intdigest(self.data[block * bb : (block + 1) * bb].tobytes())
            if got != self._sums[block]:
                raise ShardError(
                    self.path,
                    f"corrupted data in block {block} (bytes {block * bb}..{min((block + 1) * bb, self.size) - 1}): "
                    f"xxh3 {got:#018x}, expected {self._sums[block]:#018x}",
                )
            self._verified[block] = True

    def close(self) -> None:
        mm = getattr(self.data, "_mmap", None)
        del self.data
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass
