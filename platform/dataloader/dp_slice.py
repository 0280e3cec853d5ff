"""Data-parallel slicing of the global order: one call consumes a global batch of dp_size * micro_batch
positions, and rank r takes the contiguous part [r * micro_batch, (r + 1) * micro_batch) of it.

Because the state is the global position, any data-parallel size continues at the same next sample.
"""

from __future__ import annotations

import numpy as np


def check_dp(dp_rank: int, dp_size: int, micro_batch: int) -> None:
    if dp_size < 1 or not 0 <= dp_rank < dp_size or micro_batch < 1:
        raise ValueError(f"bad data-parallel layout: rank {dp_rank} of {dp_size}, micro batch {micro_batch}")


def rank_positions(position: int, dp_rank: int, dp_size: int, micro_batch: int) -> np.ndarray:
    """Global positions of rank dp_rank's samples in the global batch that starts at `position`."""
    check_dp(dp_rank, dp_size, micro_batch)
    return np.arange(micro_batch, dtype=np.int64) + (position + dp_rank * micro_batch)
