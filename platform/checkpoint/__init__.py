"""Parallelism-agnostic checkpoints on DCP: async, tiered (memory, disk, S3), resharding on load.

    from stalwart import checkpoint
    handle = checkpoint.save({"train": TrainState(model, optim)}, "/ckpt/run1", step)  # async
    step = checkpoint.load({"train": TrainState(model, optim)}, "/ckpt/run1")        # newest, any layout
    checkpoint.latest("s3://bucket/run1?endpoint=http://minio:9000")
"""

from stalwart.checkpoint.adapters import RNGState, TrainState
from stalwart.checkpoint.api import latest, load, save
from stalwart.checkpoint.engine import (
    CheckpointError,
    CheckpointInfo,
    Checkpointer,
    NoCheckpoint,
    SaveHandle,
    SaveResult,
)
from stalwart.checkpoint.reader import ChecksumError
from stalwart.checkpoint.retention import RetentionPolicy
from stalwart.checkpoint.shards import GlobalShard
from stalwart.checkpoint.storage import Storage, StorageError, open_storage

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "Checkpointer",
    "ChecksumError",
    "GlobalShard",
    "NoCheckpoint",
    "RNGState",
    "RetentionPolicy",
    "SaveHandle",
    "SaveResult",
    "Storage",
    "StorageError",
    "TrainState",
    "latest",
    "load",
    "save",
    "open_storage",
]
