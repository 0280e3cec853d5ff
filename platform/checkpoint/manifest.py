"""The commit marker: global metadata of a checkpoint, written last, after every rank has finished.

A checkpoint folder without it does not exist for `load` or `latest`. It records, for every tensor,
its global shape and dtype, and for every saved shard its box in the global tensor and where its
bytes are, with checksums per block so a ranged read can verify exactly what it read.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, Field

MANIFEST_NAME = "stalwart-manifest.json"
DCP_METADATA_NAME = ".metadata"
FORMAT_VERSION = 1
BLOCK_SIZE = 256 << 10  # checksum granularity: a ranged read verifies whole blocks it touches


def step_dir(step: int) -> str:
    return f"step-{step:010d}"


def parse_step_dir(name: str) -> int | None:
    if name.startswith("step-") and name[5:].isdigit():
        return int(name[5:])
    return None


class ShardEntry(BaseModel):
    offsets: list[int]  # the box's corner in the global tensor
    lengths: list[int]  # the box's size
    file: str  # relative to the checkpoint folder
    blob_offset: int  # where DCP's torch.save blob of this shard starts in `file`
    blob_length: int
    data_offset: int  # where the raw, row-major bytes start in `file`
    nbytes: int
    checksum: int  # over the block checksums
    block_checksums: list[int]  # of each BLOCK_SIZE block of the raw bytes
    rank: int  # the rank that wrote it


class TensorEntry(BaseModel):
    dtype: str
    shape: list[int]
    shards: list[ShardEntry] = []


class ObjectEntry(BaseModel):
    file: str
    offset: int
    length: int
    checksum: int
    rank: int


class SavingLayout(BaseModel):
    """How the job that saved was laid out; informative only: loading never depends on it."""

    world_size: int
    parallelism: dict[str, int] = {}
    per_rank_bytes: list[int] = []


class Manifest(BaseModel):
    format_version: int = FORMAT_VERSION
    step: int
    created_at: float = Field(default_factory=time.time)
    block_size: int = BLOCK_SIZE
    checksum_algorithm: str = "xxh3_64"
    layout: SavingLayout
    tensors: dict[str, TensorEntry] = {}
    objects: dict[str, ObjectEntry] = {}
    total_bytes: int = 0

    def files(self) -> set[str]:
        out = {s.file for t in self.tensors.values() for s in t.shards}
        return out | {o.file for o in self.objects.values()}
