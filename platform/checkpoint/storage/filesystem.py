"""A local or shared filesystem: streamed writes with fsync, pread for ranged reads.

Writes reach the disk in large sequential pieces: torch.save's many small writes (headers, a
tensor's pickled description) are gathered into one buffer, and a tensor's bytes go straight
from the staging buffer to the file without another copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from stalwart.checkpoint.storage.base import ObjectWriter, Storage, StorageError

SMALL = 256 << 10  # a write under this is gathered...
GATHER = 4 << 20  # ...into a buffer written out at this size
PIECE = 64 << 20  # the largest single write() call


class _FileWriter(ObjectWriter):
    def __init__(self, storage: FileStorage, path: Path) -> None:
        self.storage = storage
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.pos = 0
        self.gathered = bytearray()

    def _write_out(self, view: memoryview) -> None:
        done = 0
        try:
            while done < len(view):
                done += os.write(self.fd, view[done : done + PIECE])
        except OSError as exc:
            raise StorageError(f"writing {self.path}: {exc.strerror}") from exc
        self.storage._count_written(done)

    def _flush(self) -> None:
        if self.gathered:
            self._write_out(memoryview(self.gathered))
            self.gathered.clear()

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        if len(view) < SMALL:
            self.gathered += view
            if len(self.gathered) >= GATHER:
                self._flush()
        else:
            self._flush()
            self._write_out(view)
        self.pos += len(view)
        return len(view)

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        try:
            self._flush()
            os.fsync(self.fd)
        except OSError as exc:
            raise StorageError(f"syncing {self.path}: {exc.strerror}") from exc
        finally:
            os.close(self.fd)

    def abort(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        self.path.unlink(missing_ok=True)


class FileStorage(Storage):
    read_parallelism = 2
    tier_rank = 50
    name = "file"

    def __init__(self, root: str | Path) -> None:
        super().__init__()
        self.root = Path(root)

    def _p(self, path: str) -> Path:
        return self.root / path

    def open_writer(self, path: str) -> ObjectWriter:
        try:
            return _FileWriter(self, self._p(path))
        except OSError as exc:
            raise StorageError(f"creating {self._p(path)}: {exc.strerror}") from exc

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        out = bytearray(length)
        self.read_range_into(path, offset, memoryview(out))
        return bytes(out)

    def read_range_into(self, path: str, offset: int, out: memoryview) -> None:
        p = self._p(path)
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"opening {p}: {exc.strerror}") from exc
        try:
            got = 0
            while got < len(out):
                n = os.preadv(fd, [out[got:]], offset + got)
                if n == 0:
                    raise StorageError(f"{p} is truncated: wanted bytes {offset}..{offset + len(out)}")
                got += n
        finally:
            os.close(fd)
        self._count_read(len(out))

    def write_bytes(self, path: str, data: bytes) -> None:
        p = self._p(path)
        tmp = p.with_name(p.name + ".tmp")
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)  # atomic: a reader sees the whole marker or none
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StorageError(f"writing {p}: {exc.strerror}") from exc
        self._count_written(len(data))

    def read_bytes(self, path: str) -> bytes | None:
        try:
            data = self._p(path).read_bytes()
        except FileNotFoundError:
            return None
        self._count_read(len(data))
        return data

    def list_dirs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def delete_dir(self, name: str) -> None:
        shutil.rmtree(self._p(name), ignore_errors=True)

    def describe(self, path: str = "") -> str:
        return str(self._p(path))
