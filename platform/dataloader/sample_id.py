"""Stable sample ids: (source, epoch, index-in-source) packed into one non-negative int64.

An id names the same tokens in every run, on every rank and after every resume, so tests and
audits can compare what was trained on id for id.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SOURCE_BITS = 7
EPOCH_BITS = 16
INDEX_BITS = 40
MAX_SOURCES = 1 << SOURCE_BITS
MAX_EPOCHS = 1 << EPOCH_BITS
MAX_INDEX = 1 << INDEX_BITS
_EPOCH_SHIFT = INDEX_BITS
_SOURCE_SHIFT = INDEX_BITS + EPOCH_BITS


@dataclass(frozen=True, slots=True)
class SampleRef:
    """Where a sample comes from: its source, the epoch of that source, and its index in the epoch."""

    source: int
    epoch: int
    index: int


def encode(source: np.ndarray, epoch: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Vectorized: int64 ids for arrays of (source, epoch, index). Callers keep each field in range."""
    return (
        (source.astype(np.int64) << _SOURCE_SHIFT) | (epoch.astype(np.int64) << _EPOCH_SHIFT) | index.astype(np.int64)
    )


def encode_one(source: int, epoch: int, index: int) -> int:
    if not (0 <= source < MAX_SOURCES and 0 <= epoch < MAX_EPOCHS and 0 <= index < MAX_INDEX):
        raise ValueError(f"sample ref out of range: source={source} epoch={epoch} index={index}")
    return (source << _SOURCE_SHIFT) | (epoch << _EPOCH_SHIFT) | index


def decode(sample_id: int) -> SampleRef:
    sample_id = int(sample_id)
    return SampleRef(
        source=(sample_id >> _SOURCE_SHIFT) & (MAX_SOURCES - 1),
        epoch=(sample_id >> _EPOCH_SHIFT) & (MAX_EPOCHS - 1),
        index=sample_id & (MAX_INDEX - 1),
    )
