"""Sharded tensors that DCP does not know natively, made known through its extension protocol.

Megatron-core's ShardedTensor carries a local tensor, the global shape, its global offset and a
replica id. `GlobalShard` holds the same facts and implements DCP's `__create_write_items__`,
`__create_chunk_list__` and `__get_tensor_shard__`, so DCP's planners save, dedup and reshard it
like a DTensor shard. Replicas share (fqn, offsets), so they are written once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType


class GlobalShard:
    def __init__(self, local: torch.Tensor, global_shape: tuple[int, ...], global_offset: tuple[int, ...]) -> None:
        if len(global_shape) != local.dim() or len(global_offset) != local.dim():
            raise ValueError(f"shard of rank {local.dim()} with global shape {global_shape} and offset {global_offset}")
        for size, off, full in zip(local.shape, global_offset, global_shape, strict=True):
            if off < 0 or off + size > full:
                raise ValueError(f"shard {tuple(local.shape)} at {global_offset} falls outside {global_shape}")
        self.local = local
        self.global_shape = torch.Size(global_shape)
        self.global_offset = torch.Size(global_offset)

    def _chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=self.global_offset, sizes=self.local.size())

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, self.global_offset),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=self._chunk(),
                    properties=TensorProperties.create_from_tensor(self.local),
                    size=self.global_shape,
                ),
            )
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [self._chunk()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        return self.local

    def __repr__(self) -> str:
        return f"GlobalShard({tuple(self.local.shape)} at {tuple(self.global_offset)} of {tuple(self.global_shape)})"
