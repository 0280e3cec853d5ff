"""DCP's `Metadata` for a checkpoint, built from its manifest instead of unpickled from storage.

DCP keeps its metadata as a pickle (`.metadata`): reading one runs whatever code it names. A
Stalwart checkpoint has none; the manifest holds the same facts as data, and this builds DCP's
object from it for the load planner, the DCP reader and the DCP export.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from stalwart.checkpoint.manifest import Manifest


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def dcp_metadata(manifest: Manifest) -> Metadata:
    state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    for fqn, t in manifest.tensors.items():
        chunks = []
        for s in t.shards:
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(s.offsets), sizes=torch.Size(s.lengths)))
            storage[MetadataIndex(fqn, s.offsets)] = _StorageInfo(s.file, s.blob_offset, s.blob_length)
        state[fqn] = TensorStorageMetadata(
            properties=TensorProperties(dtype=torch_dtype(t.dtype)), size=torch.Size(t.shape), chunks=chunks
        )
    for fqn, o in manifest.objects.items():
        state[fqn] = BytesStorageMetadata()
        storage[MetadataIndex(fqn)] = _StorageInfo(o.file, o.offset, o.length)
    mappings = {fqn: tuple(path) for fqn, path in manifest.mappings.items()} or None
    return Metadata(state_dict_metadata=state, planner_data=mappings, storage_data=storage, storage_meta=StorageMeta())
