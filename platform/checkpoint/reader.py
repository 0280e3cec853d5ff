"""Execute DCP read items with ranged reads: only the bytes of the saved shards that overlap.

DCP's load planner works out, for every target shard, which saved chunks overlap it and where
(`ReadItem`: saved chunk, offsets inside it, offsets in the target, lengths). A saved chunk's raw
bytes are row-major, so the overlap is one strided view of a contiguous span of them: we read that
span (rounded out to checksum blocks), verify the blocks, and copy the view into the target.
Where a request costs more than the bytes (host memory over HTTP, S3), the spans of one file that
lie close together are merged into one read: a replicated model loads in a few requests a file
instead of one per tensor.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from stalwart.checkpoint import objects
from stalwart.checkpoint.dcp_metadata import torch_dtype
from stalwart.checkpoint.errors import ChecksumError
from stalwart.checkpoint.manifest import Manifest, ShardEntry
from stalwart.checkpoint.planner import ShardAwareLoadPlanner
from stalwart.checkpoint.storage.base import Storage
from stalwart.checkpoint.writer import checksum

__all__ = ["ChecksumError", "RangedReader"]

#: a merged read never grows past this: its bytes are held until the items in it are copied out
MAX_SPAN = 64 << 20

_ReadInto = Callable[[str, int, memoryview], None]


class _Box(NamedTuple):
    """Where a tensor item's bytes lie in its saved shard: elements [first, last] (row-major, with
    the shard's strides) and the block-aligned byte span [lo, hi) around them (blocks are the unit
    of checksums)."""

    fqn: str
    dtype: torch.dtype
    elem: int  # bytes per element
    shard: ShardEntry
    strides: list[int]
    first: int
    last: int
    lo: int
    hi: int


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

    def _box(self, item: ReadItem) -> _Box:
        key = (item.storage_index.fqn, tuple(item.storage_index.offset or ()))
        fqn, dtype_name, shard = self._shards[key]
        dtype = torch_dtype(dtype_name)
        elem = torch.empty((), dtype=dtype).element_size()
        strides = _strides(shard.lengths)
        first = sum(o * s for o, s in zip(item.storage_offsets, strides, strict=True))
        last = first + sum((n - 1) * s for n, s in zip(item.lengths, strides, strict=True))
        block = self.manifest.block_size
        lo, hi = (first * elem // block) * block, min(math.ceil((last + 1) * elem / block) * block, shard.nbytes)
        return _Box(fqn, dtype, elem, shard, strides, first, last, lo, hi)

    def _read_tensor(self, item: ReadItem, planner: LoadPlanner, read_into: _ReadInto) -> None:
        if any(n == 0 for n in item.lengths):
            return
        b = self._box(item)
        start, end = b.first * b.elem, (b.last + 1) * b.elem
        target = planner.resolve_tensor(item).detach()
        if target.dtype != b.dtype or list(target.shape) != list(item.lengths):
            raise RuntimeError(
                f"{b.fqn}: target {target.dtype} {tuple(target.shape)} vs saved {b.dtype} box {tuple(item.lengths)}"
            )
        count = math.prod(item.lengths)
        path = self._path(b.shard.file)
        on_host = target.device.type == "cpu"  # a GPU's tensor is read into host memory, then copied in
        if on_host and target.is_contiguous() and count == b.last - b.first + 1 and (b.lo, b.hi) == (start, end):
            # The overlap is one contiguous, block-aligned run: read it straight into the target.
            view = target.reshape(-1).view(torch.uint8).numpy().data
            read_into(path, b.shard.data_offset + b.lo, view)
            self._verify(b.fqn, b.shard, view, b.lo)
        else:
            # Reused: faulting in fresh pages for every read costs more than the read itself.
            scratch = getattr(self._buffers, "buf", None)
            if scratch is None or scratch.numel() < b.hi - b.lo:
                scratch = self._buffers.buf = torch.empty(b.hi - b.lo, dtype=torch.uint8)
            buf = scratch[: b.hi - b.lo]
            view = buf.numpy().data
            read_into(path, b.shard.data_offset + b.lo, view)
            self._verify(b.fqn, b.shard, view, b.lo)
            flat = buf.view(b.dtype)
            offset = b.first - b.lo // b.elem
            src = flat.as_strided(list(item.lengths), b.strides, offset) if item.lengths else flat[offset]
            target.copy_(src)
        planner.commit_tensor(item, target)

    def _object_bytes(self, item: ReadItem, read_into: _ReadInto) -> bytes:
        return self._value_bytes(item.storage_index.fqn, read_into)

    def _value_bytes(self, fqn: str, read_into: _ReadInto) -> bytes:
        entry = self.manifest.objects[fqn]
        data = bytearray(entry.length)
        read_into(self._path(entry.file), entry.offset, memoryview(data))
        if checksum(data) != entry.checksum:
            raise ChecksumError(
                f"checksum mismatch in object {fqn!r} of "
                f"{self.storage.describe(self._path(entry.file))}: the checkpoint is corrupt"
            )
        return bytes(data)

    def read_shard(self, fqn: str, shard: ShardEntry) -> torch.Tensor:
        """One saved shard whole, verified (for the DCP export)."""
        data = bytearray(shard.nbytes)
        if shard.nbytes:
            self.storage.read_range_into(self._path(shard.file), shard.data_offset, memoryview(data))
            self._verify(fqn, shard, memoryview(data), 0)
        flat = torch.frombuffer(data, dtype=torch.uint8) if shard.nbytes else torch.empty(0, dtype=torch.uint8)
        return flat.view(torch_dtype(self.manifest.tensors[fqn].dtype)).reshape(shard.lengths)

    def read_value(self, fqn: str) -> Any:
        """One stored non-tensor value, verified and read as plain data."""
        data = self._value_bytes(fqn, self.storage.read_range_into)
        return objects.deserialize(fqn, data, self.storage.describe(self._path(self.manifest.objects[fqn].file)))

    def _deliver(self, item: ReadItem, data: bytes, planner: LoadPlanner) -> None:
        """Hand a stored value to the planner as plain data: read with the weights-only unpickler,
        and re-serialized from that for a planner of DCP's own (whose load_bytes would unpickle
        anything)."""
        fqn = item.storage_index.fqn
        value: Any = objects.deserialize(fqn, data, self.storage.describe(self._path(self.manifest.objects[fqn].file)))
        if isinstance(planner, ShardAwareLoadPlanner):
            planner.load_value(item, value)
        else:
            planner.load_bytes(item, objects.serialize(fqn, value))

    def _extent(self, item: ReadItem) -> tuple[str, int, int]:
        """The file and absolute byte range [start, end) an item reads."""
        if item.type == LoadItemType.BYTE_IO:
            entry = self.manifest.objects[item.storage_index.fqn]
            return self._path(entry.file), entry.offset, entry.offset + entry.length
        b = self._box(item)
        return self._path(b.shard.file), b.shard.data_offset + b.lo, b.shard.data_offset + b.hi

    def _spans(self, items: list[ReadItem], gap: int) -> list[tuple[str, int, int, list[ReadItem]]]:
        """Items grouped into merged reads: same file, at most `gap` bytes apart, MAX_SPAN at most."""
        extents = sorted(((self._extent(i), n) for n, i in enumerate(items)), key=lambda e: e[0])
        spans: list[tuple[str, int, int, list[ReadItem]]] = []
        for (path, start, end), n in extents:
            if spans and spans[-1][0] == path and start <= spans[-1][2] + gap and end - spans[-1][1] <= MAX_SPAN:
                p, lo, hi, members = spans[-1]
                spans[-1] = (p, lo, max(hi, end), members + [items[n]])
            else:
                spans.append((path, start, end, [items[n]]))
        return spans

    def _read_span(
        self, path: str, lo: int, hi: int, members: list[ReadItem], planner: LoadPlanner
    ) -> list[tuple[ReadItem, bytes]]:
        """One read for all of `members`; tensors are copied here, values' bytes handed back."""
        data = memoryview(self.storage.read_range(path, lo, hi - lo))

        def read_into(_: str, offset: int, out: memoryview) -> None:
            out[:] = data[offset - lo : offset - lo + len(out)]

        values = []
        for item in members:
            if item.type == LoadItemType.BYTE_IO:
                values.append((item, self._object_bytes(item, read_into)))
            else:
                self._read_tensor(item, planner, read_into)
        return values

    def execute(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        gap = self.storage.coalesce_gap
        with ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="ckpt-read") as pool:
            if gap is None:
                tensors = [i for i in plan.items if i.type != LoadItemType.BYTE_IO]
                for f in [pool.submit(self._read_tensor, i, planner, self.storage.read_range_into) for i in tensors]:
                    f.result()
                values = [
                    (i, self._object_bytes(i, self.storage.read_range_into))
                    for i in plan.items
                    if i.type == LoadItemType.BYTE_IO
                ]
            else:
                spans = [pool.submit(self._read_span, *span, planner) for span in self._spans(plan.items, gap)]
                values = [o for f in spans for o in f.result()]
        for item, data in values:  # building Python values touches Python state: keep it on this thread
            self._deliver(item, data, planner)
