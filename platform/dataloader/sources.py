"""A source: its shards cut into windows of seq_len + 1 tokens (sequence packing).

Documents are concatenated with their end-of-document token, so a window packs as many documents
(or pieces of one) as fit: no padding, no dropped tokens except a shard's last partial window.
Window i of a shard is tokens [i * seq_len, i * seq_len + seq_len + 1): inputs and shifted targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from stalwart.dataloader.token_shard import TokenShard

if TYPE_CHECKING:
    from stalwart.dataloader.config import SourceSpec


class Source(Protocol):
    """What the global order needs of a source, whatever its file format."""

    name: str
    num_samples: int

    def read(self, index: int, out: np.ndarray) -> None: ...

    def content_key(self) -> object: ...

    def close(self) -> None: ...


class TokenSource:
    def __init__(self, name: str, paths: Sequence[Path], seq_len: int) -> None:
        self.name = name
        self.seq_len = seq_len
        self.shards: list[TokenShard] = []
        try:
            for path in paths:
                self.shards.append(TokenShard(path))
        except BaseException:
            self.close()
            raise
        windows = [max(0, (s.token_count - 1) // seq_len) for s in self.shards]
        self._first = np.concatenate([[0], np.cumsum(windows, dtype=np.int64)])
        self.num_samples = int(self._first[-1])

    def read(self, index: int, out: np.ndarray) -> None:
        """Copy sample `index` (seq_len + 1 tokens) into out."""
        shard = int(np.searchsorted(self._first, index, side="right") - 1)
        start = (index - int(self._first[shard])) * self.seq_len
        out[:] = self.shards[shard].read(start, self.seq_len + 1)

    def content_key(self) -> list[tuple[int, int, int, str]]:
        """What identifies the data (not the paths): per shard its size, checksums and dtype."""
        return [(s.token_count, s.header.table_crc, s.header.block_tokens, str(s.header.dtype)) for s in self.shards]

    def close(self) -> None:
        for shard in self.shards:
            shard.close()


def open_source(spec: SourceSpec, seq_len: int) -> Source:
    """Open a source in its format. The hf and megatron readers are imported only here, when needed, so a
    worker reading .stok never imports `datasets` or `tokenizers`."""
    paths = spec.resolve()
    if spec.format == "hf":
        from stalwart.dataloader.hf_source import open_hf_source

        return open_hf_source(spec, paths, seq_len)
    if spec.format == "megatron":
        from stalwart.dataloader.megatron_source import MegatronSource

        return MegatronSource(spec.name, paths, seq_len, spec.index_dir)
    return TokenSource(spec.name, paths, seq_len)
