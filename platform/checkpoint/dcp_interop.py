"""Plain DCP and a Stalwart checkpoint: a safe reader for `dcp.load`, and an export to DCP's layout.

A Stalwart checkpoint keeps DCP's file layout (one file per rank, a torch.save blob per shard) but
no `.metadata` pickle: DCP's FileSystemReader unpickles that file, and whoever can write to the
storage could make it run code. Two ways in for code that speaks DCP:

    dcp.load(state, storage_reader=DCPReader("/ckpt/run1", step))   # metadata from the manifest
    stalwart checkpoint export-dcp /ckpt/run1 1200 /tmp/dcp-1200     # a folder DCP reads by path

The reader hands DCP's planner only verified tensor bytes and values read as plain data. The
export rewrites the files from verified bytes and plain values, and writes a `.metadata` built
from the manifest: what it contains was produced here, not read from storage.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from pydantic import BaseModel
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from stalwart.checkpoint import objects
from stalwart.checkpoint.dcp_metadata import dcp_metadata
from stalwart.checkpoint.errors import CheckpointError, NoCheckpoint
from stalwart.checkpoint.manifest import MANIFEST_NAME, Manifest, ShardEntry, parse_step_dir, read_manifest, step_dir
from stalwart.checkpoint.reader import RangedReader
from stalwart.checkpoint.storage import open_storage
from stalwart.checkpoint.storage.base import Storage
from stalwart.checkpoint.storage.filesystem import FileStorage
from stalwart.checkpoint.writer import RankFileWriter

DCP_METADATA_NAME = ".metadata"


def read_step_manifest(storage: Storage, step: int | None) -> tuple[int, Manifest]:
    """The given step's manifest, or the newest step's; raises NoCheckpoint or ManifestError."""
    if step is None:
        steps = sorted((s for n in storage.list_dirs() if (s := parse_step_dir(n)) is not None), reverse=True)
        step = next((s for s in steps if storage.read_bytes(f"{step_dir(s)}/{MANIFEST_NAME}") is not None), None)
        if step is None:
            raise NoCheckpoint(f"no committed checkpoint in {storage.describe()}")
    path = f"{step_dir(step)}/{MANIFEST_NAME}"
    raw = storage.read_bytes(path)
    if raw is None:
        raise NoCheckpoint(f"no committed checkpoint for step {step} in {storage.describe()}")
    return step, read_manifest(raw, storage.describe(path))


class DCPReader(StorageReader):
    """A DCP StorageReader over a Stalwart checkpoint on any tier (a URI or a Storage)."""

    def __init__(self, where: str | Storage, step: int | None = None) -> None:
        self.storage = open_storage(where) if isinstance(where, str) else where
        self.step = step
        self.manifest: Manifest | None = None

    def _load_manifest(self) -> Manifest:
        if self.manifest is None:
            self.step, self.manifest = read_step_manifest(self.storage, self.step)
        return self.manifest

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        return dcp_metadata(self._load_manifest())

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: object, **kwargs: object) -> None:
        self._load_manifest()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        manifest = self._load_manifest()
        assert self.step is not None
        RangedReader(self.storage, step_dir(self.step), manifest).execute(plan, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP on its own: it is asked for by name


class ExportResult(BaseModel):
    step: int
    folder: str
    files: int
    tensors: int
    values: int
    bytes_written: int


def export_dcp(storage: Storage, step: int | None, out: str | Path) -> ExportResult:
    """Write the step as a plain DCP checkpoint folder at `out` (which must not hold one already)."""
    step, manifest = read_step_manifest(storage, step)
    target = Path(out)
    if target.exists() and any(target.iterdir()):
        raise CheckpointError(f"{target} is not empty: export into a new folder")
    reader = RangedReader(storage, step_dir(step), manifest)
    dest = FileStorage(target)
    by_file: dict[str, list[tuple[int, str, ShardEntry | None]]] = {}
    for fqn, t in manifest.tensors.items():
        for shard in t.shards:
            by_file.setdefault(shard.file, []).append((shard.blob_offset, fqn, shard))
    for fqn, o in manifest.objects.items():
        by_file.setdefault(o.file, []).append((o.offset, fqn, None))
    metadata = dcp_metadata(manifest)
    storage_data = {}
    written = 0
    for file, entries in sorted(by_file.items()):
        out_file = dest.open_writer(file)
        writer = RankFileWriter(out_file, file, rank=0)
        for _, fqn, entry in sorted(entries, key=lambda e: e[0]):
            if entry is None:
                writer.write_bytes(MetadataIndex(fqn), objects.serialize(fqn, reader.read_value(fqn)))
            else:
                writer.write_tensor(MetadataIndex(fqn, list(entry.offsets)), reader.read_shard(fqn, entry))
        out_file.close()
        written += out_file.tell()
        storage_data.update({r.index: r.storage_data for r in writer.results})
    metadata.storage_data = storage_data
    dest.write_bytes(DCP_METADATA_NAME, pickle.dumps(metadata))  # built here from the manifest, not read
    return ExportResult(
        step=step,
        folder=str(target),
        files=len(by_file),
        tensors=len(manifest.tensors),
        values=len(manifest.objects),
        bytes_written=written,
    )
