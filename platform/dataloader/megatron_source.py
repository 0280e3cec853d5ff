"""A source over Megatron indexed datasets (MMapIndexedDataset: a `.bin` of tokens, an `.idx` beside it).

The `.idx` is read here with numpy (header, dtype, sizes, pointers, document index), so a worker needs no
megatron-core. Sequences must lie back to back in the `.bin` (as Megatron's builder writes them): the file
is then one token stream, packed into windows of seq_len + 1 like a `.stok` shard, and window i is read
by offset, O(1) at any position. Checks: a sidecar `<name>.bin.stwsum.json` (built once, on first open or
by `stalwart data index`) holds the `.idx`'s xxh3 and one xxh3 per MiB of the `.bin`; the `.idx` is
verified at open, each `.bin` block on its first read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import xxhash

from stalwart.dataloader.checksums import (
    BLOCK_BYTES,
    CheckedBytes,
    block_sums,
    build_lock,
    file_digest,
    read_json_checked,
    write_json_atomic,
)
from stalwart.dataloader.errors import ShardError

IDX_MAGIC = b"MMIDIDX\x00\x00"
_HEAD = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document count
DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    8: np.dtype("<u2"),
}
SIDECAR_SUFFIX = ".stwsum.json"


class MegatronIndex:
    """The parsed `.idx`: token dtype, per-sequence sizes and byte pointers, the document index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        raw = path.read_bytes()
        if len(raw) < _HEAD.size:
            raise ShardError(path, f"truncated Megatron index: {len(raw)} bytes")
        magic, version, code, n_seq, n_doc = _HEAD.unpack_from(raw)
        if magic != IDX_MAGIC:
            raise ShardError(path, f"not a Megatron index (magic {magic!r})")
        if version != 1:
            raise ShardError(path, f"Megatron index version {version}; this reader knows version 1")
        if code not in DTYPES:
            raise ShardError(path, f"token dtype code {code} is not an integer dtype this loader reads")
        self.dtype = DTYPES[code]
        need = _HEAD.size + 4 * n_seq + 8 * n_seq + 8 * n_doc
        if len(raw) < need:
            raise ShardError(path, f"truncated Megatron index: {len(raw)} bytes, the header needs {need}")
        off = _HEAD.size
        self.sizes = np.frombuffer(raw, dtype="<i4", count=n_seq, offset=off)
        self.pointers = np.frombuffer(raw, dtype="<i8", count=n_seq, offset=off + 4 * n_seq)
        self.document_indices = np.frombuffer(raw, dtype="<i8", count=n_doc, offset=off + 12 * n_seq)
        self.token_count = int(self.sizes.sum(dtype=np.int64))
        expected = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)[:-1]]) * self.dtype.itemsize
        if n_seq and not np.array_equal(self.pointers, expected):
            raise ShardError(
                path, "sequences are not stored back to back in the .bin; rewrite it with Megatron's builder"
            )


def sidecar_path(bin_path: Path, index_dir: str | None) -> Path:
    folder = Path(index_dir) if index_dir else bin_path.parent
    return folder / (bin_path.name + SIDECAR_SUFFIX)


def ensure_sidecar(bin_path: Path, index_dir: str | None, *, rebuild: bool = False) -> dict[str, object]:
    """The checksum sidecar for one `.bin`/`.idx` pair, built once (under a lock) if missing."""
    side = sidecar_path(bin_path, index_dir)
    with build_lock(side):
        if rebuild or not side.exists():
            idx = bin_path.with_suffix(".idx")
            for p in (bin_path, idx):
                if not p.is_file():
                    raise ShardError(p, "no such file (a Megatron dataset needs both .bin and .idx)")
            write_json_atomic(
                side,
                {
                    "bin_size": bin_path.stat().st_size,
                    "idx_xxh3": file_digest(idx),
                    "block_bytes": BLOCK_BYTES,
                    "block_xxh3": block_sums(bin_path, BLOCK_BYTES),
                },
            )
    return read_json_checked(side)


class _BinFile:
    def __init__(self, bin_path: Path, index_dir: str | None) -> None:
        self.path = bin_path
        side = ensure_sidecar(bin_path, index_dir)
        idx_path = bin_path.with_suffix(".idx")
        if file_digest(idx_path) != side["idx_xxh3"]:
            raise ShardError(idx_path, "corrupted or changed since its checksums were taken (xxh3 does not match)")
        self.index = MegatronIndex(idx_path)
        self.bytes = CheckedBytes(bin_path, list(side["block_xxh3"]), int(side["block_bytes"]))  # type: ignore[call-overload]
        itemsize = self.index.dtype.itemsize
        if self.bytes.size != self.index.token_count * itemsize:
            raise ShardError(
                bin_path, f"{self.bytes.size} bytes, the .idx describes {self.index.token_count} tokens of {itemsize}"
            )
        sums = json.dumps(side["block_xxh3"]).encode()
        self.digest = f"{side['idx_xxh3']}-{xxhash.xxh3_64_hexdigest(sums)}"  # the data, not the paths

    def read(self, start: int, length: int) -> np.ndarray:
        isz = self.index.dtype.itemsize
        lo, hi = start * isz, (start + length) * isz
        self.bytes.check(lo, hi)
        return self.bytes.data[lo:hi].view(self.index.dtype)

    def close(self) -> None:
        self.bytes.close()


class MegatronSource:
    """Same interface as TokenSource: num_samples windows, read(index, out), content_key(), close()."""

    def __init__(self, name: str, paths: Sequence[Path], seq_len: int, index_dir: str | None = None) -> None:
        self.name, self.seq_len = name, seq_len
        self.files: list[_BinFile] = []
        try:
            for path in paths:
                self.files.append(_BinFile(path, index_dir))
        except BaseException:
            self.close()
            raise
        windows = [max(0, (f.index.token_count - 1) // seq_len) for f in self.files]
        self._first = np.concatenate([[0], np.cumsum(windows, dtype=np.int64)])
        self.num_samples = int(self._first[-1])

    def read(self, index: int, out: np.ndarray) -> None:
        i = int(np.searchsorted(self._first, index, side="right") - 1)
        start = (index - int(self._first[i])) * self.seq_len
        out[:] = self.files[i].read(start, self.seq_len + 1)

    def content_key(self) -> list[tuple[int, str, str]]:
        return [(f.index.token_count, f.digest, str(f.index.dtype)) for f in self.files]

    def close(self) -> None:
        for f in self.files:
            f.close()
