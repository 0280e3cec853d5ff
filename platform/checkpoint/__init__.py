"""Parallelism-agnostic checkpoints on DCP: async, tiered (memory, disk, S3), resharding on load.

    from stalwart import checkpoint
    handle = checkpoint.save({"train": TrainState(model, optim)}, "/ckpt/run1", step)  # async
    step = checkpoint.load({"train": TrainState(model, optim)}, "/ckpt/run1")        # newest, any layout
    checkpoint.latest("s3://bucket/run1?endpoint=http://minio:9000")

The names below load on first use: `stalwart.checkpoint.peers` and the storage URIs are needed by
node agents, which should not pay for importing torch (seconds, and the GIL while it loads).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOME = {
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
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'stalwart.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stalwart.checkpoint.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
