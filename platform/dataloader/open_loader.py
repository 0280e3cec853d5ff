"""One call for training scripts: the shadow loader's client when the node runs one, else in-process."""

from __future__ import annotations

import os

from stalwart.dataloader.batch import BatchLoader
from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.loader import DeterministicLoader
from stalwart.dataloader.shadow_client import ShadowLoaderClient
from stalwart.dataloader.shm_layout import SHM_ENV


def open_loader(
    config: DataConfig,
    *,
    dp_rank: int,
    dp_size: int,
    micro_batch: int,
    shm_name: str | None = None,
    lane: int | None = None,
) -> BatchLoader:
    """The loader for this rank. Both kinds give the same batches, ids and state, so a job may switch."""
    name = shm_name or os.environ.get(SHM_ENV)
    if name:
        lane = lane if lane is not None else int(os.environ.get("LOCAL_RANK", "0"))
        return ShadowLoaderClient(
            name, lane=lane, dp_rank=dp_rank, dp_size=dp_size, micro_batch=micro_batch, config=config
        )
    return DeterministicLoader(config, dp_rank=dp_rank, dp_size=dp_size, micro_batch=micro_batch)
