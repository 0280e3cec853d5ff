"""Serialize one rank's staged items into one file, in DCP's format, recording where the raw bytes are.

Each tensor is written as DCP writes it (a torch.save blob), so plain `dcp.load` reads the
checkpoint. Inside that blob the tensor's bytes are stored uncompressed and row-major; we record
their offset and block checksums so a resharding load can read and verify just the ranges it needs.
"""

from __future__ import annotations

import io
import struct
from typing import IO, cast

import torch
import xxhash
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from stalwart.checkpoint.manifest import BLOCK_SIZE, ObjectEntry, ShardEntry
from stalwart.checkpoint.storage.base import ObjectWriter


class _RecordLocator:
    """Passes torch.save's writes through to storage, noting where the tensor's bytes land.

    torch.save emits a tensor's storage as one write of exactly its bytes (an uncompressed zip
    record); we recognise it by its length and its first bytes, so no copy of the blob is made.
    """

    def __init__(self, out: ObjectWriter, nbytes: int, prefix: bytes) -> None:
        self.out = out
        self.nbytes = nbytes
        self.prefix = prefix
        self.data_offset: int | None = None
        # torch.save turns an exception from write() into its own vague error ("unexpected pos"):
        # keep the real one, swallow the rest of the blob, and re-raise it after torch.save returns.
        self.error: Exception | None = None

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        if self.error is not None:
            return len(view)
        if self.data_offset is None and len(view) == self.nbytes and bytes(view[: len(self.prefix)]) == self.prefix:
            self.data_offset = self.out.tell()
        try:
            return self.out.write(view)
        except Exception as exc:
            self.error = exc
            return len(view)

    def flush(self) -> None:
        pass


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, row-major, without a copy (staged tensors are contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def checksum(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def block_checksums(data: memoryview, block: int = BLOCK_SIZE) -> list[int]:
    return [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, len(data), block)]


def shard_checksum(blocks: list[int]) -> int:
    """The shard's checksum: a hash over its block hashes (one pass over the bytes, not two)."""
    return checksum(struct.pack(f"<{len(blocks)}Q", *blocks))


class RankFileWriter:
    """Writes items to one ObjectWriter, returning DCP WriteResults and Stalwart manifest entries."""

    def __init__(self, out: ObjectWriter, file: str, rank: int) -> None:
        self.out = out
        self.file = file
        self.rank = rank
        self.results: list[WriteResult] = []
        self.shard_fqns: list[tuple[str, ShardEntry]] = []
        self.objects: dict[str, ObjectEntry] = {}

    def write_tensor(self, index: MetadataIndex, tensor: torch.Tensor) -> None:
        raw = raw_bytes(tensor)
        blocks = block_checksums(raw)
        start = self.out.tell()
        locator = _RecordLocator(self.out, len(raw), bytes(raw[:16]))
        try:
            torch.save(tensor, cast(IO[bytes], locator))  # file-like enough: write, tell
        finally:
            if locator.error is not None:
                raise locator.error
        length = self.out.tell() - start
        if locator.data_offset is None and len(raw):
            raise ValueError(f"could not locate the bytes of {index.fqn} in its serialized form")
        data_offset = locator.data_offset if locator.data_offset is not None else start + length
        self.results.append(
            WriteResult(index=index, size_in_bytes=length, storage_data=_StorageInfo(self.file, start, length))
        )
        offsets = list(index.offset) if index.offset is not None else [0] * tensor.dim()
        self.shard_fqns.append(
            (
                index.fqn,
                ShardEntry(
                    offsets=offsets,
                    lengths=list(tensor.shape),
                    file=self.file,
                    blob_offset=start,
                    blob_length=length,
                    data_offset=data_offset,
                    nbytes=len(raw),
                    checksum=shard_checksum(blocks),
                    block_checksums=blocks,
                    rank=self.rank,
                ),
            )
        )

    def write_bytes(self, index: MetadataIndex, data: io.BytesIO) -> None:
        view = data.getbuffer()
        start = self.out.tell()
        self.out.write(view)
        self.results.append(
            WriteResult(index=index, size_in_bytes=len(view), storage_data=_StorageInfo(self.file, start, len(view)))
        )
        self.objects[index.fqn] = ObjectEntry(
            file=self.file, offset=start, length=len(view), checksum=checksum(view), rank=self.rank
        )
