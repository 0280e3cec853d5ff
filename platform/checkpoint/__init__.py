"""Parallelism-agnostic checkpoints on DCP: async, tiered (memory, disk, S3), resharding on load.

    from stalwart import checkpoint
    handle = checkpoint.save({"train": TrainState(model, optim)}, "/ckpt/run1", step)  # async
    step = checkpoint.load({"train": TrainState(model, optim)}, "/ckpt/run1")        # newest, any layout
    checkpoint.latest("s3://bucket/run1?endpoint=http://minio:9000")

Nothing in a checkpoint is code: its metadata is JSON (the manifest) and its non-tensor values are
plain data read back with the weights-only unpickler. Plain DCP reads one through `DCPReader`, or
after `stalwart checkpoint export-dcp`, and writes one through `DCPWriter` (dcp.save, dcp.async_save).

The names below load on first use: `stalwart.checkpoint.peers` and the storage URIs are needed by
node agents, which should not pay for importing torch (seconds, and the GIL while it loads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stalwart.checkpoint.adapters import RNGState, TrainState
    from stalwart.checkpoint.api import latest, load, save
    from stalwart.checkpoint.dcp_interop import DCPReader, export_dcp
    from stalwart.checkpoint.dcp_writer import DCPWriter
    from stalwart.checkpoint.engine import Checkpointer, CheckpointInfo, SaveHandle, SaveResult
    from stalwart.checkpoint.errors import (
        CheckpointError,
        ChecksumError,
        ManifestError,
        NoCheckpoint,
        UnsafeObjectError,
    )
    from stalwart.checkpoint.retention import RetentionPolicy
    from stalwart.checkpoint.shards import GlobalShard
    from stalwart.checkpoint.storage import Storage, StorageError, open_storage

_EXPORTS = {
    "RNGState": "adapters",
    "TrainState": "adapters",
    "latest": "api",
    "load": "api",
    "save": "api",
    "DCPReader": "dcp_interop",
    "export_dcp": "dcp_interop",
    "DCPWriter": "dcp_writer",
    "CheckpointInfo": "engine",
    "Checkpointer": "engine",
    "SaveHandle": "engine",
    "SaveResult": "engine",
    "CheckpointError": "errors",
    "ChecksumError": "errors",
    "ManifestError": "errors",
    "NoCheckpoint": "errors",
    "UnsafeObjectError": "errors",
    "RetentionPolicy": "retention",
    "GlobalShard": "shards",
    "Storage": "storage",
    "StorageError": "storage",
    "open_storage": "storage",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
