"""Deterministic multi-source data loading with shadow loaders (`stalwart.dataloader`).

The global sample order is a pure function of (seed, mixture, position): resuming costs the same at
any step, the state is a few counters, and any data-parallel size continues at the same next sample.
Names are imported lazily, so the shard builder and the loader process start without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

_EXPORTS = {
    "Batch": "batch",
    "BatchLoader": "batch",
    "ByteTokenizer": "tokenizer",
    "DataConfig": "config",
    "DataError": "errors",
    "DeterministicLoader": "loader",
    "LoaderState": "state",
    "LoaderStateDelta": "state",
    "Milestone": "config",
    "SHM_ENV": "shm_layout",
    "SampleRef": "sample_id",
    "ShadowLoaderClient": "shadow_client",
    "ShadowLoaderSupervisor": "shadow_supervisor",
    "ShadowLoaderUnavailable": "errors",
    "ShardError": "errors",
    "SourceSpec": "config",
    "StateMismatch": "errors",
    "TokenDataset": "dataset",
    "build_shards": "build",
    "decode_sample_id": "sample_id:decode",
    "global_ids": "loader",
    "linear_ramp": "schedule",
    "open_loader": "open_loader",
    "remove_stale_segments": "shm_layout",
    "segment_name": "shm_layout",
    "verify_shards": "verify",
    "write_shard": "shard_format",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from stalwart.dataloader.batch import Batch, BatchLoader
    from stalwart.dataloader.build import build_shards
    from stalwart.dataloader.config import DataConfig, Milestone, SourceSpec
    from stalwart.dataloader.dataset import TokenDataset
    from stalwart.dataloader.errors import DataError, ShadowLoaderUnavailable, ShardError, StateMismatch
    from stalwart.dataloader.loader import DeterministicLoader, global_ids
    from stalwart.dataloader.open_loader import open_loader
    from stalwart.dataloader.sample_id import SampleRef
    from stalwart.dataloader.sample_id import decode as decode_sample_id
    from stalwart.dataloader.schedule import linear_ramp
    from stalwart.dataloader.shadow_client import ShadowLoaderClient
    from stalwart.dataloader.shadow_supervisor import ShadowLoaderSupervisor
    from stalwart.dataloader.shard_format import write_shard
    from stalwart.dataloader.shm_layout import SHM_ENV, remove_stale_segments, segment_name
    from stalwart.dataloader.state import LoaderState, LoaderStateDelta
    from stalwart.dataloader.tokenizer import ByteTokenizer
    from stalwart.dataloader.verify import verify_shards
