"""Sharded tensors that DCP does not know natively, made known through its extension protocol.

Megatron-core's ShardedTensor carries a local tensor, the global shape, its global offset and a
replica id. `GlobalShard` holds the same facts and implements DCP's `__create_write_items__`,
`__create_chunk_list__` and `__get_tensor_shard__`, so DCP's planners save, dedup and reshard it
like a DTensor shard. Replicas share (fqn, offsets), so they are written once. One rank may hold
several boxes of one tensor (Megatron stacks a model's layers into one tensor): `add` them.
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
        self.global_shape = torch.Size(global_shape)
        self.pieces: dict[torch.Size, torch.Tensor] = {torch.Size(global_offset): local}

    def add(self, local: torch.Tensor, global_offset: tuple[int, ...]) -> None:
        """Another box of the same tensor held by this rank."""
        other = GlobalShard(local, tuple(self.global_shape), global_offset)
        if local.dtype != self.local.dtype:
            raise ValueError(f"a {local.dtype} box added to a {self.local.dtype} tensor")
        if torch.Size(global_offset) in self.pieces:
            raise ValueError(f"two boxes at {global_offset}")
        self.pieces.update(other.pieces)

    @property
    def local(self) -> torch.Tensor:
        """The first box (the only one, for most tensors)."""
        return next(iter(self.pieces.values()))

    @property
    def global_offset(self) -> torch.Size:
        return next(iter(self.pieces))

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, offset),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offset, sizes=local.size()),
                    properties=TensorProperties.create_from_tensor(local),
                    size=self.global_shape,
                ),
            )
            for offset, local in self.pieces.items()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=offset, sizes=local.size()) for offset, local in self.pieces.items()]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        if index.offset is None:
            return self.local
        return self.pieces[torch.Size(index.offset)]

    def __repr__(self) -> str:
        boxes = ", ".join(f"{tuple(t.shape)} at {tuple(o)}" for o, t in self.pieces.items())
        return f"GlobalShard({boxes} of {tuple(self.global_shape)})"
