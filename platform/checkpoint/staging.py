"""Reusable staging buffers: the only work a save does while training waits.

Buffers are allocated once per (tensor, shard) and reused by every later save, pinned when the
source is on a GPU so the device-to-host copy runs at full speed and asynchronously.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex


class StagingBuffers:
    def __init__(self) -> None:
        self._buffers: dict[MetadataIndex, torch.Tensor] = {}

    def stage(self, index: MetadataIndex, src: torch.Tensor) -> torch.Tensor:
        src = src.detach()
        buf = self._buffers.get(index)
        if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
            buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=src.is_cuda)
            self._buffers[index] = buf
        buf.copy_(src, non_blocking=src.is_cuda)
        return buf

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
