"""The token shard file format (version 1): a checked header, the tokens, a table of block checksums.

    offset 0             64-byte header (magic, version, dtype, counts, table checksum, header checksum)
    offset 64            token_count tokens, little-endian uint16 or uint32
    offset table_offset  one CRC32 (uint32) per block of block_tokens tokens, 8-byte aligned

The file size follows from the header, so truncation is caught at open without reading the data;
the block table lets a reader verify exactly the blocks it touches, so corruption is caught on the
first read of a damaged block, whatever the position, without a full scan at every (re)start.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stalwart.dataloader.errors import ShardError

MAGIC = b"STWTOKS\x00"
VERSION = 1
HEADER_SIZE = 64
DEFAULT_BLOCK_TOKENS = 1 << 16
SUFFIX = ".stok"

# magic, version, dtype code, reserved, block_tokens, token_count, doc_count, vocab_size, eos_id,
# table_crc, 16 reserved bytes, header_crc (over the 60 bytes before it).
_HEADER = struct.Struct("<8sHBBIQQIiI16xI")
assert _HEADER.size == HEADER_SIZE
_DTYPE_CODES: dict[int, np.dtype] = {1: np.dtype("<u2"), 2: np.dtype("<u4")}
_CODE_OF = {dtype: code for code, dtype in _DTYPE_CODES.items()}


def _align8(n: int) -> int:
    return (n + 7) & ~7


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The narrowest token dtype that holds every id below vocab_size."""
    return _DTYPE_CODES[1] if vocab_size <= 1 << 16 else _DTYPE_CODES[2]


@dataclass(frozen=True)
class ShardHeader:
    dtype: np.dtype
    block_tokens: int
    token_count: int
    doc_count: int
    vocab_size: int
    eos_id: int  # -1: no end-of-document token
    table_crc: int
    version: int = VERSION

    @property
    def data_offset(self) -> int:
        return HEADER_SIZE

    @property
    def table_offset(self) -> int:
        return _align8(HEADER_SIZE + self.token_count * self.dtype.itemsize)

    @property
    def n_blocks(self) -> int:
        return -(-self.token_count // self.block_tokens)

    @property
    def file_size(self) -> int:
        return self.table_offset + 4 * self.n_blocks

    def pack(self) -> bytes:
        body = _HEADER.pack(
            MAGIC,
            self.version,
            _CODE_OF[self.dtype],
            0,
            self.block_tokens,
            self.token_count,
            self.doc_count,
            self.vocab_size,
            self.eos_id,
            self.table_crc,
            0,
        )
        return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))

    @classmethod
    def unpack(cls, raw: bytes, path: str | Path) -> ShardHeader:
        if len(raw) < HEADER_SIZE:
            raise ShardError(path, f"truncated: {len(raw)} bytes, shorter than the {HEADER_SIZE}-byte header")
        fields = _HEADER.unpack(raw[:HEADER_SIZE])
        magic, version, code, _, block_tokens, token_count, doc_count, vocab, eos, table_crc, header_crc = fields
        if magic != MAGIC:
            raise ShardError(path, f"not a Stalwart token shard (magic {magic!r}, expected {MAGIC!r})")
        if zlib.crc32(raw[: HEADER_SIZE - 4]) != header_crc:
            raise ShardError(path, "header checksum mismatch: the header is corrupted")
        if version != VERSION:
            raise ShardError(path, f"unsupported shard version {version} (this build reads version {VERSION})")
        if code not in _DTYPE_CODES:
            raise ShardError(path, f"unknown token dtype code {code}")
        if block_tokens <= 0:
            raise ShardError(path, f"invalid block size {block_tokens}")
        return cls(_DTYPE_CODES[code], block_tokens, token_count, doc_count, vocab, eos, table_crc, version)


def block_crcs(tokens: np.ndarray, block_tokens: int) -> np.ndarray:
    n_blocks = -(-tokens.size // block_tokens)
    return np.array(
        [zlib.crc32(tokens[i * block_tokens : (i + 1) * block_tokens].tobytes()) for i in range(n_blocks)],
        dtype="<u4",
    )


def write_shard(
    path: str | Path,
    tokens: np.ndarray,
    *,
    vocab_size: int,
    eos_id: int = -1,
    doc_count: int = 0,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
) -> ShardHeader:
    """Write tokens as a shard, atomically (a crash leaves no file that looks complete)."""
    path = Path(path)
    dtype = dtype_for_vocab(vocab_size)
    data = np.ascontiguousarray(tokens, dtype=dtype)
    if data.ndim != 1:
        raise ValueError("tokens must be one-dimensional")
    if data.size and int(data.max()) >= vocab_size:
        raise ValueError(f"token id {int(data.max())} is not below vocab_size {vocab_size}")
    table = block_crcs(data, block_tokens)
    header = ShardHeader(
        dtype, block_tokens, int(data.size), doc_count, vocab_size, eos_id, zlib.crc32(table.tobytes())
    )
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(header.pack())
        f.write(data.tobytes())
        f.write(b"\0" * (header.table_offset - HEADER_SIZE - data.nbytes))
        f.write(table.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return header


def read_header(path: str | Path) -> ShardHeader:
    """Read and check a shard's header and size: catches bad magic, corruption and truncation."""
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise ShardError(path, "no such shard file") from None
    except IsADirectoryError:
        raise ShardError(path, "is a directory, not a shard file") from None
    header = ShardHeader.unpack(raw, path)
    if size < header.file_size:
        raise ShardError(
            path,
            f"truncated: the header promises {header.token_count} tokens ({header.file_size} bytes) "
            f"but the file has {size} bytes",
        )
    if size > header.file_size:
        raise ShardError(path, f"{size - header.file_size} unexpected trailing bytes after the checksum table")
    return header
