"""Parallelism-agnostic checkpoints on DCP: async, tiered (memory, disk, S3), resharding on load.

    from stalwart.checkpoint import Checkpointer, open_storage
    ckpt = Checkpointer(open_storage("/ckpt/run1"))
    handle = ckpt.save({"app": app_state}, step)   # returns once staged; handle.wait() -> SaveResult
    step = ckpt.load({"app": app_state})          # newest committed checkpoint, any source layout
"""

from stalwart.checkpoint.adapters import RNGState, TrainState
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
    "open_storage",
]
