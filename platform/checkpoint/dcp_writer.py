"""Plain `dcp.save` / `dcp.async_save` onto Stalwart's tiers: a DCP StorageWriter that writes a Stalwart checkpoint.

    dcp.save(state, storage_writer=DCPWriter(["mem://...", "/ckpt/run1"], step))
    dcp.load(state, storage_reader=DCPReader("/ckpt/run1", step))

Each rank writes its file with the engine's RankFileWriter (DCP's layout, checksums per block) on
every tier; the coordinator writes the engine's commit marker (the manifest, JSON) last, on every
tier, once DCP has gathered every rank's results. No `.metadata` pickle is written: DCPReader and
the engine's `load` build DCP's metadata from the manifest. A save that fails on any rank leaves no
commit marker, so it does not exist for a load or `stalwart checkpoint ls`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from stalwart.checkpoint.engine import Checkpointer, SaveResult, build_manifest
from stalwart.checkpoint.errors import CheckpointError
from stalwart.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    ObjectEntry,
    ShardEntry,
    parse_step_dir,
    step_dir,
)
from stalwart.checkpoint.retention import RetentionPolicy, to_delete
from stalwart.checkpoint.storage import open_storage
from stalwart.checkpoint.storage.base import ObjectWriter, Storage, StorageError
from stalwart.checkpoint.writer import RankFileWriter

log = logging.getLogger("stalwart.checkpoint.dcp")

Tiers = str | Storage | Sequence[str | Storage]


@dataclass(frozen=True)
class _Written:
    """What one write item became: DCP's location of its bytes, and its manifest entry."""

    info: _StorageInfo
    shard: ShardEntry | None = None
    obj: ObjectEntry | None = None


def open_tiers(where: Tiers) -> list[Storage]:
    """Storages from URIs (or Storages), fastest first, as the engine orders them."""
    items = [where] if isinstance(where, str | Storage) else list(where)
    if not items:
        raise CheckpointError("DCPWriter needs at least one tier (a URI or a Storage)")
    return sorted((open_storage(w) if isinstance(w, str) else w for w in items), key=lambda s: s.tier_rank)


def step_from_id(checkpoint_id: str | os.PathLike[str] | None) -> int | None:
    """DCP's checkpoint_id read as a step: `1200`, or a path ending in `step-0000001200`."""
    if checkpoint_id is None:
        return None
    name = os.path.basename(os.fspath(checkpoint_id).rstrip("/"))
    step = int(name) if name.isdigit() else parse_step_dir(name)
    if step is None:
        raise CheckpointError(f"checkpoint_id {checkpoint_id!r} names no step: pass a step number or a step-N folder")
    return step


def manifest_from(step: int, metadata: Metadata, results: list[list[WriteResult]]) -> Manifest:
    """The commit marker for DCP's global metadata and every rank's write results."""
    shards: list[tuple[str, ShardEntry]] = []
    objects: dict[str, ObjectEntry] = {}
    per_rank = [0] * len(results)
    for rank, rank_results in enumerate(results):
        for r in rank_results:
            written = r.storage_data
            if not isinstance(written, _Written):
                raise CheckpointError(f"rank {rank}'s result for {r.index.fqn} was not written by a DCPWriter")
            per_rank[rank] = max(per_rank[rank], written.info.offset + written.info.length)
            if written.shard is not None:
                shards.append((r.index.fqn, written.shard))
            elif written.obj is not None:
                objects[r.index.fqn] = written.obj
    return build_manifest(step, metadata, shards, objects, per_rank)


class DCPWriter(StorageWriter):
    """A DCP StorageWriter that writes the step as a Stalwart checkpoint on every tier given.

    One per save: `step` (or DCP's checkpoint_id, read as a step) names the folder. `retention`
    prunes older committed steps on each tier after the commit, as the engine does.
    """

    def __init__(self, where: Tiers, step: int | None = None, *, retention: RetentionPolicy | None = None) -> None:
        super().__init__()
        self.tiers = open_tiers(where)
        self.step = step
        self.retention = retention
        self.rank = 0
        self.is_coordinator = True
        self.bytes_written = 0  # this rank's file, on each tier
        self.total_bytes = 0  # every rank's (coordinator)
        self._t0 = time.perf_counter()

    # -- DCP's protocol ----------------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        step = step_from_id(checkpoint_id)
        if step is not None:
            self.step = step
        self._t0 = time.perf_counter()

    def set_up_storage_writer(
        self, is_coordinator: bool, *args: object, rank: int | None = None, **kwargs: object
    ) -> None:
        if self.step is None:
            raise CheckpointError("DCPWriter has no step: pass DCPWriter(where, step) or dcp.save(checkpoint_id=step)")
        self.is_coordinator = is_coordinator
        self.rank = rank if rank is not None else _global_rank()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assert self.step is not None
        file = f"__{self.rank}_0.distcp"
        path = f"{step_dir(self.step)}/{file}"
        outs: list[tuple[Storage, ObjectWriter]] = []
        results: list[WriteResult] = []
        try:
            for tier in self.tiers:
                out = tier.open_writer(path)
                outs.append((tier, out))
                w = RankFileWriter(out, file, self.rank)
                first = not results
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        w.write_bytes(item.index, data)  # type: ignore[arg-type]
                        written = _Written(w.results[-1].storage_data, obj=w.objects[item.index.fqn])
                    else:
                        w.write_tensor(item.index, _own_storage(data))  # type: ignore[arg-type]
                        written = _Written(w.results[-1].storage_data, shard=w.shard_fqns[-1][1])
                    if first:  # the same on every tier
                        last = w.results[-1]
                        results.append(
                            WriteResult(index=last.index, size_in_bytes=last.size_in_bytes, storage_data=written)
                        )
            for _, out in outs:
                out.close()  # fsync, complete the upload...
            self.bytes_written = outs[0][1].tell() if outs else 0
        except Exception as exc:
            for _, out in outs:
                out.abort()
            where = [t.describe(path) for t, _ in outs] or [t.describe(path) for t in self.tiers]
            raise CheckpointError(f"rank {self.rank} writing {where[-1]}: {exc}") from exc
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit (coordinator only, after every rank wrote): the manifest, last, on every tier."""
        assert self.step is not None
        manifest = manifest_from(self.step, metadata, results)
        for tier in self.tiers:
            tier.write_bytes(f"{step_dir(self.step)}/{MANIFEST_NAME}", manifest.to_bytes())
            if self.retention is not None:
                self._prune(tier)
        self.total_bytes = manifest.total_bytes

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # never picked by DCP on its own: it is asked for by name

    # -- for the training script -------------------------------------------------------------------
    def outcome(self, stall_seconds: float = 0.0) -> SaveResult:
        """The save as the worker SDK's report_save takes it; call once dcp.save (or async_save's
        future) returned without an error, which DCP raises on every rank if any rank failed."""
        assert self.step is not None
        return SaveResult(
            step=self.step,
            committed=True,
            stall_seconds=stall_seconds,
            total_seconds=time.perf_counter() - self._t0,
            bytes_written=self.bytes_written,
            total_bytes=self.total_bytes,
            tiers=[t.name for t in self.tiers],
            location=self.tiers[-1].describe(step_dir(self.step)),
        )

    def _prune(self, tier: Storage) -> None:
        assert self.retention is not None
        try:
            committed = Checkpointer.committed_steps(tier)
            for step in to_delete(committed, self.retention):
                tier.delete_dir(step_dir(step))
        except StorageError as exc:  # the checkpoint is committed: pruning is best effort
            log.warning("could not prune old checkpoints", extra={"context": {"tier": tier.name, "error": str(exc)}})


def _own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor on the host, alone in a contiguous storage: torch.save writes a view's whole
    storage, and the manifest's checksums cover exactly the shard's bytes."""
    t = tensor.detach().cpu()
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
