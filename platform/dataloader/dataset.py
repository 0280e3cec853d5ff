"""A DataConfig opened for reading: the sources' shards mapped, and the global order over them."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.order import GlobalOrder
from stalwart.dataloader.schedule import build_segments
from stalwart.dataloader.sources import Source, open_source


def _digest(payload: object) -> str:
    return hashlib.blake2b(json.dumps(payload, sort_keys=True).encode(), digest_size=8).hexdigest()


class TokenDataset:
    def __init__(self, config: DataConfig) -> None:
        self.config = config
        self.seq_len = config.seq_len
        self.sample_tokens = config.seq_len + 1
        self.sources: list[Source] = []
        try:
            for spec in config.sources:
                self.sources.append(open_source(spec, config.seq_len))
            segments = build_segments(config.segments())
            self.order = GlobalOrder([s.num_samples for s in self.sources], segments, config.seed, config.source_names)
        except BaseException:
            self.close()
            raise
        data = _digest({"seq_len": config.seq_len, "sources": [(s.name, s.content_key()) for s in self.sources]})
        self._history: list[str] = []
        h = data
        for seg in segments:
            h = _digest([h, seg.start, list(seg.weights)])
            self._history.append(h)
        self._data_fingerprint = data

    def fingerprint(self, position: int) -> str:
        """What a state at `position` depends on: the data, and the weights of every segment that served
        positions [0, position). Later milestones may change without invalidating the state."""
        if position <= 0:
            return self._data_fingerprint
        return self._history[self.order.segment_of(position - 1)]

    def fetch(self, positions: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [n, seq_len + 1], sample ids [n]) for the given global positions."""
        refs = self.order.locate(positions)
        if out is None:
            out = np.empty((len(refs.source), self.sample_tokens), dtype=np.int64)
        for row, (src, idx) in enumerate(zip(refs.source.tolist(), refs.index.tolist(), strict=True)):
            self.sources[src].read(idx, out[row])
        return out, refs.ids

    def close(self) -> None:
        for source in self.sources:
            source.close()
