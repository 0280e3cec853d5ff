"""The in-process deterministic loader: each call computes this rank's slice of the next global batch.

No background work and no per-rank state: the global position is everything, so a restart at sample
10 million costs what a restart at sample 10 costs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from stalwart.dataloader.batch import Batch
from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.dp_slice import check_dp, rank_positions
from stalwart.dataloader.state import LoaderState, check_state, delta_at, state_at


class DeterministicLoader:
    def __init__(
        self,
        config: DataConfig,
        *,
        dp_rank: int,
        dp_size: int,
        micro_batch: int,
        dataset: TokenDataset | None = None,
    ) -> None:
        check_dp(dp_rank, dp_size, micro_batch)
        self.config = config
        self.dp_rank, self.dp_size, self.micro_batch = dp_rank, dp_size, micro_batch
        self._owns_dataset = dataset is None
        self.dataset = dataset if dataset is not None else TokenDataset(config)
        self.position = 0

    @property
    def global_batch(self) -> int:
        return self.dp_size * self.micro_batch

    def batch_at(self, position: int) -> Batch:
        """The batch of the global batch starting at `position`, without moving the loader."""
        positions = rank_positions(position, self.dp_rank, self.dp_size, self.micro_batch)
        tokens, ids = self.dataset.fetch(positions)
        return Batch(torch.from_numpy(tokens), torch.from_numpy(ids), position, self.dp_rank, self.dp_size)

    def next_batch(self) -> Batch:
        batch = self.batch_at(self.position)
        self.position += self.global_batch
        return batch

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    def state(self) -> LoaderState:
        return state_at(self.dataset, self.position)

    def state_dict(self) -> dict[str, Any]:
        """The global state: identical on every rank, so any one rank's copy resumes them all."""
        return self.state().model_dump()

    def state_delta(self) -> dict[str, Any]:
        return delta_at(self.dataset, self.position).model_dump()

    def load_state_dict(self, state: LoaderState | Mapping[str, Any]) -> None:
        loaded = LoaderState.coerce(state)
        check_state(self.dataset, loaded)
        self.position = loaded.position

    def close(self) -> None:
        if self._owns_dataset:
            self.dataset.close()


def global_ids(config_or_dataset: DataConfig | TokenDataset, start: int, count: int) -> np.ndarray:
    """Sample ids of global positions [start, start + count): what a clean run consumes, for checks."""
    if isinstance(config_or_dataset, TokenDataset):
        return config_or_dataset.order.sample_ids(np.arange(start, start + count))
    dataset = TokenDataset(config_or_dataset)
    try:
        return dataset.order.sample_ids(np.arange(start, start + count))
    finally:
        dataset.close()
