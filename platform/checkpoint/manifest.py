"""The commit marker: every fact about a checkpoint, in JSON, written last, after every rank finished.

A checkpoint folder without it does not exist for `load` or `latest`. It records, for every tensor,
its global shape and dtype, and for every saved shard its box in the global tensor and where its
bytes are, with checksums per block so a ranged read can verify exactly what it read; for every
non-tensor value, where its bytes are and their checksum; and how the saved state was nested. It
is all a load needs: nothing else is read before the bytes it points at, and nothing in it is code.

On storage the manifest is wrapped with a digest of its exact bytes,

    {"xxh3_64":"<16 hex digits>","manifest":{...}}

so a corrupt marker is caught like a corrupt shard. `read_manifest` is the only way in: it either
returns a manifest whose every box, offset and checksum list is consistent, or raises ManifestError.
"""

from __future__ import annotations

import math
import re
import time
from typing import Annotated, Literal

import xxhash
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from stalwart.checkpoint.errors import ManifestError

MANIFEST_NAME = "stalwart-manifest.json"
FORMAT_VERSION: Literal[2] = 2
BLOCK_SIZE = 256 << 10  # checksum granularity: a ranged read verifies whole blocks it touches
MAX_MANIFEST_BYTES = 512 << 20  # a marker past this is refused unread (a 1 TB state needs ~100 MB)
MAX_OBJECT_BYTES = 256 << 20  # non-tensor values are counters and settings, not payloads

#: bytes per element of the dtypes a checkpoint may hold (torch's names)
DTYPE_SIZES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}

_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")  # one name inside the step's folder, no '/'
_WRAP_HEAD = b'{"xxh3_64":"'
_WRAP_MID = b'","manifest":'
_BODY_START = len(_WRAP_HEAD) + 16 + len(_WRAP_MID)

U64 = Annotated[int, Field(ge=0, lt=1 << 64)]
NonNeg = Annotated[int, Field(ge=0)]


def step_dir(step: int) -> str:
    return f"step-{step:010d}"


def parse_step_dir(name: str) -> int | None:
    if name.startswith("step-") and name[5:].isdigit():
        return int(name[5:])
    return None


def _file_name(value: str) -> str:
    if not _FILE.fullmatch(value):
        raise ValueError(f"file name {value!r} is not a plain name inside the checkpoint's folder")
    return value


class ShardEntry(BaseModel):
    offsets: list[NonNeg]  # the box's corner in the global tensor
    lengths: list[NonNeg]  # the box's size
    file: str  # relative to the checkpoint folder
    blob_offset: NonNeg  # where DCP's torch.save blob of this shard starts in `file`
    blob_length: NonNeg
    data_offset: NonNeg  # where the raw, row-major bytes start in `file`
    nbytes: NonNeg
    checksum: U64  # over the block checksums
    block_checksums: list[U64]  # of each BLOCK_SIZE block of the raw bytes
    rank: NonNeg  # the rank that wrote it

    _file = field_validator("file")(_file_name)

    @model_validator(mode="after")
    def _inside_blob(self) -> ShardEntry:
        if len(self.offsets) != len(self.lengths):
            raise ValueError(f"a shard box with {len(self.offsets)} offsets and {len(self.lengths)} lengths")
        if (
            not self.blob_offset
            <= self.data_offset
            <= self.data_offset + self.nbytes
            <= self.blob_offset + (self.blob_length)
        ):
            raise ValueError("a shard's raw bytes lie outside its blob")
        return self


class TensorEntry(BaseModel):
    dtype: str
    shape: list[NonNeg] = Field(max_length=64)
    shards: list[ShardEntry] = []

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in DTYPE_SIZES:
            raise ValueError(f"dtype {value!r} is not one a checkpoint may hold")
        return value


class ObjectEntry(BaseModel):
    file: str
    offset: NonNeg
    length: Annotated[int, Field(ge=0, le=MAX_OBJECT_BYTES)]
    checksum: U64
    rank: NonNeg

    _file = field_validator("file")(_file_name)


class SavingLayout(BaseModel):
    """How the job that saved was laid out; informative only: loading never depends on it."""

    world_size: Annotated[int, Field(ge=1)]
    parallelism: dict[str, int] = {}
    per_rank_bytes: list[NonNeg] = []


class Manifest(BaseModel):
    format_version: Literal[1, 2] = FORMAT_VERSION
    step: NonNeg
    created_at: float = Field(default_factory=time.time)
    block_size: Annotated[int, Field(ge=512, le=1 << 30)] = BLOCK_SIZE
    checksum_algorithm: Literal["xxh3_64"] = "xxh3_64"
    layout: SavingLayout
    tensors: dict[str, TensorEntry] = {}
    objects: dict[str, ObjectEntry] = {}
    #: where each flattened name sits in the nested state dict (DCP's planner_data); format 2 on
    mappings: dict[str, list[str | int]] = {}
    total_bytes: NonNeg = 0

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for fqn, t in self.tensors.items():
            elem = DTYPE_SIZES[t.dtype]
            for s in t.shards:
                if len(s.offsets) != len(t.shape):
                    raise ValueError(f"tensor {fqn!r}: a shard of rank {len(s.offsets)} in a tensor of {len(t.shape)}")
                if any(o + n > d for o, n, d in zip(s.offsets, s.lengths, t.shape, strict=True)):
                    raise ValueError(f"tensor {fqn!r}: shard at {s.offsets} falls outside shape {t.shape}")
                if s.nbytes != math.prod(s.lengths) * elem:
                    raise ValueError(f"tensor {fqn!r}: shard at {s.offsets} holds {s.nbytes} bytes, not its box's")
                if len(s.block_checksums) != -(-s.nbytes // self.block_size):
                    raise ValueError(f"tensor {fqn!r}: shard at {s.offsets} has the wrong number of block checksums")
        return self

    def files(self) -> set[str]:
        out = {s.file for t in self.tensors.values() for s in t.shards}
        return out | {o.file for o in self.objects.values()}

    def to_bytes(self) -> bytes:
        """The stored form: the JSON body wrapped with the digest of its exact bytes."""
        body = self.model_dump_json().encode()
        return _WRAP_HEAD + xxhash.xxh3_64_hexdigest(body).encode() + _WRAP_MID + body + b"}"


def read_manifest(raw: bytes, where: str) -> Manifest:
    """Parse and check a stored commit marker; ManifestError (naming `where`) is the only failure."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: the commit marker is {len(raw)} bytes, over {MAX_MANIFEST_BYTES}")
    if raw.startswith(_WRAP_HEAD):
        digest, body = raw[len(_WRAP_HEAD) : len(_WRAP_HEAD) + 16], raw[_BODY_START:-1]
        if raw[len(_WRAP_HEAD) + 16 : _BODY_START] != _WRAP_MID or not raw.endswith(b"}"):
            raise ManifestError(f"{where}: the commit marker is malformed: the checkpoint is corrupt")
        if xxhash.xxh3_64_hexdigest(body).encode() != digest:
            raise ManifestError(f"{where}: the commit marker fails its digest: the checkpoint is corrupt")
        legacy = False
    else:
        body, legacy = raw, True  # format 1 had no digest
    try:
        manifest = Manifest.model_validate_json(body)
    except (ValidationError, ValueError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) and exc.errors() else None
        what = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first else str(exc)[:200]
        raise ManifestError(f"{where}: the commit marker is not a valid manifest ({what})") from None
    if legacy and manifest.format_version != 1:
        raise ManifestError(f"{where}: a format {manifest.format_version} commit marker without its digest")
    return manifest
