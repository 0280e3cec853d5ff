"""Parallelism-agnostic checkpoints on DCP: async, tiered (memory, disk, S3), resharding on load.

    from stalwart import checkpoint
    handle = checkpoint.save({"train": TrainState(model, optim)}, "/ckpt/run1", step)  # async
    step = checkpoint.load({"train": TrainState(model, optim)}, "/ckpt/run1")        # newest, any layout
    checkpoint.latest("s3://bucket/run1?endpoint=http://minio:9000")

The names below load on first use: `stalwart.checkpoint.peers` and the storage URIs are needed by
node agents, which should not pay for importing torch (seconds, and the GIL while it loads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stalwart.checkpoint.adapters import RNGState, TrainState
    from stalwart.checkpoint.api import latest, load, save
    from stalwart.checkpoint.engine import (
        Checkpointer,
        CheckpointError,
        CheckpointInfo,
        NoCheckpoint,
        SaveHandle,
        SaveResult,
    )
    from stalwart.checkpoint.reader import ChecksumError
    from stalwart.checkpoint.retention import RetentionPolicy
    from stalwart.checkpoint.shards import GlobalShard
    from stalwart.checkpoint.storage import Storage, StorageError, open_storage

_EXPORTS = {
    "RNGState": "adapters",
    "TrainState": "adapters",
    "latest": "api",
    "load": "api",
    "save": "api",
    "CheckpointError": "engine",
    "CheckpointInfo": "engine",
    "Checkpointer": "engine",
    "NoCheckpoint": "engine",
    "SaveHandle": "engine",
    "SaveResult": "engine",
    "ChecksumError": "reader",
    "RetentionPolicy": "retention",
    "GlobalShard": "shards",
    "Storage": "storage",
    "StorageError": "storage",
    "open_storage": "storage",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
