"""The checkpoint engine: save and load any state, in any parallel layout, on any storage tier.

Save, in three parts:
  1. on the training thread (what `save()` costs): the state's structure and this rank's write
     items (no collective: with an unchanged structure the plan is the cached one), its non-tensor
     values serialized, and copies of the tensors no watched optimizer writes (buffers, RNG...);
  2. the stager thread: every rank checks the cached plan still holds (or plans again, all
     together), then copies the parameters and optimizer moments while the next forward and
     backward run; a watched optimizer's step waits only for its own tensors (step_guard.py);
  3. the writer thread, at low CPU and I/O priority: serialize and write this rank's file, every
     rank reports, and the coordinator writes the commit marker (the manifest, in JSON), last.

Load: pick the newest committed checkpoint (the fastest tier wins a tie), plan with DCP's load
planner over metadata built from the manifest (never unpickled), and read only the overlapping
byte ranges into the target tensors. Every rank loads the same step: if any rank finds
corruption, all of them fall back together.
"""

from __future__ import annotations

import hashlib
import io
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from pydantic import BaseModel
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from stalwart.checkpoint.dcp_metadata import dcp_metadata
from stalwart.checkpoint.errors import (
    CheckpointError,
    ChecksumError,
    ManifestError,
    NoCheckpoint,
    UnsafeObjectError,
)
from stalwart.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    ObjectEntry,
    SavingLayout,
    ShardEntry,
    TensorEntry,
    parse_step_dir,
    read_manifest,
    step_dir,
)
from stalwart.checkpoint.objects import Snapshot, snapshot
from stalwart.checkpoint.planner import BalancedSavePlanner, ShardAwareLoadPlanner
from stalwart.checkpoint.priority import lower_this_thread, writer_nice
from stalwart.checkpoint.reader import RangedReader
from stalwart.checkpoint.retention import RetentionPolicy, to_delete
from stalwart.checkpoint.shards import GlobalShard
from stalwart.checkpoint.staging import StagingBuffers
from stalwart.checkpoint.step_guard import Gate, StepGuard, storage_key
from stalwart.checkpoint.storage.base import ObjectWriter, Storage, StorageError
from stalwart.checkpoint.writer import RankFileWriter
from stalwart.worker_contract import resume_max_step

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "Checkpointer",
    "NoCheckpoint",
    "SaveHandle",
    "SaveResult",
]

log = logging.getLogger("stalwart.checkpoint")


class SaveResult(BaseModel):
    step: int
    committed: bool
    error: str | None = None
    stall_seconds: float  # how long save() held the training thread
    step_wait_seconds: float = 0.0  # how long optimizer steps waited for this save's copies
    total_seconds: float  # from the call to the commit
    stage_seconds: float = 0.0  # the background copies, from the call until the last was made
    writer_cpu_seconds: float = 0.0  # CPU the writer thread spent (serializing, hashing, writing)
    bytes_written: int  # the size of this rank's file (on each tier)
    total_bytes: int  # by all ranks (coordinator; 0 elsewhere)
    tiers: list[str]
    # The step's folder on the most durable tier, as the tier describes it (no credentials):
    # what a catalog of committed checkpoints points at. None when the save did not commit.
    location: str | None = None


class CheckpointInfo(BaseModel):
    step: int
    tier: str
    location: str
    created_at: float
    total_bytes: int
    world_size: int
    error: str | None = None  # the commit marker is there but unreadable: the checkpoint is corrupt


class SaveHandle:
    """A save in flight. `wait()` returns its SaveResult; it never raises for a failed save."""

    def __init__(self, step: int, future: Future[SaveResult], gates: list[Gate]) -> None:
        self.step = step
        self._future = future
        self._gates = gates

    def done(self) -> bool:
        return self._future.done()

    def staged(self) -> bool:
        """Whether every tensor is copied: from then on the state may change in any way."""
        return all(g.is_open() for g in self._gates)

    def wait_staged(self) -> None:
        """Wait until the state may be modified by other means than a watched optimizer's step."""
        for gate in self._gates:
            gate.wait()

    def wait(self, timeout: float | None = None) -> SaveResult:
        return self._future.result(timeout=timeout)


def _serialized(data: Any) -> Any:
    """A staged item as the writer takes it: a plain value's snapshot becomes its bytes here, in the
    stager thread."""
    return data.serialize() if isinstance(data, Snapshot) else data


def _to_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state.items()}


def structure_signature(flat: Mapping[str, Any]) -> str | None:
    """What decides this rank's save plan, without making it (DCP's local plan computes every
    DTensor's local box: most of a save's time in the caller): names, kinds, global shapes, dtypes,
    layouts. None when a leaf is of a kind this does not know."""
    parts: list[object] = []
    for fqn, obj in flat.items():
        if isinstance(obj, DTensor):
            parts.append((fqn, "d", obj._spec))  # mesh, placements, shape, stride, dtype (hashable)
        elif isinstance(obj, GlobalShard):
            pieces = tuple((tuple(o), tuple(t.shape), t.dtype) for o, t in obj.pieces.items())
            parts.append((fqn, "g", tuple(obj.global_shape), pieces))
        elif type(obj) is torch.Tensor or type(obj) is torch.nn.Parameter:
            parts.append((fqn, "t", tuple(obj.shape), obj.dtype))
        elif isinstance(obj, torch.Tensor):
            return None  # another tensor subclass: its plan may depend on more
        else:
            parts.append((fqn, "o"))
    return str(hash(tuple(parts)))


def _optimizers_in(state: Mapping[str, Any]) -> list[torch.optim.Optimizer]:
    """Optimizers a state names: directly, or held by an adapter (TrainState's `optimizer`)."""
    out = []
    for value in state.values():
        candidates = [value, getattr(value, "optimizer", None), *(getattr(value, "optimizers", None) or [])]
        out += [c for c in candidates if isinstance(c, torch.optim.Optimizer)]
    return out


@dataclass
class _Plan:
    key: str  # every rank's local signature, joined
    local_signature: str
    plan: SavePlan  # this rank's part
    metadata: Metadata


@dataclass
class _SaveJob:
    step: int
    t0: float
    planner: BalancedSavePlanner
    local_plan: SavePlan | None  # None when the structure matched the cache: made only if needed
    signature: str
    used_cache: bool
    future: Future[SaveResult]
    error: str | None = None
    staged: dict[MetadataIndex, torch.Tensor | io.BytesIO | Snapshot] = field(default_factory=dict)
    deferred: dict[MetadataIndex, tuple[torch.Tensor, int]] = field(default_factory=dict)  # -> optimizer id
    gates: dict[int, Gate] = field(default_factory=dict)
    released: threading.Event = field(default_factory=threading.Event)  # the staging buffers are free again
    stall: float = 0.0
    stage_seconds: float = 0.0

    def step_wait(self) -> float:
        return sum(g.waited_seconds for g in self.gates.values())


class _Worker:
    """One daemon thread running submitted calls in order (a save must never keep a process alive)."""

    def __init__(self, name: str, init: Callable[[], object] | None = None) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, args=(init,), name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._queue.put((fn, args))

    def _run(self, init: Callable[[], object] | None) -> None:
        if init is not None:
            init()
        while (task := self._queue.get()) is not None:
            fn, args = task
            fn(*args)

    def stop(self) -> None:
        self._queue.put(None)


def build_manifest(
    step: int,
    metadata: Metadata,
    shards: list[tuple[str, ShardEntry]],
    objects: dict[str, ObjectEntry],
    per_rank_bytes: list[int],
    parallelism: dict[str, int] | None = None,
) -> Manifest:
    """The commit marker of a save: every tensor's global shape and dtype from DCP's global metadata,
    the shards and values the ranks wrote, and the saving layout. The engine's saves and DCPWriter's."""
    tensors: dict[str, TensorEntry] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            tensors[fqn] = TensorEntry(dtype=str(md.properties.dtype).removeprefix("torch."), shape=list(md.size))
    for fqn, shard in shards:
        tensors[fqn].shards.append(shard)
    return Manifest(
        step=step,
        layout=SavingLayout(
            world_size=len(per_rank_bytes), parallelism=parallelism or {}, per_rank_bytes=per_rank_bytes
        ),
        tensors=tensors,
        objects=objects,
        mappings={fqn: list(path) for fqn, path in (metadata.planner_data or {}).items()},
        total_bytes=sum(per_rank_bytes),
    )


class Checkpointer:
    """One per training process. With a process group, all its ranks construct it together.

    `overlap` (default on): the tensors a watched optimizer writes are copied behind save(), while
    training runs, and that optimizer's next step waits for them if it comes first. Optimizers
    are watched when the state holds them (a TrainState, or the optimizer itself) or through
    `watch()`. Anything else the state holds is copied before save() returns.
    """

    def __init__(
        self,
        tiers: Storage | list[Storage],
        *,
        process_group: dist.ProcessGroup | None = None,
        retention: RetentionPolicy | None = None,
        parallelism: dict[str, int] | None = None,
        timeout: timedelta = timedelta(minutes=10),
        overlap: bool = True,
    ) -> None:
        self._writer_nice = writer_nice()  # a bad STALWART_CHECKPOINT_WRITER_NICE fails here, not in the writer
        self.tiers = sorted(tiers if isinstance(tiers, list) else [tiers], key=lambda s: s.tier_rank)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size(process_group) if self.distributed else 1
        # Gloo groups of our own, so the background threads' collectives never meet training's: one
        # for the stager (plans) and one for the writer (reports, commits) and loads, so that a save's
        # plan can be agreed on while the previous save is still being committed.
        self.group = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self.plan_group = dist.new_group(backend="gloo", timeout=timeout) if self.distributed else None
        self.retention = retention or RetentionPolicy()
        self.parallelism = parallelism or {}
        self.overlap = overlap
        self.staging = StagingBuffers()
        self.guard = StepGuard()
        self._pending: SaveHandle | None = None
        self._released: threading.Event | None = None  # the save in flight is done with the buffers
        self.last_load_tier: str | None = None  # where the last load read from (memory, file, s3)
        self._plan_cache: _Plan | None = None
        self._stager: _Worker | None = None
        self._writer: _Worker | None = None

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Let this optimizer's tensors be copied behind save(); its step waits for them if needed."""
        self.guard.watch(optimizer)

    # -- collectives (no-ops on one process) -------------------------------------------------------
    def _all_gather(self, obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=group or self.group)
        return out

    def _broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    # -- save: the training thread -----------------------------------------------------------------
    def save(self, state: Mapping[str, Any], step: int, *, blocking: bool = False) -> SaveHandle:
        """Snapshot `state` for `step`. Returns once what may change before the next optimizer step
        is copied; the rest is copied and written behind. Raises UnsafeObjectError for a value a
        checkpoint may not hold (every rank's save then fails with that error)."""
        t0 = time.perf_counter()
        if self._released is not None:
            self._released.wait()  # the previous save's bytes must be out of the buffers about to be reused
        if self._stager is None:
            self._stager = _Worker("ckpt-stage")
            self._writer = _Worker("ckpt-write", init=lambda: lower_this_thread(self._writer_nice))
        if self.overlap:
            for optimizer in _optimizers_in(state):
                self.guard.watch(optimizer)
        state_dict = _to_state_dict(state)
        planner = BalancedSavePlanner()
        planner.set_up_planner(state_dict, StorageMeta(), self.rank == 0)
        local: SavePlan | None = None
        signature = structure_signature(planner.state_dict)
        if signature is None:  # a kind of leaf the quick signature does not know: from the plan
            local = planner.create_local_plan()
            signature = hashlib.sha1(repr([(i.index, i.type, i.tensor_data) for i in local.items]).encode()).hexdigest()
        cache = self._plan_cache if self._plan_cache and self._plan_cache.local_signature == signature else None
        if cache is None and local is None:
            local = planner.create_local_plan()
        job = _SaveJob(step, t0, planner, local, signature, cache is not None, Future())
        owners = self.guard.owners() if self.overlap else {}
        plain = {
            fqn: t for fqn, t in planner.state_dict.items() if type(t) is torch.Tensor or type(t) is torch.nn.Parameter
        }
        self.staging.begin()
        try:
            items = cache.plan.items if cache else local.items if local else []  # cached: mine; else a superset
            for item in items:
                if item.type == WriteItemType.BYTE_IO:  # a plain value: copied now, serialized behind
                    job.staged[item.index] = snapshot(item.index.fqn, planner.lookup_object(item.index))
                    continue
                whole = plain.get(item.index.fqn)  # a whole plain tensor is its own write item's data
                offset = item.index.offset
                data = whole if whole is not None and not (offset and any(offset)) else planner.resolve_data(item)
                if isinstance(data, io.BytesIO):
                    job.staged[item.index] = data  # serialized now: a snapshot of the value
                elif (key := storage_key(data)) is not None and (owner := owners.get(key)) is not None:
                    job.deferred[item.index] = (data, owner)  # copied behind, before that optimizer steps
                    if owner not in job.gates:
                        job.gates[owner] = Gate()
                else:
                    job.staged[item.index] = self.staging.stage(item.index, data)
        except UnsafeObjectError as exc:
            job.error = f"rank {self.rank}: {exc}"
        self.staging.wait_on_device(self.staging.fence())  # training's stream runs after those copies
        self.guard.arm(job.gates)
        job.stall = time.perf_counter() - t0
        self._pending = SaveHandle(step, job.future, list(job.gates.values()))
        self._released = job.released
        self._stager.submit(self._stage, job)
        if job.error is not None:
            raise UnsafeObjectError(job.error)
        if blocking:
            self._pending.wait()
        return self._pending

    # -- save: the stager thread -------------------------------------------------------------------
    def _agree_on_plan(self, job: _SaveJob, key: str) -> tuple[SavePlan, Metadata]:
        """The cached plan when no rank's structure changed (`key`: every rank's signature), else a
        new one, planned by all ranks together."""
        if self._plan_cache is not None and self._plan_cache.key == key:
            return self._plan_cache.plan, self._plan_cache.metadata
        local = job.local_plan if job.local_plan is not None else job.planner.create_local_plan()
        all_local = self._all_gather(local, self.plan_group)
        global_plans, metadata = job.planner.create_global_plan(all_local)
        mine = job.planner.finish_plan(global_plans[self.rank])
        self._plan_cache = _Plan(key, job.signature, mine, metadata)
        return mine, metadata

    def _copy_deferred(self, job: _SaveJob, wanted: set[MetadataIndex]) -> str | None:
        """Copy the optimizers' tensors this rank writes, one optimizer at a time (its step waits for
        exactly those), then open every gate; the error, if the copy failed."""
        try:
            for owner, gate in job.gates.items():
                for index, (tensor, whose) in job.deferred.items():
                    if whose == owner and index in wanted and index not in job.staged:
                        job.staged[index] = self.staging.stage(index, tensor)
                gate.open(self.staging.fence())
            return None
        except Exception as exc:
            return f"rank {self.rank}: staging failed: {type(exc).__name__}: {exc}"
        finally:
            for gate in job.gates.values():
                if not gate.is_open():
                    gate.open()

    def _stage(self, job: _SaveJob) -> None:
        error = None
        early = job.used_cache and self._plan_cache is not None and job.error is None
        if early and self._plan_cache is not None:
            # The usual case: copy first, by the cached plan, so the optimizer's next step can go on
            # while the ranks agree (the slowest rank's save() sets when they do). Should the plan
            # change after all, what it adds was not copied in time: that save fails (below).
            error = self._copy_deferred(job, {item.index for item in self._plan_cache.plan.items})
        try:
            replies = self._all_gather((job.signature, job.error), self.plan_group)
            errors = [e for _, e in replies if e]
            if errors:
                raise CheckpointError("; ".join(errors))
            plan, metadata = self._agree_on_plan(job, "|".join(sig for sig, _ in replies))
        except BaseException as exc:  # the handle must always resolve, or training would hang on it
            for gate in job.gates.values():
                gate.open()
            job.released.set()
            self._fail(job, exc)
            return
        if not early:
            error = self._copy_deferred(job, {item.index for item in plan.items})
        missing = [i.index.fqn for i in plan.items if i.index not in job.staged]
        if missing and error is None:  # another rank's structure changed: the new plan moved items here
            error = (
                f"rank {self.rank}: the plan changed under this save ({missing[:3]} not staged); the next save replans"
            )
        job.stage_seconds = time.perf_counter() - job.t0
        staged = [(item.index, _serialized(job.staged.get(item.index))) for item in plan.items]
        assert self._writer is not None
        self._writer.submit(self._write_and_commit, job, staged, metadata, self.staging.fence(), error)

    def _fail(self, job: _SaveJob, exc: BaseException) -> None:
        if not isinstance(exc, CheckpointError):
            log.exception("checkpoint save failed", extra={"context": {"step": job.step, "rank": self.rank}})
        job.future.set_result(
            SaveResult(
                step=job.step,
                committed=False,
                error=str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}",
                stall_seconds=job.stall,
                step_wait_seconds=job.step_wait(),
                total_seconds=time.perf_counter() - job.t0,
                bytes_written=0,
                total_bytes=0,
                tiers=[],
            )
        )

    # -- save: the writer thread (low priority) ----------------------------------------------------
    def _write_and_commit(
        self, job: _SaveJob, staged: list[Any], metadata: Metadata, events: list[Any], error: str | None
    ) -> None:
        cpu0 = time.thread_time()
        try:
            self.staging.wait_on_host(events)
            result = self._write_and_commit_inner(job, staged, metadata, error)
            result.writer_cpu_seconds = time.thread_time() - cpu0
            job.future.set_result(result)
        except BaseException as exc:
            self._fail(job, exc)
        finally:
            job.released.set()

    def _write_and_commit_inner(
        self, job: _SaveJob, staged: list[Any], metadata: Metadata, error: str | None
    ) -> SaveResult:
        folder = step_dir(job.step)
        file = f"__{self.rank}_0.distcp"
        written = 0
        report: dict[str, Any] = {"error": error}
        writers: list[RankFileWriter] = []
        outs: list[tuple[Storage, ObjectWriter]] = []
        for tier in self.tiers if error is None else []:
            try:
                outs.append((tier, tier.open_writer(f"{folder}/{file}")))
                w = RankFileWriter(outs[-1][1], file, self.rank)
                for index, data in staged:
                    if isinstance(data, io.BytesIO):
                        w.write_bytes(index, data)
                    else:
                        w.write_tensor(index, data)
                writers.append(w)
            except Exception as exc:
                # or the other ranks would wait there forever. (torch.save re-raises a storage error
                # from its write callback as a RuntimeError, so the type tells us nothing.)
                report["error"] = f"rank {self.rank} writing {tier.describe(folder + '/' + file)}: {exc}"
                break
        job.released.set()  # every byte is out of the staging buffers: the next save may stage
        for tier, out in outs:
            try:
                if report["error"] is not None:
                    raise StorageError("aborted")
                out.close()  # fsync, complete the upload...
                written = out.tell()  # the rank's file, the same on every tier
            except Exception as exc:
                out.abort()
                if report["error"] is None:
                    report["error"] = f"rank {self.rank} writing {tier.describe(folder + '/' + file)}: {exc}"
        if report["error"] is None and writers:
            w = writers[0]
            report.update(shards=w.shard_fqns, objects=w.objects, bytes=written)
        reports = self._all_gather(report)
        errors = [r["error"] for r in reports if r["error"]]
        total = 0
        if self.rank == 0:
            if errors:
                for tier in self.tiers:  # nothing half-written stays behind
                    try:
                        tier.delete_dir(folder)
                    except StorageError as exc:  # the storage that failed the save may be gone
                        log.warning("could not remove a failed save", extra={"context": {"error": str(exc)}})
            else:
                try:
                    total = self._commit(job.step, folder, metadata, reports)
                except StorageError as exc:  # every rank must hear of it: they wait on the broadcast
                    errors.append(f"rank 0 committing {folder}: {exc}")
        failure = self._broadcast("; ".join(errors) or None)  # rank 0's word, commit included
        return SaveResult(
            step=job.step,
            committed=failure is None,
            error=failure,
            stall_seconds=job.stall,
            step_wait_seconds=job.step_wait(),
            total_seconds=time.perf_counter() - job.t0,
            stage_seconds=job.stage_seconds,
            bytes_written=written,
            total_bytes=total,
            tiers=[t.name for t in self.tiers],
            location=self.tiers[-1].describe(folder) if failure is None and self.tiers else None,
        )

    def _commit(self, step: int, folder: str, metadata: Metadata, reports: list[dict[str, Any]]) -> int:
        objects: dict[str, ObjectEntry] = {}
        for r in reports:
            objects.update(r["objects"])
        manifest = build_manifest(
            step,
            metadata,
            [shard for r in reports for shard in r["shards"]],
            objects,
            [r["bytes"] for r in reports],
            self.parallelism,
        )
        for tier in self.tiers:
            tier.write_bytes(f"{folder}/{MANIFEST_NAME}", manifest.to_bytes())  # the commit
            self._apply_retention(tier)
        return manifest.total_bytes

    def _apply_retention(self, tier: Storage) -> None:
        committed = self.committed_steps(tier)
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
    def committed_steps(tier: Storage) -> list[int]:
        """Steps with a commit marker on one tier, oldest first, read but not parsed: what retention
        needs after every save, without validating each kept checkpoint's manifest in the writer
        thread (whose Python competes with training's for the interpreter). A corrupt marker still
        counts, as in list_committed."""
        steps = []
        for name in tier.list_dirs():
            step = parse_step_dir(name)
            if step is not None and tier.read_bytes(f"{name}/{MANIFEST_NAME}") is not None:
                steps.append(step)
        return sorted(steps)

    @staticmethod
    def list_committed(tier: Storage) -> list[CheckpointInfo]:
        """Checkpoints with a commit marker on one tier, in no particular order. A marker that
        cannot be read is listed with its error: the step exists, and is corrupt."""
        out = []
        for name in tier.list_dirs():
            step = parse_step_dir(name)
            raw = tier.read_bytes(f"{name}/{MANIFEST_NAME}") if step is not None else None
            if step is None or raw is None:
                continue
            where = tier.describe(name)
            try:
                m = read_manifest(raw, tier.describe(f"{name}/{MANIFEST_NAME}"))
            except ManifestError as exc:
                out.append(
                    CheckpointInfo(
                        step=step,
                        tier=tier.name,
                        location=where,
                        created_at=0,
                        total_bytes=0,
                        world_size=0,
                        error=str(exc),
                    )
                )
                continue
            out.append(
                CheckpointInfo(
                    step=m.step,
                    tier=tier.name,
                    location=where,
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
        """The step's manifest from the fastest tier holding a readable one."""
        errors = []
        for tier in self.tiers:  # fastest first
            path = f"{step_dir(step)}/{MANIFEST_NAME}"
            raw = tier.read_bytes(path)
            if raw is None:
                continue
            try:
                return tier, read_manifest(raw, tier.describe(path))
            except ManifestError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        raise NoCheckpoint(f"no committed checkpoint for step {step} in {[t.describe() for t in self.tiers]}")

    # -- load --------------------------------------------------------------------------------------
    def load(self, state: Mapping[str, Any], step: int | None = None, *, fallback: bool = False) -> int:
        """Load the given step (default: the newest) into `state`, in place. Returns the step loaded.

        With `fallback`, a checkpoint that fails its checksums (its shards', its values' or its
        commit marker's) is skipped for the one before it. Any other error stops every rank at once.
        With no step given, a rollback's bound (STALWART_RESUME_MAX_STEP, set by the agent) holds.
        """
        self.wait()  # a save still copying reads the tensors this load is about to overwrite
        steps = self._candidates()
        if step is None and (bound := resume_max_step()) is not None:
            steps = [s for s in steps if s <= bound]  # a rollback: nothing newer than the controller allows
        if step is not None:
            if step not in steps:
                raise NoCheckpoint(f"step {step} has no committed checkpoint (committed: {sorted(steps)})")
            steps = steps[steps.index(step) :] if fallback else [step]
        if not steps:
            raise NoCheckpoint(f"no committed checkpoint in {[t.describe() for t in self.tiers]}")
        errors: list[str] = []
        for candidate in steps:
            outcome: tuple[str, str] | None = None
            try:
                self._load_step(state, candidate)
            except (ChecksumError, StorageError) as exc:
                outcome = ("corrupt", f"rank {self.rank}: {exc}")
            except Exception as exc:  # every rank must hear of it, or the others would wait forever
                outcome = (type(exc).__name__, f"rank {self.rank}: {exc}")
            outcomes = [o for o in self._all_gather(outcome) if o]
            if not outcomes:
                return candidate
            messages = [m for _, m in outcomes]
            errors += messages
            log.error("checkpoint unusable", extra={"context": {"step": candidate, "errors": messages}})
            fatal = [o for o in outcomes if o[0] != "corrupt"]
            if fatal:
                kind = UnsafeObjectError if fatal[0][0] == "UnsafeObjectError" else CheckpointError
                raise kind("; ".join(m for _, m in fatal))
            if not fallback:
                raise ChecksumError("; ".join(messages))
        raise CheckpointError("no usable checkpoint: " + "; ".join(errors))

    def _candidates(self) -> list[int]:
        """The committed steps, newest first, as rank 0 lists them: every rank considers the same
        candidates, and only one reads every tier's markers (at a restart all ranks load at once)."""
        if not self.distributed:
            return sorted({c.step for c in self.catalog()}, reverse=True)
        listed: tuple[list[int] | None, str | None] = (None, None)
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                listed = (sorted({c.step for c in self.catalog()}, reverse=True), None)
            except Exception as exc:  # the other ranks wait for our word: they must hear of it
                listed, failure = (None, f"rank 0 could not list the checkpoints: {exc}"), exc
        steps, error = self._broadcast(listed)
        if failure is not None:
            raise failure
        if error is not None:
            raise CheckpointError(error)
        return list(steps)

    def _load_step(self, state: Mapping[str, Any], step: int) -> None:
        """From the fastest tier that holds the step whole; a tier missing bytes or failing its
        checksums hands over to the next (host memory after a node loss, then storage)."""
        errors: list[Exception] = []
        for tier in self.tiers:
            path = f"{step_dir(step)}/{MANIFEST_NAME}"
            raw = tier.read_bytes(path)
            if raw is None:
                continue
            try:
                self._load_from(tier, read_manifest(raw, tier.describe(path)), state, step)
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
        state_dict = _to_state_dict(state)
        planner = ShardAwareLoadPlanner()
        planner.set_up_planner(state_dict, dcp_metadata(manifest), self.rank == 0)
        plan = planner.finish_plan(planner.create_local_plan())
        RangedReader(tier, step_dir(step), manifest).execute(plan, planner)
        for key, obj in state.items():
            if isinstance(obj, Stateful):
                obj.load_state_dict(state_dict[key])
            elif isinstance(state, dict) and not isinstance(obj, (torch.Tensor, dict)):
                state[key] = state_dict[key]  # a plain value (an int, a list...) comes back by assignment

    def close(self) -> None:
        self.wait()
        self.guard.close()
        for worker in (self._stager, self._writer):
            if worker is not None:
                worker.stop()
        self._stager = self._writer = None
        for group in (self.group, self.plan_group):
            if group is not None:
                dist.destroy_process_group(group)
        self.group = self.plan_group = None
