"""Execute DCP read items with ranged reads: only the bytes of the saved shards that overlap.

DCP's load planner works out, for every target shard, which saved chunks overlap it and where
(`ReadItem`: saved chunk, offsets inside it, offsets in the target, lengths). A saved chunk's raw
bytes are row-major, so the overlap is one strided view of a contiguous span of them: we read that
span (rounded out to checksum blocks), verify the blocks, and copy the view into the target.
"""

from __future__ import annotations

import io
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from stalwart.checkpoint.manifest import Manifest, ShardEntry
from stalwart.checkpoint.storage.base import Storage
from stalwart.checkpoint.writer import checksum


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
    def __init__(self, storage: Storage, folder: str, manifest: Manifest) -> None:
        self.storage = storage
        self.folder = folder
        self.manifest = manifest
        self.max_workers = storage.read_parallelism
        self._buffers = threading.local()  # one growing scratch buffer per reading thread
        self._shards = {
            (fqn, tuple(s.offsets)): (fqn, t.dtype, s) for fqn, t in manifest.tensors.items() for s in t.shards
        }

    def _path(self, file: str) -> str:
        return f"{self.folder}/{file}"

    def _verify(self, fqn: str, shard: ShardEntry, data: memoryview, lo: int) -> None:
        """Check the blocks of `data`, which holds the shard's raw bytes from `lo` (a block boundary)."""
        block = self.manifest.block_size
        first = lo // block
        for i in range(first, first + math.ceil(len(data) / block)):
            chunk = data[(i - first) * block : (i - first + 1) * block]
            if checksum(chunk) != shard.block_checksums[i]:
                raise ChecksumError(
                    f"checksum mismatch in tensor {fqn!r} (shard at {shard.offsets}), block {i} of "
                    f"{self.storage.describe(self._path(shard.file))}: the checkpoint is corrupt"
                )

    def _read_tensor(self, item: ReadItem, planner: LoadPlanner) -> None:
        key = (item.storage_index.fqn, tuple(item.storage_index.offset or ()))
        fqn, dtype_name, shard = self._shards[key]
        dtype = _dtype(dtype_name)
        elem = torch.empty((), dtype=dtype).element_size()
        strides = _strides(shard.lengths)
        if any(n == 0 for n in item.lengths):
            return
        first = sum(o * s for o, s in zip(item.storage_offsets, strides, strict=True))
        last = first + sum((n - 1) * s for n, s in zip(item.lengths, strides, strict=True))
        block = self.manifest.block_size
        start, end = first * elem, (last + 1) * elem
        lo, hi = (start // block) * block, min(math.ceil(end / block) * block, shard.nbytes)
        target = planner.resolve_tensor(item).detach()
        if target.dtype != dtype or list(target.shape) != list(item.lengths):
            raise RuntimeError(f"{fqn}: target {target.dtype} {tuple(target.shape)} vs saved {dtype_name} "
                               f"box {tuple(item.lengths)}")  # fmt: skip
        count = math.prod(item.lengths)
        path = self._path(shard.file)
        if target.is_contiguous() and count == last - first + 1 and (lo, hi) == (start, end):
            # The overlap is one contiguous, block-aligned run: read it straight into the target.
            view = memoryview(target.reshape(-1).view(torch.uint8).numpy())
            self.storage.read_range_into(path, shard.data_offset + lo, view)
            self._verify(fqn, shard, view, lo)
        else:
            # Reused: faulting in fresh pages for every read costs more than the read itself.
            scratch = getattr(self._buffers, "buf", None)
            if scratch is None or scratch.numel() < hi - lo:
                scratch = self._buffers.buf = torch.empty(hi - lo, dtype=torch.uint8)
            buf = scratch[: hi - lo]
            view = memoryview(buf.numpy())
            self.storage.read_range_into(path, shard.data_offset + lo, view)
            self._verify(fqn, shard, view, lo)
            flat = buf.view(dtype)
            src = flat.as_strided(list(item.lengths), strides, first - lo // elem) if item.lengths else flat[
                first - lo // elem]  # fmt: skip
            target.copy_(src)
        planner.commit_tensor(item, target)

    def _read_bytes(self, item: ReadItem, planner: LoadPlanner) -> None:
        entry = self.manifest.objects[item.storage_index.fqn]
        data = self.storage.read_range(self._path(entry.file), entry.offset, entry.length)
        if checksum(data) != entry.checksum:
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
