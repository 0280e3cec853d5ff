"""Execute DCP read items with ranged reads: only the bytes of the saved shards that overlap.

DCP's load planner works out, for every target shard, which saved chunks overlap it and where
(`ReadItem`: saved chunk, offsets inside it, offsets in the target, lengths). A saved chunk's raw
bytes are row-major, so the overlap is one strided view of a contiguous span of them: we read that
span (rounded out to checksum blocks), verify the blocks, and copy the view into the target.
"""

from __future__ import annotations

import io
import math
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from stalwart.checkpoint.manifest import Manifest, ShardEntry
from stalwart.checkpoint.storage.base import Storage


class ChecksumError(RuntimeError):
    """Bytes read back do not match what was saved; names the tensor and the file."""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _strides(shape: list[int]) -> list[int]:
    out, acc = [], 1
    for size in reversed(shape):
        out.append(acc)
        acc *= size
    return list(reversed(out))


class RangedReader:
    def __init__(self, storage: Storage, folder: str, manifest: Manifest, max_workers: int = 8) -> None:
        self.storage = storage
        self.folder = folder
        self.manifest = manifest
        self.max_workers = max_workers
        self._shards = {
            (fqn, tuple(s.offsets)): (fqn, t.dtype, s) for fqn, t in manifest.tensors.items() for s in t.shards
        }

    def _path(self, file: str) -> str:
        return f"{self.folder}/{file}"

    def _read_verified(self, fqn: str, shard: ShardEntry, start: int, end: int) -> tuple[bytes, int]:
        """Bytes [start, end) of the shard's raw data, rounded out to whole blocks and verified.
        Returns the bytes and the raw offset they begin at."""
        block = self.manifest.block_size
        b0, b1 = start // block, math.ceil(end / block)
        lo, hi = b0 * block, min(b1 * block, shard.nbytes)
        data = self.storage.read_range(self._path(shard.file), shard.data_offset + lo, hi - lo)
        for i in range(b0, b1):
            chunk = memoryview(data)[(i - b0) * block : (i - b0 + 1) * block]
            if zlib.crc32(chunk) != shard.block_crc32[i]:
                raise ChecksumError(
                    f"checksum mismatch in tensor {fqn!r} (shard at {shard.offsets}), block {i} of "
                    f"{self.storage.describe(self._path(shard.file))}: the checkpoint is corrupt"
                )
        return data, lo

    def _read_tensor(self, item: ReadItem, planner: LoadPlanner) -> None:
        key = (item.storage_index.fqn, tuple(item.storage_index.offset or ()))
        fqn, dtype_name, shard = self._shards[key]
        dtype = _dtype(dtype_name)
        elem = torch.empty((), dtype=dtype).element_size()
        shape, strides = shard.lengths, _strides(shard.lengths)
        first = sum(o * s for o, s in zip(item.storage_offsets, strides, strict=True))
        last = first + sum((n - 1) * s for n, s in zip(item.lengths, strides, strict=True)) if item.lengths else first
        if any(n == 0 for n in item.lengths):
            return
        data, lo = self._read_verified(fqn, shard, first * elem, (last + 1) * elem)
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        flat = raw.view(dtype) if raw.numel() else raw
        src = flat.as_strided(list(item.lengths), strides, first - lo // elem) if shape else flat.view(())
        target = planner.resolve_tensor(item).detach()
        if target.shape != src.shape:
            raise RuntimeError(f"{fqn}: target {tuple(target.shape)} vs saved box {tuple(src.shape)}")
        target.copy_(src)
        planner.commit_tensor(item, target)

    def _read_bytes(self, item: ReadItem, planner: LoadPlanner) -> None:
        entry = self.manifest.objects[item.storage_index.fqn]
        data = self.storage.read_range(self._path(entry.file), entry.offset, entry.length)
        if zlib.crc32(data) != entry.crc32:
            raise ChecksumError(f"checksum mismatch in object {item.storage_index.fqn!r} of "
                                f"{self.storage.describe(self._path(entry.file))}: the checkpoint is corrupt")  # fmt: skip
        planner.load_bytes(item, io.BytesIO(data))

    def execute(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        tensors = [i for i in plan.items if i.type != LoadItemType.BYTE_IO]
        objects = [i for i in plan.items if i.type == LoadItemType.BYTE_IO]
        with ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="ckpt-read") as pool:
            for f in [pool.submit(self._read_tensor, i, planner) for i in tensors]:
                f.result()
        for item in objects:  # unpickling touches Python state: keep it on this thread
            self._read_bytes(item, planner)
