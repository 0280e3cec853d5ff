"""The checkpoint engine: save and load any state, in any parallel layout, on any storage tier.

Save, in two parts:
  1. blocking (training waits): plan with DCP's planner (cached while the state's structure does
     not change), then copy this rank's items, and only those, into reusable staging buffers;
  2. background (training runs): serialize and write this rank's file, then every rank reports,
     and the coordinator writes DCP's `.metadata` and, last, the commit marker (our manifest).

Load: pick the newest committed checkpoint (the fastest tier wins a tie), plan with DCP's load
planner, and read only the overlapping byte ranges into the target tensors. Every rank loads the
same step: if any rank finds corruption, all of them fall back together.
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType
from torch.distributed.checkpoint.stateful import Stateful

from stalwart.checkpoint.manifest import (
    DCP_METADATA_NAME,
    MANIFEST_NAME,
    Manifest,
    ObjectEntry,
    SavingLayout,
    TensorEntry,
    parse_step_dir,
    step_dir,
)
from stalwart.checkpoint.planner import BalancedSavePlanner, ShardAwareLoadPlanner
from stalwart.checkpoint.reader import ChecksumError, RangedReader
from stalwart.checkpoint.retention import RetentionPolicy, to_delete
from stalwart.checkpoint.staging import StagingBuffers
from stalwart.checkpoint.storage.base import Storage, StorageError
from stalwart.checkpoint.writer import RankFileWriter

log = logging.getLogger("stalwart.checkpoint")


class CheckpointError(RuntimeError):
    pass


class NoCheckpoint(CheckpointError):
    pass


class SaveResult(BaseModel):
    step: int
    committed: bool
    error: str | None = None
    stall_seconds: float  # how long training waited
    total_seconds: float  # from the call to the commit
    bytes_written: int  # by this rank
    total_bytes: int  # by all ranks (coordinator; 0 elsewhere)
    tiers: list[str]


class CheckpointInfo(BaseModel):
    step: int
    tier: str
    location: str
    created_at: float
    total_bytes: int
    world_size: int


class SaveHandle:
    """An async save in flight. `wait()` returns its SaveResult; it never raises for a failed save."""

    def __init__(self, step: int, future: Future[SaveResult]) -> None:
        self.step = step
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> SaveResult:
        return self._future.result(timeout=timeout)


def _to_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state.items()}


class Checkpointer:
    """One per training process. With a process group, all its ranks construct it together."""

    def __init__(
        self,
        tiers: Storage | list[Storage],
        *,
        process_group: dist.ProcessGroup | None = None,
        retention: RetentionPolicy | None = None,
        parallelism: dict[str, int] | None = None,
        timeout: timedelta = timedelta(minutes=10),
    ) -> None:
        self.tiers = sorted(tiers if isinstance(tiers, list) else [tiers], key=lambda s: s.tier_rank)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size(process_group) if self.distributed else 1
        # A gloo group of our own: the background thread's collectives never meet training's.
        self.group = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self.retention = retention or RetentionPolicy()
        self.parallelism = parallelism or {}
        self.staging = StagingBuffers()
        self._pending: SaveHandle | None = None
        self.last_load_tier: str | None = None  # where the last load read from (memory, file, s3)
        self._plan_cache: tuple[str, SavePlan, Metadata] | None = None

    # -- collectives (no-ops on one process) -------------------------------------------------------
    def _all_gather(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def _broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    # -- save --------------------------------------------------------------------------------------
    def _plan(self, state_dict: dict[str, Any]) -> tuple[BalancedSavePlanner, SavePlan, Metadata]:
        planner = BalancedSavePlanner()
        planner.set_up_planner(state_dict, StorageMeta(), self.rank == 0)
        local = planner.create_local_plan()
        signature = hashlib.sha1(repr([(i.index, i.type, i.tensor_data) for i in local.items]).encode()).hexdigest()
        signatures = self._all_gather(signature)
        key = "|".join(signatures)
        if self._plan_cache is not None and self._plan_cache[0] == key:
            return planner, self._plan_cache[1], self._plan_cache[2]
        all_local = self._all_gather(local)
        global_plans, metadata = planner.create_global_plan(all_local)
        mine = planner.finish_plan(global_plans[self.rank])
        self._plan_cache = (key, mine, metadata)
        return planner, mine, metadata

    def save(self, state: Mapping[str, Any], step: int, *, blocking: bool = False) -> SaveHandle:
        """Snapshot `state` for `step`. Returns once the snapshot is staged; writing runs behind."""
        t0 = time.perf_counter()
        if self._pending is not None:
            self._pending.wait()  # one save in flight: its staging buffers are about to be reused
        state_dict = _to_state_dict(state)
        planner, plan, metadata = self._plan(state_dict)
        staged: list[tuple[MetadataIndex, torch.Tensor | io.BytesIO]] = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                staged.append((item.index, data))  # already serialized: a snapshot of the object
            else:
                staged.append((item.index, self.staging.stage(item.index, data)))  # type: ignore[arg-type]
        self.staging.synchronize()
        stall = time.perf_counter() - t0
        future: Future[SaveResult] = Future()
        thread = threading.Thread(
            target=self._write_and_commit,
            args=(step, staged, metadata, t0, stall, future),
            name=f"ckpt-save-{step}",
            daemon=True,
        )
        thread.start()
        self._pending = SaveHandle(step, future)
        if blocking:
            self._pending.wait()
        return self._pending

    def _write_and_commit(
        self, step: int, staged: list[Any], metadata: Metadata, t0: float, stall: float, future: Future[SaveResult]
    ) -> None:
        try:
            future.set_result(self._write_and_commit_inner(step, staged, metadata, t0, stall))
        except BaseException as exc:  # the handle must always resolve, or training would hang on it
            log.exception("checkpoint save failed", extra={"context": {"step": step, "rank": self.rank}})
            future.set_result(
                SaveResult(
                    step=step,
                    committed=False,
                    error=f"{type(exc).__name__}: {exc}",
                    stall_seconds=stall,
                    total_seconds=time.perf_counter() - t0,
                    bytes_written=0,
                    total_bytes=0,
                    tiers=[],
                )
            )

    def _write_and_commit_inner(
        self, step: int, staged: list[Any], metadata: Metadata, t0: float, stall: float
    ) -> SaveResult:
        folder = step_dir(step)
        file = f"__{self.rank}_0.distcp"
        written = 0
        report: dict[str, Any] = {"error": None}
        writers: list[RankFileWriter] = []
        for tier in self.tiers:
            out = None
            try:
                out = tier.open_writer(f"{folder}/{file}")
                w = RankFileWriter(out, file, self.rank)
                for index, data in staged:
                    if isinstance(data, io.BytesIO):
                        w.write_bytes(index, data)
                    else:
                        w.write_tensor(index, data)
                out.close()
                writers.append(w)
                written += out.tell()
            except Exception as exc:
                # or the other ranks would wait there forever. (torch.save re-raises a storage error
                # from its write callback as a RuntimeError, so the type tells us nothing.)
                if out is not None:
                    out.abort()
                report["error"] = f"rank {self.rank} writing {tier.describe(folder + '/' + file)}: {exc}"
                break
        if report["error"] is None and writers:
            w = writers[0]
            report.update(results=w.results, shards=w.shard_fqns, objects=w.objects, bytes=written)
        reports = self._all_gather(report)
        errors = [r["error"] for r in reports if r["error"]]
        total = 0
        if self.rank == 0:
            if errors:
                for tier in self.tiers:  # nothing half-written stays behind
                    tier.delete_dir(folder)
            else:
                total = self._commit(step, folder, metadata, reports)
        committed = self._broadcast(not errors)
        return SaveResult(
            step=step,
            committed=bool(committed),
            error="; ".join(errors) or None,
            stall_seconds=stall,
            total_seconds=time.perf_counter() - t0,
            bytes_written=written,
            total_bytes=total,
            tiers=[t.name for t in self.tiers],
        )

    def _commit(self, step: int, folder: str, metadata: Metadata, reports: list[dict[str, Any]]) -> int:
        storage_data = {wr.index: wr.storage_data for r in reports for wr in r["results"]}
        dcp_metadata = Metadata(
            state_dict_metadata=metadata.state_dict_metadata,
            planner_data=metadata.planner_data,
            storage_data=storage_data,
            storage_meta=StorageMeta(),
        )
        tensors: dict[str, TensorEntry] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                tensors[fqn] = TensorEntry(dtype=str(md.properties.dtype).removeprefix("torch."), shape=list(md.size))
        objects: dict[str, ObjectEntry] = {}
        for r in reports:
            for fqn, shard in r["shards"]:
                tensors[fqn].shards.append(shard)
            objects.update(r["objects"])
        manifest = Manifest(
            step=step,
            layout=SavingLayout(
                world_size=self.world, parallelism=self.parallelism, per_rank_bytes=[r["bytes"] for r in reports]
            ),
            tensors=tensors,
            objects=objects,
            total_bytes=sum(r["bytes"] for r in reports),
        )
        for tier in self.tiers:
            tier.write_bytes(f"{folder}/{DCP_METADATA_NAME}", pickle.dumps(dcp_metadata))
            tier.write_bytes(f"{folder}/{MANIFEST_NAME}", manifest.model_dump_json().encode())  # the commit
            self._apply_retention(tier)
        return manifest.total_bytes

    def _apply_retention(self, tier: Storage) -> None:
        committed = [s.step for s in self.catalog(tier)]
        for step in to_delete(committed, self.retention):
            tier.delete_dir(step_dir(step))
        newest = max(committed, default=None)
        for name in tier.list_dirs():  # folders of saves that died before their commit
            died = parse_step_dir(name)
            if died is not None and newest is not None and died < newest and died not in committed:
                tier.delete_dir(name)

    def wait(self) -> SaveResult | None:
        return self._pending.wait() if self._pending is not None else None

    # -- catalog -----------------------------------------------------------------------------------
    @staticmethod
    def list_committed(tier: Storage) -> list[CheckpointInfo]:
        """Committed checkpoints on one tier (those with a commit marker), in no particular order."""
        out = []
        for name in tier.list_dirs():
            step = parse_step_dir(name)
            raw = tier.read_bytes(f"{name}/{MANIFEST_NAME}") if step is not None else None
            if raw is None:
                continue
            m = Manifest.model_validate_json(raw)
            out.append(
                CheckpointInfo(
                    step=m.step,
                    tier=tier.name,
                    location=tier.describe(name),
                    created_at=m.created_at,
                    total_bytes=m.total_bytes,
                    world_size=m.layout.world_size,
                )
            )
        return out

    def catalog(self, tier: Storage | None = None) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first (the fastest tier first for a step on several)."""
        rank = {t.name: t.tier_rank for t in self.tiers}
        out = [c for t in ([tier] if tier is not None else self.tiers) for c in self.list_committed(t)]
        return sorted(out, key=lambda c: (c.step, rank.get(c.tier, 0)))

    def latest(self) -> int | None:
        steps = [c.step for c in self.catalog()]
        return max(steps) if steps else None

    def manifest(self, step: int) -> tuple[Storage, Manifest]:
        for tier in self.tiers:  # fastest first
            raw = tier.read_bytes(f"{step_dir(step)}/{MANIFEST_NAME}")
            if raw is not None:
                return tier, Manifest.model_validate_json(raw)
        raise NoCheckpoint(f"no committed checkpoint for step {step} in {[t.describe() for t in self.tiers]}")

    # -- load --------------------------------------------------------------------------------------
    def load(self, state: Mapping[str, Any], step: int | None = None, *, fallback: bool = False) -> int:
        """Load the given step (default: the newest) into `state`, in place. Returns the step loaded.

        With `fallback`, a checkpoint that fails its checksums is skipped for the one before it.
        """
        steps = sorted({c.step for c in self.catalog()}, reverse=True)
        steps = self._broadcast(steps)  # every rank considers the same candidates
        if step is not None:
            if step not in steps:
                raise NoCheckpoint(f"step {step} has no committed checkpoint (committed: {sorted(steps)})")
            steps = steps[steps.index(step) :] if fallback else [step]
        if not steps:
            raise NoCheckpoint(f"no committed checkpoint in {[t.describe() for t in self.tiers]}")
        errors = []
        for candidate in steps:
            error = None
            try:
                self._load_step(state, candidate)
            except (ChecksumError, StorageError) as exc:
                error = f"rank {self.rank}: {exc}"
            all_errors = [e for e in self._all_gather(error) if e]
            if not all_errors:
                return candidate
            errors += all_errors
            log.error("checkpoint unusable", extra={"context": {"step": candidate, "errors": all_errors}})
            if not fallback:
                raise ChecksumError("; ".join(all_errors))
        raise CheckpointError("no usable checkpoint: " + "; ".join(errors))

    def _load_step(self, state: Mapping[str, Any], step: int) -> None:
        """From the fastest tier that holds the step whole; a tier missing bytes or failing its
        checksums hands over to the next (host memory after a node loss, then storage)."""
        errors = []
        for tier in self.tiers:
            raw = tier.read_bytes(f"{step_dir(step)}/{MANIFEST_NAME}")
            if raw is None:
                continue
            try:
                self._load_from(tier, Manifest.model_validate_json(raw), state, step)
                self.last_load_tier = tier.name
                return
            except (ChecksumError, StorageError) as exc:
                errors.append(exc)
                log.warning(
                    "checkpoint tier unusable; trying the next",
                    extra={"context": {"step": step, "tier": tier.name, "error": str(exc)}},
                )
        if not errors:
            raise NoCheckpoint(f"no committed checkpoint for step {step} in {[t.describe() for t in self.tiers]}")
        raise errors[-1]

    def _load_from(self, tier: Storage, manifest: Manifest, state: Mapping[str, Any], step: int) -> None:
        raw_md = tier.read_bytes(f"{step_dir(step)}/{DCP_METADATA_NAME}")
        if raw_md is None:
            raise StorageError(f"{tier.describe(step_dir(step))} has a commit marker but no {DCP_METADATA_NAME}")
        metadata: Metadata = pickle.loads(raw_md)
        state_dict = _to_state_dict(state)
        planner = ShardAwareLoadPlanner()
        planner.set_up_planner(state_dict, metadata, self.rank == 0)
        plan = planner.finish_plan(planner.create_local_plan())
        RangedReader(tier, step_dir(step), manifest).execute(plan, planner)
        for key, obj in state.items():
            if isinstance(obj, Stateful):
                obj.load_state_dict(state_dict[key])
            elif isinstance(state, dict) and not isinstance(obj, (torch.Tensor, dict)):
                state[key] = state_dict[key]  # a plain value (an int, a list...) comes back by assignment

    def close(self) -> None:
        self.wait()
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
