"""A memory-mapped token shard. Each block's checksum is verified the first time a read touches it."""

from __future__ import annotations

import mmap
import zlib
from pathlib import Path

import numpy as np

from stalwart.dataloader.errors import ShardError
from stalwart.dataloader.shard_format import ShardHeader, read_header


class TokenShard:
    """Read-only view of one shard file; reads never return tokens from an unverified block."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.header: ShardHeader = read_header(self.path)
        h = self.header
        with open(self.path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.tokens = np.frombuffer(self._mm, dtype=h.dtype, count=h.token_count, offset=h.data_offset)
        self._table = np.frombuffer(self._mm, dtype="<u4", count=h.n_blocks, offset=h.table_offset)
        if zlib.crc32(self._table.tobytes()) != h.table_crc:
            raise ShardError(self.path, "block checksum table is corrupted (its CRC does not match the header)")
        self._verified = np.zeros(h.n_blocks, dtype=bool)

    @property
    def token_count(self) -> int:
        return self.header.token_count

    def _verify_block(self, block: int) -> None:
        h = self.header
        lo, hi = block * h.block_tokens, min((block + 1) * h.block_tokens, h.token_count)
        chunk = self.tokens[lo:hi]
        crc = zlib.crc32(chunk.data)
        if crc != int(self._table[block]):
            raise ShardError(
                self.path,
                f"corrupted tokens in block {block} (tokens {lo}..{hi - 1}): "
                f"crc32 {crc:#010x}, expected {int(self._table[block]):#010x}",
            )
        if chunk.size and int(chunk.max()) >= h.vocab_size:
            raise ShardError(
                self.path, f"token id {int(chunk.max())} in block {block} is not below vocab size {h.vocab_size}"
            )
        self._verified[block] = True

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length), a view into the mapping, checked against the block table."""
        if start < 0 or start + length > self.header.token_count:
            raise ShardError(
                self.path,
                f"read of tokens {start}..{start + length - 1} is past the end ({self.header.token_count} tokens)",
            )
        bt = self.header.block_tokens
        for block in range(start // bt, (start + length - 1) // bt + 1):
            if not self._verified[block]:
                self._verify_block(block)
        return self.tokens[start : start + length]

    def verify_all(self) -> None:
        for block in range(self.header.n_blocks):
            if not self._verified[block]:
                self._verify_block(block)

    def close(self) -> None:
        """Drop the mapping (it stays alive while someone still holds a view from read())."""
        del self.tokens, self._table
        try:
            self._mm.close()
        except BufferError:
            pass
