"""The job's checkpoint catalog in etcd: the controller is its one writer.

Workers report each committed save to their agent (worker SDK, progress socket); each agent merges
its ranks' reports and sends the newest few in its heartbeat (stalwart.agents.saved_checkpoints).
Here the nodes' reports become catalog entries, committed with the job's state in the controller's
guarded transaction, so a controller that restarts finds the catalog where it left it.

One report is enough for a step: the engine's commit is global (the coordinating rank writes the
commit marker after every rank's file, then tells every rank), so a rank that says "committed" speaks
for the whole world. Waiting for every rank would add nothing but a heartbeat of delay, and breaks on
RLHF jobs where only one role saves. The coordinator's report carries the total size; an entry written
from another rank's report gets it when that report arrives.

A step saved again by a later generation (after a rollback) replaces the entry. The catalog keeps the
spec's keepLast newest steps, as the engine's retention keeps them in storage, plus the newest step at
or before a pending rollback's bound: the checkpoint that rollback will load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from stalwart.controller.core.decision import Plan
from stalwart.controller.core.observation import Observation
from stalwart.store import keys
from stalwart.store.records import CheckpointEntry, Heartbeat, SavedCheckpoint


@dataclass
class CatalogChange:
    puts: dict[int, CheckpointEntry] = field(default_factory=dict)
    deletes: list[int] = field(default_factory=list)


def _merge(entry: CheckpointEntry | None, save: SavedCheckpoint) -> CheckpointEntry | None:
    """`entry` with what `save` adds; None when the save is older than the entry (its generation)."""
    if entry is not None and (save.generation or 0) < (entry.generation or 0):
        return None
    if entry is None or (save.generation or 0) > (entry.generation or 0):
        return CheckpointEntry(
            step=save.step,
            uri=save.location or "",
            committed_at=save.committed_at,
            tiers=list(save.tiers),
            bytes=save.total_bytes,
            generation=save.generation,
        )
    update = {
        "uri": entry.uri or save.location or "",
        "committed_at": min(entry.committed_at, save.committed_at) if save.committed_at else entry.committed_at,
        "tiers": entry.tiers or list(save.tiers),
        "bytes": max(entry.bytes or 0, save.total_bytes or 0) or None,
    }
    if all(getattr(entry, name) == value for name, value in update.items()):
        return entry  # every node reports the same save: no copy per node per tick (10,000 at 10,000 nodes)
    return entry.model_copy(update=update)


def kept_steps(steps: Iterable[int], keep_last: int, rollback_bound: int | None) -> set[int]:
    """The newest `keep_last` steps, and the newest at or before a pending rollback's bound."""
    ordered = sorted(set(steps))
    kept = set(ordered[-keep_last:])
    target = [s for s in ordered if rollback_bound is not None and s <= rollback_bound]
    if target:
        kept.add(target[-1])
    return kept


def reconcile(
    catalog: Mapping[int, CheckpointEntry],
    saves: Iterable[SavedCheckpoint],
    keep_last: int,
    rollback_bound: int | None = None,
) -> CatalogChange:
    """What to write so the catalog holds every reported save, pruned (a pure function)."""
    merged = dict(catalog)
    for save in saves:
        entry = _merge(merged.get(save.step), save)
        if entry is not None:
            merged[save.step] = entry
    kept = kept_steps(merged, keep_last, rollback_bound)
    change = CatalogChange()
    for step in sorted(kept):
        if merged[step] != catalog.get(step):
            change.puts[step] = merged[step]
    change.deletes = sorted(s for s in catalog if s not in kept)
    return change


def update(
    plan: Plan, catalog: Mapping[int, CheckpointEntry], beats: Mapping[str, Heartbeat], keep_last: int, job: str
) -> None:
    """Add the saves the nodes' heartbeats report to the plan's writes."""
    saves = [s for beat in beats.values() for s in beat.checkpoints]
    _write(plan, catalog, reconcile(catalog, saves, keep_last, plan.state.resume_max_step), job)


class CatalogFeed:
    """`update` over the saves of the nodes whose heartbeat changed since the last look (the
    observation's BeatChanges), not every node's: at 10,000 nodes every heartbeat carries the same few
    saves, 10,000 merges a tick. A save merged once is in the catalog, and merging it again changes
    nothing (a step's entry keeps the earliest commit, the largest size, the first location), nor does
    a pruned step come back (the steps that pruned it stay newer). So this writes what `update` would,
    as long as the catalog holds what the last look wrote; where it does not (that decision was not
    committed, or the watch has not brought it yet), the changes are not known, or the retention or
    the rollback bound changed, every node's saves are merged again."""

    def __init__(self) -> None:
        self._cursor = -1
        self._wrote: tuple[dict[int, CheckpointEntry], list[int], int, int | None] | None = None

    def update(self, plan: Plan, obs: Observation, keep_last: int, job: str) -> None:
        changes, bound = obs.beat_changes, plan.state.resume_max_step
        nodes: AbstractSet[str] | None = changes.since(self._cursor) if changes is not None else None
        if nodes is None or not self._holds(obs.catalog, keep_last, bound):
            nodes = obs.beats.keys()
        if changes is not None:
            self._cursor = changes.end
        # (in the heartbeats' order, as `update` merges them)
        saves = [s for node, beat in obs.beats.items() if node in nodes for s in beat.checkpoints]
        change = reconcile(obs.catalog, saves, keep_last, bound)
        self._wrote = (change.puts, change.deletes, keep_last, bound)
        _write(plan, obs.catalog, change, job)

    def _holds(self, catalog: Mapping[int, CheckpointEntry], keep_last: int, bound: int | None) -> bool:
        if self._wrote is None:
            return False
        puts, deletes, kept, was_bound = self._wrote
        return (
            (kept, was_bound) == (keep_last, bound)
            and all(catalog.get(step) == entry for step, entry in puts.items())
            and not any(step in catalog for step in deletes)
        )


def _write(plan: Plan, catalog: Mapping[int, CheckpointEntry], change: CatalogChange, job: str) -> None:
    for step, entry in change.puts.items():
        plan.put(keys.checkpoint_entry(job, step), entry)
    plan.deletes.extend(keys.checkpoint_entry(job, step) for step in change.deletes)
    added = sorted(s for s in change.puts if s not in catalog)
    if added or change.deletes:  # (a size that arrived later is no news)
        plan.log("info", "checkpoint catalog", added=added, pruned=change.deletes)


def added_steps(plan: Plan) -> list[int]:
    """The steps this decision adds to the catalog (its puts of catalog entries)."""
    return [r.step for r in plan.puts.values() if isinstance(r, CheckpointEntry)]
