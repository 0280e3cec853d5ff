"""The global sample order: position -> (source, epoch, index-in-source), a pure function of
(seed, mixture schedule, source sizes, position), computed in O(log segments + log sources).

1. The segment (constant weights) holding the position: a binary search over milestone starts.
2. The source, and the count of earlier positions that source served: the segment's Interleave plus
   the exact per-source counts at the segment's start (precomputed once, O(segments * sources)).
3. A source's k-th served sample is in its epoch k // N at offset k % N (N = samples in the source);
   the index is a Feistel permutation of the offset keyed by (seed, source, epoch): every epoch is a
   fresh shuffle, and each sample is seen exactly once per epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stalwart.dataloader import feistel
from stalwart.dataloader.errors import DataError
from stalwart.dataloader.hashing import derive, mix64_array
from stalwart.dataloader.interleave import Interleave
from stalwart.dataloader.sample_id import MAX_EPOCHS, MAX_INDEX, encode
from stalwart.dataloader.schedule import Segment

MAX_POSITION = 1 << 46  # keeps every intermediate product inside int64


@dataclass(frozen=True)
class SampleRefs:
    """Arrays, one entry per position."""

    source: np.ndarray
    epoch: np.ndarray
    index: np.ndarray

    @property
    def ids(self) -> np.ndarray:
        return encode(self.source, self.epoch, self.index)


class GlobalOrder:
    def __init__(
        self,
        source_sizes: Sequence[int],
        segments: Sequence[Segment],
        seed: int,
        source_names: Sequence[str] | None = None,
    ) -> None:
        if not segments or segments[0].start != 0:
            raise ValueError("the first segment must start at position 0")
        self.sizes = np.array(source_sizes, dtype=np.int64)
        self.names = list(source_names) if source_names else [f"source{i}" for i in range(len(source_sizes))]
        self.seed = seed
        self.segments = list(segments)
        self._starts = np.array([s.start for s in segments], dtype=np.int64)
        self._interleaves = [Interleave(s.weights, derive(seed, 1, k)) for k, s in enumerate(segments)]
        for seg in segments:
            for w, size, name in zip(seg.weights, source_sizes, self.names, strict=True):
                if w > 0 and size <= 0:
                    raise DataError(
                        f"source {name!r} has weight from sample {seg.start} on but no samples "
                        "(its shards hold fewer than seq_len + 1 tokens each)"
                    )
        base = np.zeros((len(segments), len(source_sizes)), dtype=np.int64)
        for k in range(1, len(segments)):
            length = int(self._starts[k] - self._starts[k - 1])
            base[k] = base[k - 1] + np.array(self._interleaves[k - 1].counts(length), dtype=np.int64)
        self._base = base
        self._seed_u64 = np.uint64(derive(seed, 2))

    def segment_of(self, position: int) -> int:
        return int(np.searchsorted(self._starts, position, side="right") - 1)

    def weights_at(self, position: int) -> tuple[int, ...]:
        return self.segments[self.segment_of(position)].weights

    def served_before(self, position: int) -> np.ndarray:
        """Per source: how many of the positions [0, position) it served (exact)."""
        k = self.segment_of(position)
        local = position - int(self._starts[k])
        return self._base[k] + np.array(self._interleaves[k].counts(local), dtype=np.int64)

    def locate(self, positions: np.ndarray | Sequence[int]) -> SampleRefs:
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= MAX_POSITION):
            raise ValueError(f"positions must be in [0, 2**46): got {int(pos.min())}..{int(pos.max())}")
        seg = np.searchsorted(self._starts, pos, side="right") - 1
        source = np.empty_like(pos)
        stream = np.empty_like(pos)
        for k in np.unique(seg):
            sel = np.nonzero(seg == k)[0]
            src, j = self._interleaves[k].locate(pos[sel] - self._starts[k])
            source[sel] = src
            stream[sel] = self._base[k, src] + j
        size = self.sizes[source]
        epoch = stream // size
        if epoch.size and epoch.max() >= MAX_EPOCHS:
            i = int(np.argmax(epoch))
            raise DataError(
                f"position {int(pos[i])} needs epoch {int(epoch[i])} of source "
                f"{self.names[int(source[i])]!r}: more than {MAX_EPOCHS} epochs"
            )
        if size.size and size.max() > MAX_INDEX:
            raise DataError(f"a source has more than {MAX_INDEX} samples")
        key = mix64_array(
            self._seed_u64 ^ mix64_array(source.astype(np.uint64) * np.uint64(MAX_EPOCHS) + epoch.astype(np.uint64))
        )
        index = feistel.permute(stream - epoch * size, size, key)
        return SampleRefs(source=source, epoch=epoch, index=index)

    def sample_ids(self, positions: np.ndarray | Sequence[int]) -> np.ndarray:
        return self.locate(positions).ids
