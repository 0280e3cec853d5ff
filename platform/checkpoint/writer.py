"""Serialize one rank's staged items into one file, in DCP's format, recording where the raw bytes are.

Each tensor is written as DCP writes it (a torch.save blob), so plain `dcp.load` reads the
checkpoint. Inside that blob the tensor's bytes are stored uncompressed and row-major; we record
their offset and block checksums so a resharding load can read and verify just the ranges it needs.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from stalwart.checkpoint.manifest import BLOCK_SIZE, ObjectEntry, ShardEntry
from stalwart.checkpoint.storage.base import ObjectWriter


def raw_data_offset(blob: memoryview) -> tuple[int, int]:
    """(offset, length) of the tensor's storage inside a torch.save blob (a stored zip record)."""
    zf = zipfile.ZipFile(io.BytesIO(blob))
    infos = [i for i in zf.infolist() if "/data/" in i.filename and not i.filename.endswith("/")]
    if not infos:
        return 0, 0
    if len(infos) != 1 or infos[0].compress_type != zipfile.ZIP_STORED:
        raise ValueError("expected one uncompressed storage record in the tensor blob")
    info = infos[0]
    name_len, extra_len = struct.unpack("<HH", bytes(blob[info.header_offset + 26 : info.header_offset + 30]))
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def block_checksums(data: memoryview, block: int = BLOCK_SIZE) -> list[int]:
    return [zlib.crc32(data[i : i + block]) for i in range(0, len(data), block)]


def shard_checksum(blocks: list[int]) -> int:
    """The shard's checksum: a CRC over its block CRCs (one pass over the bytes, not two)."""
    return zlib.crc32(struct.pack(f"<{len(blocks)}I", *blocks))


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
        buf = io.BytesIO()
        torch.save(tensor, buf)
        blob = buf.getbuffer()
        rel, nbytes = raw_data_offset(blob)
        raw = blob[rel : rel + nbytes]
        blocks = block_checksums(raw)
        whole = shard_checksum(blocks)
        start = self.out.tell()
        self.out.write(blob)
        self.results.append(
            WriteResult(index=index, size_in_bytes=len(blob), storage_data=_StorageInfo(self.file, start, len(blob)))
        )
        offsets = list(index.offset) if index.offset is not None else [0] * tensor.dim()
        self.shard_fqns.append((
            index.fqn,
            ShardEntry(offsets=offsets, lengths=list(tensor.shape), file=self.file, blob_offset=start,
                       blob_length=len(blob), data_offset=start + rel, nbytes=nbytes, crc32=whole,
                       block_crc32=blocks, rank=self.rank),
        ))  # fmt: skip
        del raw, blob

    def write_bytes(self, index: MetadataIndex, data: io.BytesIO) -> None:
        view = data.getbuffer()
        start = self.out.tell()
        self.out.write(view)
        self.results.append(
            WriteResult(index=index, size_in_bytes=len(view), storage_data=_StorageInfo(self.file, start, len(view)))
        )
        self.objects[index.fqn] = ObjectEntry(file=self.file, offset=start, length=len(view),
                                              crc32=zlib.crc32(view), rank=self.rank)  # fmt: skip
